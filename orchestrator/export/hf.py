"""A trained checkpoint as a Hugging Face ``transformers`` causal-LM folder.

``export(checkpoint, folder)`` writes:

- ``model.safetensors``: the decoder's weights (fp32, as trained; tied embeddings stored once);
- ``config.json``: ``LimeConfig`` (``model_type: lime``, the model's ``lime_arch.ModelConfig``
  under ``lime``, the usual ``vocab_size``/``max_position_embeddings``/... names) with an
  ``auto_map`` to the two files below;
- ``configuration_lime.py`` and ``modeling_lime.py``: ``lime_arch.hf``'s ``LimeConfig`` and
  ``LimeForCausalLM`` (a wrapper of ``lime_arch.LIMeDecoder``). Loading therefore needs this
  project's ``lime_arch`` importable (``pip install -e`` the repository) and
  ``trust_remote_code=True``: ``AutoModelForCausalLM.from_pretrained(folder,
  trust_remote_code=True)``; the harness's own backend: ``lm_eval --model hf --model_args
  pretrained=<folder>,trust_remote_code=True``. Wrapping the project's decoder (rather than a
  second implementation of every router and depth mix) is what makes the logits equal;
- the tokenizer (``orchestrator.export.tokenizer``): ``tokenizer.json`` and its config;
- ``lime_export.json``: where it came from (checkpoint, step, MLflow run, git commit, trial config,
  the ``lime_arch`` code version).

Loading checks the code: ``config.json`` records ``lime_code``, the commit and the source sha256
of the ``lime_arch`` that exported it (``lime_arch.code_version``), and ``LimeForCausalLM`` warns
in one line (``LimeCodeVersionWarning``) when the installed ``lime_arch`` is other code, whose
logits may differ from the trained model's.

The folder must be new or empty: an export never overwrites another one.
"""
from __future__ import annotations

import json
from pathlib import Path

from lime_arch import ConfigError
from lime_arch.code_version import code_version
from lime_arch.hf.configuration_lime import LimeConfig
from lime_arch.hf.modeling_lime import LimeForCausalLM
from orchestrator.core.tracking import git_sha
from orchestrator.evaluation.loading import load_trained
from orchestrator.export.tokenizer import save_tokenizer


def hf_model(trained):
    """``LimeForCausalLM`` holding the trained decoder's weights (eval mode, on the CPU)."""
    LimeConfig.register_for_auto_class()
    LimeForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    tok = trained.tokenizer
    config = LimeConfig(lime=trained.mcfg.to_dict(), lime_code=code_version(), eos_token_id=int(tok.eos_id),
                        bos_token_id=int(tok.eos_id), architectures=["LimeForCausalLM"])
    model = LimeForCausalLM(config)
    model.model.load_state_dict(trained.model.state_dict())
    return model.eval()


def export(checkpoint: str | Path, folder: str | Path, run_id: str | None = None) -> list[Path]:
    """Write the export folder of a checkpoint (see the module); returns the files written."""
    out = Path(folder).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--to: {str(folder)!r} exists and is not an empty folder; exports never overwrite")
    trained = load_trained(checkpoint, "cpu")
    model = hf_model(trained)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(trained.tokenizer, out, trained.mcfg.max_seq_len)
    (out / "lime_export.json").write_text(json.dumps({
        "checkpoint": str(trained.path), "step": trained.step, "run_id": run_id or trained.run_id,
        "git_sha": git_sha(), "lime_code": code_version(), "tokenizer": getattr(trained.tokenizer, "name", "?"),
        "trial_config": trained.cfg.to_dict()}, indent=1, sort_keys=True, default=str) + "\n")
    return sorted(out.iterdir())
