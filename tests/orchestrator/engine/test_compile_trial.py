"""``train.compile: true`` runs a whole trial compiled: the same losses as eager, no graph break,
evaluation and the memory metrics through the compiled model. The fast test hands the trainer's
``torch.compile`` the ``aot_eager`` backend (Dynamo and AOTAutograd, no C++ build); the slow one
runs Inductor as the trainer does."""
import functools

import pytest
import torch

from orchestrator.engine import trainer as trainer_module
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig


def _trial(router: str, compile_: bool) -> TrialConfig:
    return TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": router, "n_layers": 3, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "log_interval": 2, "eval_interval": 2,
                  "eval_batches": 1, "compile": compile_}})


def _check(router: str, rel: float) -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    runs = [run_trial(_trial(router, c), tracking=Tracking(enabled=False)) for c in (False, True)]
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    for key in ("train/loss", "val/loss"):
        eager, compiled = ([h[key] for h in r.history if key in h] for r in runs)
        assert len(eager) == 2 and compiled == pytest.approx(eager, rel=rel), key
    assert runs[1].final_val_loss == pytest.approx(runs[0].final_val_loss, rel=rel)
    assert runs[1].metrics["perf/saved_activations_mb"] > 0


@pytest.mark.parametrize("router", ["full", "first-2"])
def test_compiled_trial_equals_eager(router, monkeypatch):
    monkeypatch.setattr(trainer_module.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    _check(router, 1e-6)


@pytest.mark.slow
def test_compiled_trial_with_inductor():
    """fp32: Inductor's fused reductions move the losses by ~1e-6 relative over these steps."""
    _check("full", 1e-4)
