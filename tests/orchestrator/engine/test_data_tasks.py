"""Tests of the synthetic task data sources (orchestrator/engine/data/tasks.py).

Expected batches are rebuilt from the example TEXT with the vocabulary (not with ``task.encode``);
``evaluate`` is checked with stand-in models whose greedy output is known exactly: an oracle that
looks up the correct next token from the prefix (for all or for a chosen subset of the held-out
examples) and garbage models; the batched variable-length decoding is compared with lime_arch's
single-prompt ``generate``.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from lime_arch import ConfigError, build_model, preset
from lime_arch.generate import generate
from orchestrator.engine.data import IGNORE, SOURCES, make_batches
from orchestrator.engine.data import tasks as data_tasks
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import DataConfig, TrialConfig

ARITH = {"source": "arithmetic", "task": {"n_ops": [3, 4], "max_value": 30}, "n_train": 300, "n_val": 40}
PROSQA = {"source": "prosqa", "task": {"n_concepts": 6, "n_facts": 7, "min_depth": 1, "max_depth": 2},
          "n_train": 40, "n_val": 12}
KV = {"source": "kv-recall", "task": {"n_pairs": 3}, "n_train": 100, "n_val": 30}


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny matrices: one thread is much faster than two on a loaded 2-core machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def data_of(d: dict):
    return make_batches(DataConfig(**d))


# -- batches -------------------------------------------------------------------------------------
def test_sources_registered():
    assert {"arithmetic", "prosqa", "kv-recall"} <= set(SOURCES)
    d = data_of(ARITH)
    assert d.vocab_size == d.task.vocab.size and d.eos_id == 2
    assert d.tokenizer.decode(d.tokenizer.encode("12+3=")) == "12+3="


@pytest.mark.parametrize("spec", [ARITH, PROSQA, KV], ids=lambda s: s["source"])
def test_train_batch_masks_prompt_and_padding(spec):
    d = data_of(spec)
    v = d.task.vocab
    seq = d.max_len
    for step in (0, 5):
        x, y = d.train_batch(step, 8, seq, seed=3)
        rows = d.train_rows(step, 8, seed=3)
        assert x.shape == y.shape and x.dtype == y.dtype == torch.long
        full = [[v.bos_id, *v.encode(d.train_examples[r].prompt), *v.encode(d.train_examples[r].target), v.eos_id]
                for r in rows.tolist()]
        assert x.shape[1] == max(len(f) for f in full) - 1  # padded to the longest of the batch
        for b, (r, ids) in enumerate(zip(rows.tolist(), full)):
            ex = d.train_examples[r]
            n_prompt = 1 + len(ex.prompt)  # bos + prompt
            W = x.shape[1]
            # inputs: the row then pads (a shorter row's eos is an input whose target is masked)
            want_x = (ids + [v.pad_id] * W)[:W]
            want_y = ([IGNORE] * (n_prompt - 1) + ids[n_prompt:] + [IGNORE] * W)[:W]
            assert x[b].tolist() == want_x
            assert y[b].tolist() == want_y
            # the supervised tokens spell exactly the target followed by eos
            sup = [t for t in y[b].tolist() if t != IGNORE]
            assert v.decode(sup) == ex.target and sup[-1] == v.eos_id


def test_train_batch_pure_function_of_seed_and_step():
    a, b = data_of(ARITH), data_of({**ARITH})
    for step in (0, 7, 40):
        xa, ya = a.train_batch(step, 16, 64, seed=1)
        xb, yb = b.train_batch(step, 16, 64, seed=1)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # order does not matter (no hidden iterator state)
    x1, _ = a.train_batch(3, 16, 64, seed=1)
    a.train_batch(90, 16, 64, seed=1)
    x2, _ = a.train_batch(3, 16, 64, seed=1)
    assert torch.equal(x1, x2)
    assert not torch.equal(a.train_rows(0, 16, seed=1), a.train_rows(0, 16, seed=2))
    assert not torch.equal(a.train_rows(0, 16, seed=1), a.train_rows(1, 16, seed=1))


def test_epochs_cover_every_example_once():
    d = data_of(ARITH)  # 300 examples, batch 12: 25 steps per epoch
    for epoch in range(2):
        rows = torch.cat([d.train_rows(epoch * 25 + s, 12, seed=0) for s in range(25)])
        assert sorted(rows.tolist()) == list(range(300))
    e0 = torch.cat([d.train_rows(s, 12, seed=0) for s in range(25)])
    e1 = torch.cat([d.train_rows(25 + s, 12, seed=0) for s in range(25)])
    assert not torch.equal(e0, e1)  # reshuffled each epoch
    # a batch that straddles two epochs (batch does not divide n_train)
    straddle = d.train_rows(2, 128, seed=0)  # slots 256..383
    assert straddle[:44].tolist() == d._perm(0, 0)[256:].tolist()
    assert straddle[44:].tolist() == d._perm(0, 1)[:84].tolist()


def test_data_independent_of_trial_seed_and_disjoint():
    # The data object never sees train.seed: two builds are identical, and only data_seed changes it.
    a, b = data_of(ARITH), data_of(dict(ARITH))
    assert a.train_examples == b.train_examples and a.val_examples == b.val_examples
    for (xa, ya), (xb, yb) in zip(a.val_batches(8, 64, 3), b.val_batches(8, 64, 3)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # a trial seed reorders, but every seed trains on the same examples
    e0 = {a.train_examples[r].prompt for s in range(25) for r in a.train_rows(s, 12, seed=0).tolist()}
    e1 = {a.train_examples[r].prompt for s in range(25) for r in a.train_rows(s, 12, seed=5).tolist()}
    assert e0 == e1 == {ex.prompt for ex in a.train_examples}
    c = data_of({**ARITH, "task": {**ARITH["task"], "data_seed": 1}})
    assert c.train_examples != a.train_examples
    for d in (a, c, data_of(PROSQA), data_of(KV)):
        train = {ex.prompt for ex in d.train_examples}
        val = {ex.prompt for ex in d.val_examples}
        assert len(train) == len(d.train_examples) and len(val) == len(d.val_examples)
        assert not train & val


def test_val_batches_fixed_and_capped():
    d = data_of(ARITH)
    vb = d.val_batches(8, 64, 3)
    assert [x.shape[0] for x, _ in vb] == [8, 8, 8]
    firsts = [d.task.vocab.decode(x[0, 1:].tolist()).split("=")[0] + "=" for x, _ in vb]
    assert firsts == [d.val_examples[i].prompt for i in (0, 8, 16)]
    assert sum(x.shape[0] for x, _ in d.val_batches(16, 64, 100)) == 40  # all of n_val, no more


def test_seq_len_too_short_is_a_config_error(tmp_path):
    d = data_of(ARITH)
    d.check_seq_len(d.max_len - 1)
    with pytest.raises(ConfigError, match=r"train\.seq_len.*data\.task"):
        d.val_batches(8, d.max_len - 2, 1)
    with pytest.raises(ConfigError, match=r"train\.seq_len"):
        d.train_batch(0, 8, d.max_len - 2, 0)
    cfg = TrialConfig.from_dict({"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "ffn_dim": 32},
                                 "data": ARITH, "train": {"steps": 5, "seq_len": 8, "checkpoint_dir": str(tmp_path)}})
    logged = []
    with pytest.raises(ConfigError, match=r"train\.seq_len: 8 is too short"):
        run_trial(cfg, tracking=Tracking(enabled=False), on_log=lambda *a: logged.append(a))
    assert not logged  # raised before any training step


@pytest.mark.parametrize("task, key", [
    ({"n_ops": [1]}, "data.task.n_ops"),
    ({"max_value": "big"}, "data.task.max_value"),
    ({"bogus": 3}, "data.task.bogus"),
    ({"data_seed": "x"}, "data.task.data_seed"),
])
def test_bad_task_params_name_the_key(task, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        TrialConfig.from_dict({"data": {"source": "arithmetic", "task": task}})


def test_bad_sizes_name_the_key():
    with pytest.raises(ConfigError, match=r"data\.task\.n_pairs"):
        TrialConfig.from_dict({"data": {"source": "kv-recall", "task": {"n_pairs": 0}}})
    with pytest.raises(ConfigError, match=r"data\.n_val"):
        TrialConfig.from_dict({"data": {**KV, "n_val": 0}})
    with pytest.raises(ConfigError, match=r"data\.n_train"):  # only ~208 distinct train prompts exist
        data_of({"source": "kv-recall", "task": {"n_pairs": 1, "key_len": 1, "value_len": 1},
                 "n_train": 400, "n_val": 5})


# -- evaluation ----------------------------------------------------------------------------------
class Oracle(nn.Module):
    """Predicts, for a known prefix, the true next token of ``examples``; for an unknown prefix
    ``fallback`` (eos by default: an empty, malformed answer). Works with the KV-cache protocol
    (``model(idx, cache)`` continues at ``cache.pos``)."""

    def __init__(self, task, examples, vocab_size: int, fallback: int = 2):
        super().__init__()
        self.cfg = preset("tiny", vocab_size=vocab_size, d_model=8, n_heads=2, n_layers=1, max_seq_len=1024)
        self.w = nn.Parameter(torch.zeros(1))
        self.V, self.fallback, self.table = vocab_size, fallback, {}
        self.calls = 0
        for ex in examples:
            ids, _ = task.encode(ex, 1 << 20)
            for t in range(len(ids) - 1):
                self.table[tuple(ids[:t + 1])] = ids[t + 1]

    def forward(self, idx, cache=None):
        self.calls += 1
        B, T = idx.shape
        start = 0 if cache is None else cache.pos
        hist = idx if start == 0 else torch.cat([self.hist, idx], 1)
        if cache is not None:
            self.hist = hist
            cache.pos += T
        rows = hist.tolist()
        logits = torch.full((B, T, self.V), -5.0)
        for b in range(B):
            for t in range(T):
                logits[b, t, self.table.get(tuple(rows[b][:start + t + 1]), self.fallback)] = 5.0
        return logits


class Constant(nn.Module):
    """Always predicts ``token`` (possibly an id beyond the task vocabulary)."""

    def __init__(self, token: int, vocab_size: int):
        super().__init__()
        self.cfg = preset("tiny", vocab_size=vocab_size, d_model=8, n_heads=2, n_layers=1, max_seq_len=1024)
        self.w = nn.Parameter(torch.zeros(1))
        self.token, self.V = token, vocab_size

    def forward(self, idx, cache=None):
        if cache is not None:
            cache.pos += idx.shape[1]
        logits = torch.zeros(*idx.shape, self.V)
        logits[..., self.token] = 1.0
        return logits


@pytest.mark.parametrize("spec", [ARITH, PROSQA, KV], ids=lambda s: s["source"])
def test_evaluate_oracle_scores_one(spec, monkeypatch):
    monkeypatch.setattr(data_tasks, "EVAL_BATCH", 7)  # several batches of mixed prompt lengths
    d = data_of(spec)
    m = Oracle(d.task, d.val_examples, d.vocab_size)
    out = d.evaluate(m, torch.device("cpu"))
    assert out["val/accuracy"] == 1.0 and out["val/malformed"] == 0.0
    if spec["source"] == "arithmetic":
        assert out["val/accuracy_ops3"] == out["val/accuracy_ops4"] == 1.0
        assert set(out) == {"val/accuracy", "val/accuracy_ops3", "val/accuracy_ops4", "val/malformed"}
    # Batches of 7 prompts sorted by length; each is one prefill up to its shortest prompt, then
    # one call per position until the last row has emitted eos (early stop).
    plen = [len(ex.prompt) + 1 for ex in d.val_examples]
    order = sorted(range(len(plen)), key=plen.__getitem__)
    want = 0
    for s in range(0, len(order), 7):
        idx = order[s:s + 7]
        want += 1 + max(plen[i] + len(d.val_examples[i].target) for i in idx) - min(plen[i] for i in idx)
    assert m.calls == want


def test_evaluate_counts_exactly_which_examples_are_right(monkeypatch):
    monkeypatch.setattr(data_tasks, "EVAL_BATCH", 8)
    d = data_of({**ARITH, "task": {"n_ops": [3, 4, 5], "max_value": 30}, "n_val": 45})
    known = [ex for i, ex in enumerate(d.val_examples) if i % 3 == 0 or ex.meta["n_ops"] == 5]
    out = d.evaluate(Oracle(d.task, known, d.vocab_size), torch.device("cpu"))
    assert out["val/accuracy"] == pytest.approx(len(known) / 45)
    for k in (3, 4, 5):
        group = [ex for ex in d.val_examples if ex.meta["n_ops"] == k]
        assert out[f"val/accuracy_ops{k}"] == pytest.approx(sum(ex in known for ex in group) / len(group))
    assert out["val/accuracy_ops5"] == 1.0 and out["val/accuracy_ops4"] < 1.0
    # the texts themselves: the known examples generate their exact target
    texts = d.generate_answers(Oracle(d.task, known, d.vocab_size), torch.device("cpu"))
    for ex, text in zip(d.val_examples, texts):
        assert (text == ex.target) == (ex in known)


@pytest.mark.parametrize("spec", [ARITH, PROSQA], ids=lambda s: s["source"])
def test_evaluate_garbage_scores_zero_without_crashing(spec):
    d = data_of(spec)
    cpu = torch.device("cpu")
    # a character forever (never eos), an id beyond the vocabulary, eos at once (empty answer)
    for m in (Constant(3, d.vocab_size), Constant(d.vocab_size + 3, d.vocab_size + 8),
              Constant(d.eos_id, d.vocab_size)):
        out = d.evaluate(m, cpu)
        assert out["val/accuracy"] == 0.0
    model = build_model(preset("tiny", vocab_size=d.vocab_size, d_model=16, n_heads=2, n_layers=2,
                               ffn_dim=32, max_seq_len=1024, router="full"))
    out = d.evaluate(model, cpu)
    assert 0.0 <= out["val/accuracy"] <= 0.1 and model.training  # train mode restored


def test_batched_decoding_matches_single_prompt_generate():
    d = data_of(ARITH)
    torch.manual_seed(1)
    model = build_model(preset("tiny", vocab_size=d.vocab_size, d_model=32, n_heads=4, n_layers=3,
                               ffn_dim=64, max_seq_len=128, router="full")).eval()
    # a model biased towards eos so that generations end at different lengths
    with torch.no_grad():
        model.embed.weight[d.eos_id] *= 4
    exs = d.val_examples[:12]
    assert len({len(ex.prompt) for ex in exs}) > 2
    max_new = max(len(ex.target) for ex in exs) + 1
    prompts = [d.task.encode_prompt(ex) for ex in exs]
    got = data_tasks._decode(model, prompts, max_new, d.eos_id, d.task.vocab.pad_id, torch.device("cpu"))
    for p, g in zip(prompts, got):
        ref = generate(model, torch.tensor([p]), max_new, eos_id=d.eos_id)[0, len(p):].tolist()
        assert d.task.vocab.decode(g) == d.task.vocab.decode(ref)
        assert g[:len(ref)] == ref[:len(g)]


# -- learning ------------------------------------------------------------------------------------
def test_tiny_model_learns_kv_recall_above_chance(tmp_path):
    # One pair, one-letter keys, one-digit values: "k:5?k=" -> "5"; chance is 1/10.
    cfg = TrialConfig.from_dict({
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 16, "router": "full"},
        "data": {"source": "kv-recall", "task": {"n_pairs": 1, "key_len": 1, "value_len": 1},
                 "n_train": 150, "n_val": 20},
        "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 10},
        "train": {"steps": 200, "batch_size": 32, "seq_len": 16, "log_interval": 50, "eval_interval": 1000,
                  "eval_batches": 2, "threads": 1, "checkpoint_dir": str(tmp_path)}})
    res = run_trial(cfg, tracking=Tracking(enabled=False))
    assert res.status == "finished"
    assert res.metrics["final/accuracy"] == res.metrics["val/accuracy"]
    assert res.metrics["val/accuracy"] >= 0.5, res.metrics
