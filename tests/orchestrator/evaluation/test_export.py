"""``lime export``: an exported checkpoint loads with transformers (``trust_remote_code``) and gives
the project's logits within 1e-5 (fp32) for every registered router and depth mix; its tokenizer
encodes as the trial's; the harness's own Hugging Face backend scores it as ``LimeLM`` does."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from transformers import AutoModelForCausalLM, AutoTokenizer

import lime_arch
from lime_arch import ConfigError, build_model
from lime_arch.code_version import LimeCodeVersionWarning, code_version
from orchestrator.engine.checkpoint import CKPT_NAME, save_checkpoint
from orchestrator.engine.data import make_batches
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.evaluation.adapter import LimeLM
from orchestrator.evaluation.checks import resolve
from orchestrator.evaluation.harness import build_tasks
from orchestrator.evaluation.loading import load_trained
from orchestrator.evaluation.settings import eval_settings
from orchestrator.export.hf import export
from tests.orchestrator.evaluation.helpers import TINY

TEXTS = ["Hello world", "héllo\n\tü 日本 €", "  two  spaces\n", "def f(x):\n    return x + 1"]


def checkpoint(folder, router="none", depth_mix="none", data=None, seed=0, **model) -> tuple:
    """A checkpoint in the engine's format of a randomly initialised tiny model."""
    over = {k: v for k, v in TINY.items() if k != "vocab_size"}
    cfg = TrialConfig.from_dict({"preset": "tiny", "model": {**over, "router": router, "depth_mix": depth_mix, **model},
                                 "data": data or {"source": "builtin"}, "train": {"seq_len": 32}})
    vocab = make_batches(cfg.data).vocab_size
    torch.manual_seed(seed)
    m = build_model(cfg.model_config(vocab_size=vocab)).eval()
    save_checkpoint(folder / CKPT_NAME, {"model": m.state_dict(), "config": cfg.to_dict(), "vocab_size": vocab,
                                         "step": 7, "run_id": None})
    return folder, m


def load_export(folder):
    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()


VARIANTS = [(r, "none") for r in lime_arch.router_specs((2,))] + \
           [("full", d) for d in lime_arch.depth_mix_specs() if d != "none"]


@pytest.mark.parametrize("router,depth_mix", VARIANTS, ids=[f"{r}+{d}" for r, d in VARIANTS])
def test_exported_model_gives_the_projects_logits(tmp_path, router, depth_mix):
    ck, model = checkpoint(tmp_path / "ck", router, depth_mix)
    export(ck, tmp_path / "hf")
    hf = load_export(tmp_path / "hf")
    x = torch.randint(0, 257, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(x), hf(x).logits
    assert got.dtype == torch.float32
    assert (got - want).abs().max().item() <= 1e-5
    assert hf.config.lime["router"] == router and hf.config.lime["depth_mix"] == depth_mix


def test_gqa_untied_export_and_left_padded_rows(tmp_path):
    ck, model = checkpoint(tmp_path / "ck", "full", "denseformer", n_heads=4, n_kv_heads=2, tie_embeddings=False)
    export(ck, tmp_path / "hf")
    hf = load_export(tmp_path / "hf")
    assert hf.model.lm_head.weight.data_ptr() != hf.model.embed.weight.data_ptr()
    x = torch.randint(0, 257, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(x)
    mask[0, :6] = 0  # row 0 left-padded, as batched generation pads
    with torch.no_grad():
        got = hf(x, attention_mask=mask).logits
        assert (got[0, 6:] - model(x[:1, 6:])[0]).abs().max().item() <= 1e-5
        assert (got[1] - model(x[1:])[0]).abs().max().item() <= 1e-5
        assert (hf(x).logits - model(x)).abs().max().item() <= 1e-5  # tied or not, the weights are the trained ones


def test_byte_and_bpe_tokenizers_encode_as_the_trials(tmp_path):
    ck, _ = checkpoint(tmp_path / "ck")
    export(ck, tmp_path / "byte")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "byte"))
    for t in TEXTS:
        assert tok(t)["input_ids"] == list(t.encode("utf-8"))
        assert tok.decode(list(t.encode("utf-8"))) == t
    assert tok.eos_token_id == 256
    data = {"source": "builtin", "tokenizer": "bpe", "bpe_vocab_size": 300}
    ck2, _ = checkpoint(tmp_path / "ck2", data=data)
    export(ck2, tmp_path / "bpe")
    bpe, mine = AutoTokenizer.from_pretrained(str(tmp_path / "bpe")), make_batches(TrialConfig.from_dict(
        {"data": data}).data).tokenizer
    for t in TEXTS:
        assert bpe(t)["input_ids"] == mine.encode(t)
    assert bpe.eos_token_id == mine.eos_id


