"""The validation set of the corpora: windows spread over every held-out document, none from
training, the same for every seed and variant, its size ``data.val_tokens``; the builtin corpus
without near duplicates; ``val/loss_se`` against a naive numpy computation."""
import re

import numpy as np
import pytest
import torch

from lime_arch import ConfigError
from orchestrator.engine.data import make_batches
from orchestrator.engine.data.corpus import builtin_documents, split_documents, train_bpe
from orchestrator.engine.data.heldout import drop_near_duplicates, window_starts
from orchestrator.engine.trainer import Trainer
from orchestrator.engine.trial_config import DataConfig, TrialConfig
from orchestrator.engine.val_loss import mean_and_se


def test_window_starts_by_hand():
    # 101 ids hold (101 - 1) // 10 = 10 windows of 10 targets; the last start that fits is 90
    assert window_starts(101, 10, 30) == [0, 45, 90]  # 3 windows, spread from first to last
    assert window_starts(101, 10, 10**6) == list(range(0, 91, 10))  # capped: the whole stream, tiled
    assert window_starts(101, 10, 5) == [45]  # fewer than one window's targets: one, in the middle
    assert window_starts(101, 10, 39) == [0, 45, 90]  # 39 // 10 = 3
    with pytest.raises(ConfigError, match=r"^data: the corpus validation split \(5 tokens\) is shorter than "
                                          r"train.seq_len=10$"):
        window_starts(5, 10, 100)


def _letters(tmp_path, lengths):
    """One file per document, document i the letter chr(97 + i) repeated: a target's byte names its document."""
    for i, n in enumerate(lengths):
        (tmp_path / f"d{i:02d}.txt").write_text(chr(97 + i) * n)
    return str(tmp_path / "*.txt")


def test_windows_come_from_every_held_out_document_and_none_from_training(tmp_path):
    # ten documents, the last half held out (f..j) with lengths 40, 300, 25, 120, 60
    glob = _letters(tmp_path, [200, 150, 90, 400, 80, 40, 300, 25, 120, 60])
    d = make_batches(DataConfig(source="text", paths=[glob], val_fraction=0.5, val_tokens=128))
    # held-out stream: 40+300+25+120+60 letters + 5 EOS = 550 ids; 128 // 8 = 16 windows of 8 targets,
    # spacing (550 - 1 - 8) / 15 = 36 > 25, so even the 26-id document 'h' holds a window's start
    batches = d.val_batches(4, 8)
    assert len(batches) == 1 and batches[0][0].shape == (16, 8)  # batches of 8192 // 8 windows at least
    targets = set(torch.cat([y.flatten() for _, y in batches]).tolist())
    assert targets - {d.eos_id} == {ord(c) for c in "fghij"}
    inputs = set(torch.cat([x.flatten() for x, _ in batches]).tolist())
    assert not inputs & {ord(c) for c in "abcde"}  # nothing of training
    starts = window_starts(550, 8, 128)
    assert len(set(starts)) == 16 and min(b - a for a, b in zip(starts, starts[1:])) >= 8  # disjoint targets
    assert torch.equal(batches[0][0][1], d.val[starts[1]:starts[1] + 8])


def _trainer(seed, router, **data):
    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": router, "n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "data": data, "train": {"steps": 2, "batch_size": 4, "seq_len": 32, "seed": seed, "eval_batches": 1}})
    return Trainer(cfg)


def test_the_set_is_the_same_for_every_seed_and_variant_and_sized_by_val_tokens():
    a, b = _trainer(0, "none", val_tokens=4096), _trainer(3, "full", val_tokens=4096)
    assert [x.shape for x, _ in a.val] == [(128, 32)]  # 4096 // 32 windows; batches of 8192 // 32 rows at most
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a.val, b.val))
    # the default (32768) asks 1024 windows: the builtin split holds more, spread over all of it
    full = _trainer(0, "none")
    assert [x.shape[0] for x, _ in full.val] == [256] * 4


@pytest.mark.parametrize("value, message", [
    (0, "data.val_tokens: must be >= 1, got 0"),
    (-5, "data.val_tokens: must be >= 1, got -5"),
    (1.5, "data.val_tokens: must be an integer >= 1, got 1.5"),
    ("many", "data.val_tokens: must be an integer >= 1, got 'many'"),
])
def test_val_tokens_must_be_a_positive_int(value, message):
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_dict({"data": {"val_tokens": value}})
    assert str(e.value) == message


