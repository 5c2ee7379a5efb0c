"""The paired design's premise (orchestrator.report.compare.by_seed): two trials with the same seed see
the same batches in the same order and start from the same weights for every parameter they
share, whatever their router. Checked through the engine's own setup (Trainer), for every
registered router (and every registered depth mix, when the model library has that registry)."""
from __future__ import annotations

import pytest
import torch

import lime_arch
from orchestrator.engine.trainer import Trainer
from orchestrator.engine.trial_config import TrialConfig

BASE = {"preset": "tiny", "model": {"n_layers": 4, "d_model": 32, "n_heads": 4, "ffn_dim": 64, "max_seq_len": 32},
        "data": {"source": "builtin"}, "train": {"steps": 2, "batch_size": 2, "seq_len": 16, "eval_batches": 1}}


def _trainer(seed: int, **model) -> Trainer:
    cfg = {**BASE, "model": {**BASE["model"], **model}, "train": {**BASE["train"], "seed": seed}}
    return Trainer(TrialConfig.from_dict(cfg))


def _shared(a: Trainer, b: Trainer) -> list[str]:
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    return sorted(k for k in pa.keys() & pb.keys() if pa[k].shape == pb[k].shape)


def _same_start(a: Trainer, b: Trainer) -> None:
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    names = _shared(a, b)
    assert any(n.startswith("blocks.") for n in names) and "embed.weight" in names
    for n in names:
        assert torch.equal(pa[n], pb[n]), n
    for step in range(3):  # the same batches in the same order
        xa, ya = a.data.train_batch(step, 2, 16, a.cfg.train.seed)
        xb, yb = b.data.train_batch(step, 2, 16, b.cfg.train.seed)
        assert torch.equal(torch.as_tensor(xa), torch.as_tensor(xb))
        assert torch.equal(torch.as_tensor(ya), torch.as_tensor(yb))


@pytest.fixture(scope="module")
def baseline():
    return _trainer(3, router="none")


@pytest.mark.parametrize("router", [r for r in lime_arch.router_specs((4,)) if r != "none"])  # within 4 layers
def test_same_seed_same_start_for_every_router(baseline, router):
    _same_start(baseline, _trainer(3, router=router))


@pytest.mark.parametrize("mix", [m for m in getattr(lime_arch, "DEPTH_MIXES", {}) if m != "none"] or
                         [pytest.param("none", marks=pytest.mark.skip(reason="no depth-mix registry here"))])
def test_same_seed_same_start_for_every_depth_mix(baseline, mix):
    _same_start(baseline, _trainer(3, router="none", depth_mix=mix))


def test_another_seed_starts_elsewhere(baseline):
    # the check above could pass vacuously if the init ignored the seed
    other = _trainer(4, router="none")
    assert not torch.equal(dict(baseline.model.named_parameters())["embed.weight"],
                           dict(other.model.named_parameters())["embed.weight"])
    xa, _ = baseline.data.train_batch(0, 2, 16, 3)
    xb, _ = other.data.train_batch(0, 2, 16, 4)
    assert not torch.equal(torch.as_tensor(xa), torch.as_tensor(xb))
