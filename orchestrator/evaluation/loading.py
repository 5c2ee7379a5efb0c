"""A trained checkpoint as a model to evaluate or export: the model with its weights, the trial's
config and the trial's own tokenizer.

The checkpoint is the engine's (``orchestrator.engine.checkpoint``: model state, trial config,
vocabulary size, step, MLflow run id). The tokenizer is rebuilt from the trial's data config,
without reading the training data where it can be avoided:

- ``builtin``/``text`` with ``byte``: the byte tokenizer (UTF-8 bytes, EOS 256);
- ``hf`` with ``byte`` (GPT-2's), a hub name or a ``tokenizer.json`` file: that tokenizer (from the
  Hugging Face cache when ``HF_HUB_OFFLINE`` is set; a hub that cannot be reached is one line);
- ``bpe`` (a BPE trained by the trial on its training documents): the data source is built again,
  which finds the trained tokenizer in the cache (``LIME_CACHE``) by the documents' hash; for the
  ``hf`` source that reads the training stream once more.

A trial trained on a synthetic task (its fixed character vocabulary) has no text tokenizer, and
downstream tasks are text: it is refused with one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lime_arch import ConfigError, ModelConfig, build_model
from lime_arch.model import LIMeDecoder
from orchestrator.engine.checkpoint import read_model_checkpoint
from orchestrator.engine.data import hub, make_batches
from orchestrator.engine.data.corpus import ByteTokenizer, load_named_tokenizer
from orchestrator.engine.trial_config import DataConfig, TrialConfig
from orchestrator.tasks import TASKS


@dataclass
class Trained:
    """A trained model, ready to evaluate (eval mode, on ``device``)."""

    cfg: TrialConfig
    mcfg: ModelConfig
    model: LIMeDecoder
    tokenizer: Any  # encode(str) -> ids, decode(ids) -> str, eos_id, vocab_size, name
    run_id: str | None
    step: int
    path: Path


def text_tokenizer_check(data: DataConfig) -> None:
    """A ConfigError for a trial whose tokenizer is no text tokenizer (a synthetic task's)."""
    if data.source in TASKS:
        raise ConfigError(f"data.source: the trial was trained on the synthetic task {data.source!r}, whose "
                          "character vocabulary cannot read the text of downstream tasks; evaluate trials of the "
                          "builtin, text or hf sources (byte, bpe, GPT-2 or tokenizer.json tokenizers)")


def trial_tokenizer(data: DataConfig):
    """The tokenizer a trial trained with (see the module docstring)."""
    text_tokenizer_check(data)
    if data.source in ("builtin", "text"):
        return ByteTokenizer() if data.tokenizer == "byte" else make_batches(data).tokenizer
    if data.tokenizer == "bpe":
        return make_batches(data).tokenizer
    name = hub.tokenizer_name(data.tokenizer)
    if name and not hub.offline():
        why = hub.unreachable()
        if why is not None:
            raise ConfigError(f"data.tokenizer: the trial's tokenizer {name!r} is on the Hugging Face hub, which is "
                              f"not reachable ({hub.endpoint()}: {why}); set HF_HUB_OFFLINE=1 with it in the "
                              "Hugging Face cache")
    return load_named_tokenizer("gpt2" if data.tokenizer == "byte" else data.tokenizer)


def load_trained(path: str | Path, device: str | torch.device = "cpu", opened: tuple[Path, dict] | None = None
                 ) -> Trained:
    """The model of a checkpoint with its config and tokenizer (ConfigError for what is not one);
    ``opened``: the checkpoint ``read_model_checkpoint`` read already (read once, checked first)."""
    f, ck = opened or read_model_checkpoint(path)  # what is no checkpoint: one line, as `lime train --resume` says
    cfg = TrialConfig.from_dict(ck["config"])
    tok = trial_tokenizer(cfg.data)
    vocab = int(ck.get("vocab_size") or tok.vocab_size)
    if tok.vocab_size > vocab:
        raise ConfigError(f"checkpoint: the model's vocabulary ({vocab}) is smaller than its tokenizer's "
                          f"({tok.name}: {tok.vocab_size})")
    mcfg = cfg.model_config(vocab_size=vocab)
    model = build_model(mcfg)
    model.load_state_dict(ck["model"])
    model.to(device).eval()
    return Trained(cfg, mcfg, model, tok, ck.get("run_id"), int(ck.get("step", 0)), f.parent)