def test_loss_se_against_numpy():
    t = _trainer(0, "full", val_tokens=1024)
    got = t.evaluate()
    t.model.eval()
    per_window = []
    with torch.no_grad():
        for x, y in t.val:
            logp = torch.log_softmax(t.model(x).double(), -1).numpy()
            yy = y.numpy()
            nll = -np.take_along_axis(logp, yy[..., None], -1)[..., 0]  # (batch, seq)
            per_window.extend(nll.mean(1))
    per_window = np.array(per_window)
    assert len(per_window) == 32
    assert got["val/loss"] == pytest.approx(per_window.mean(), rel=1e-5)
    assert got["val/loss_se"] == pytest.approx(per_window.std(ddof=1) / np.sqrt(32), rel=1e-4)


def test_mean_and_se_unequal_counts_by_hand():
    # windows (sum, count): (2, 1), (6, 3), (4, 4): m = 12 / 8 = 1.5; residuals s - m c: 0.5, 1.5, -2
    # se = sqrt(3 / 2 * (0.25 + 2.25 + 4)) / 8 = sqrt(9.75) / 8
    m, se = mean_and_se([2.0, 6.0, 4.0], [1, 3, 4])
    assert m == 1.5 and se == pytest.approx(9.75 ** 0.5 / 8)
    assert np.isnan(mean_and_se([3.0], [2])[1])


def test_near_duplicates_dropped():
    line = "a line long enough to count as text, not a table rule; number {}"
    big = "\n".join(line.format(i) for i in range(10))
    section = "\n".join(line.format(i) for i in range(3, 8)) + "\nshort"  # 5 of big's lines
    half = "\n".join([line.format(0), "another long line that nothing else has, to be kept as new"])
    other = "\n".join(line.format(i) for i in range(20, 24))
    texts = [section, big, other, half, "tiny", "tiny"]
    # section: all its long lines in big (kept first, longest); half: 1 of 2 lines (>= 50%) -> dropped
    assert drop_near_duplicates(texts) == [big, other, "tiny"]


def test_builtin_has_no_held_out_text_in_training():
    from pydoc_data.topics import topics

    docs = builtin_documents()
    assert len(docs) == 57 and topics["typesseq"] in docs and topics["typesseq-mutable"] not in docs
    # "if" and "else" are one text, and its long lines are a section of "compound" (kept): none of them
    if_lines = [s.strip() for s in topics["if"].splitlines() if len(s.strip()) >= 30]
    assert topics["if"] == topics["else"] and all(s in topics["compound"] for s in if_lines)
    assert topics["compound"] in docs and topics["if"] not in docs
    train, val = split_documents(docs, DataConfig().val_fraction)
    seen = {s.strip() for t in train for s in t.splitlines() if len(s.strip()) >= 30}
    for v in val:
        long = [s.strip() for s in v.splitlines() if len(s.strip()) >= 30]
        assert sum(s in seen for s in long) <= len(long) // 4, v[:60]


def test_hf_windows_spread_over_every_validation_document(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    docs = [f"doc {i}: " + f"word{i} " * (20 + 7 * i) for i in range(30)]
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "ds"))
    tok = train_bpe(docs, 300)
    tok.tok.save(str(tmp_path / "tokenizer.json"))
    cfg = DataConfig(source="hf", hf_name=str(tmp_path / "ds"), hf_val_docs=6, val_tokens=64,
                     tokenizer=str(tmp_path / "tokenizer.json"))
    d = make_batches(cfg)
    eos = [i for i, t in enumerate(d.val.tolist()) if t == d.eos_id]
    assert len(eos) == 6
    batches = d.val_batches(2, 8)
    starts = window_starts(d.val.numel(), 8, 64)
    assert len(starts) == 8 and sum(x.shape[0] for x, _ in batches) == 8
    # every validation document (between two EOS) holds targets of some window
    bounds = [-1, *eos]
    for lo, hi in zip(bounds, bounds[1:]):
        assert any(lo < s + k <= hi for s in starts for k in range(1, 9)), (lo, hi)
    # training documents (word6..word29): never; each window decoded alone (joined, "word1" + "2" reads 12)
    found = {int(n) for _, y in batches for row in y for n in re.findall(r"word(\d+)", tok.decode(row.tolist()))}
    assert found <= set(range(6)) and len(found) >= 4