# text that spells special tokens of common tokenizers, and text beyond ASCII
SPECIAL_LOOKING = ["<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<s>", "</s>", "<pad>",
                   "<unk>", "[EOS]", "<eos>", "<|im_start|>user\nhi<|im_end|>", "日本語 ü € 😀", "<|endoftext"]


def test_exported_tokenizers_read_special_looking_text_as_the_project_does(tmp_path):
    """The byte tokenizer reads the literal text ``<|endoftext|>`` as its 13 bytes, never as EOS (id 256,
    which only the data pipeline appends); a BPE tokenizer matches its special tokens in text in the
    project too, and the export does exactly what the project does."""
    ck, _ = checkpoint(tmp_path / "ck")
    export(ck, tmp_path / "byte")
    tok, mine = AutoTokenizer.from_pretrained(str(tmp_path / "byte")), load_trained(ck).tokenizer
    for t in SPECIAL_LOOKING:
        want = mine.encode(t)
        assert want == list(t.encode("utf-8"))
        assert tok(t)["input_ids"] == tok.encode(t, add_special_tokens=False) == want, t
        assert tok.decode(want) == t
    assert len(tok("<|endoftext|>")["input_ids"]) == 13 and tok.eos_token_id == 256
    data = {"source": "builtin", "tokenizer": "bpe", "bpe_vocab_size": 300}
    ck2, _ = checkpoint(tmp_path / "ck2", data=data)
    export(ck2, tmp_path / "bpe")
    bpe, mine = AutoTokenizer.from_pretrained(str(tmp_path / "bpe")), load_trained(ck2).tokenizer
    for t in SPECIAL_LOOKING:
        assert bpe(t)["input_ids"] == mine.encode(t), t


def _load_warnings(folder) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_export(folder)
    return [str(w.message) for w in seen if issubclass(w.category, LimeCodeVersionWarning)]


def test_loading_an_export_checks_the_lime_arch_it_was_made_with(tmp_path):
    ck, _ = checkpoint(tmp_path / "ck")
    export(ck, tmp_path / "hf")
    cfg_file = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    assert cfg["lime_code"] == code_version()
    assert json.loads((tmp_path / "hf" / "lime_export.json").read_text())["lime_code"] == code_version()
    assert _load_warnings(tmp_path / "hf") == []  # the same code: silent
    cfg["lime_code"] = {"commit": "0123456789ab", "source_sha256": "f" * 64}  # made with other code
    cfg_file.write_text(json.dumps(cfg))
    [line] = _load_warnings(tmp_path / "hf")
    assert "\n" not in line and "commit 0123456789ab" in line and "ffffffffffff" in line
    assert code_version()["source_sha256"][:12] in line and "logits may differ" in line
    del cfg["lime_code"]  # an export made before the record
    cfg_file.write_text(json.dumps(cfg))
    [line] = _load_warnings(tmp_path / "hf")
    assert "records no lime_arch version" in line and "\n" not in line


def test_export_never_overwrites(tmp_path):
    ck, _ = checkpoint(tmp_path / "ck")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    with pytest.raises(ConfigError, match=r"--to: .* exists and is not an empty folder"):
        export(ck, tmp_path / "taken")


@pytest.mark.slow  # the harness's Hugging Face backend starts accelerate: seconds
def test_the_harness_hf_backend_scores_an_export_as_the_adapter_does(tmp_path, task_dir):
    """The harness's own Hugging Face model class on the exported folder: the same log-likelihood of
    every choice and the same generations as ``LimeLM`` on the project's model (an independent
    implementation of the requests: its batching, padding, truncation and generation)."""
    ck, _ = checkpoint(tmp_path / "ck", "full", "hyper-connections")
    export(ck, tmp_path / "hf")
    s = eval_settings({"tasks": ["tiny_mc", "tiny_gen"], "include": [str(task_dir)], "num_fewshot": 1,
                       "gold_loss": False})
    trained = load_trained(ck)
    lms = {"ours": LimeLM(trained.model, trained.tokenizer, batch_size=3),
           "hf": HFLM(pretrained=str(tmp_path / "hf"), trust_remote_code=True, device="cpu", batch_size=4)}
    samples = {}
    for name, lm in lms.items():
        r = resolve(s)
        res = simple_evaluate(model=lm, tasks=list(build_tasks(r, s).values()), task_manager=r.manager,
                              log_samples=True, bootstrap_iters=0)
        samples[name] = {t: [x["filtered_resps"] for x in v] for t, v in res["samples"].items()}
    ours, hf = samples["ours"], samples["hf"]
    for a, b in zip(ours["tiny_mc"], hf["tiny_mc"]):  # (log-likelihood, is greedy) of each choice
        assert [ll for ll, _ in a] == pytest.approx([float(ll) for ll, _ in b], abs=1e-4)
        assert [g for _, g in a] == [bool(g) for _, g in b]
    assert ours["tiny_gen"] == hf["tiny_gen"]
    assert any(text for text in ours["tiny_gen"])  # something was generated (the comparison is not of empties)
