"""A diverged trial (NaN/inf loss) is a result, not an error, for every router of the registry
and every depth mix: it ends `diverged` (MLflow run FINISHED, tag status=diverged), keeps the
metrics it logged up to the divergence and its config and router weights, and does not raise
(so Ray does not retry it). The end-to-end sweep version is in test_sweep_failures.py."""
from __future__ import annotations

import dataclasses
import math

import pytest

import lime_arch
from orchestrator.core.status import TrialStatus
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig


def _depth_mixes() -> list[str | None]:
    """The depth-mix registry's names (DenseFormer, Hyper-Connections, value residual, ...), once
    the model has ``model.depth_mix``; [None] before that."""
    if "depth_mix" not in {f.name for f in dataclasses.fields(lime_arch.ModelConfig)}:
        return [None]
    for name in ("DEPTH_MIXES", "DEPTH_MIX", "MIXES"):
        registry = getattr(lime_arch, name, None)
        if registry:
            return sorted(registry)
    pytest.fail("ModelConfig has depth_mix but lime_arch exports no depth-mix registry this test knows; "
                "add its name to _depth_mixes")  # at collection: every mix must be covered


def _cases() -> list:
    """Every router (families within 4 layers) with every depth mix. In make test each router once
    (without a mix) and each mix once (with ``full``): every variant of both registries ends
    diverged. The rest of the product (over 200 more trials, all in one worker since the cases share
    the store) is marked slow (make test-slow)."""
    routers, mixes = lime_arch.router_specs((4,)), _depth_mixes()
    plain = "none" if "none" in mixes else mixes[0]
    fast = {(r, plain) for r in routers} | {("full", m) for m in mixes}
    return [pytest.param(r, m, id=f"{r}-{m}" if m else r, marks=() if (r, m) in fast else pytest.mark.slow)
            for r in routers for m in mixes]


CASES = _cases()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("diverge")
    return f"sqlite:///{d}/mlflow.db"


@pytest.mark.parametrize(("router", "depth_mix"), CASES)
def test_a_diverging_trial_ends_diverged_with_its_metrics(router, depth_mix, store, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    model = {"n_layers": 4, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64, "router": router}
    if depth_mix is not None:
        model["depth_mix"] = depth_mix
    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": model, "data": {"source": "builtin"},
        "optim": {"lr": 1000.0, "grad_clip": 0.0, "warmup_steps": 1},
        "train": {"steps": 40, "batch_size": 4, "seq_len": 32, "log_interval": 1, "eval_interval": 100,
                  "threads": 1, "device": "cpu", "checkpoint_dir": str(tmp_path / "ck")}})
    res = run_trial(cfg, tracking=Tracking(experiment="diverge", run_name=f"{router}-{depth_mix}"))
    assert res.status is TrialStatus.DIVERGED and res.step < 40
    from mlflow.tracking import MlflowClient

    cl = MlflowClient(tracking_uri=store)
    run = cl.get_run(res.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "diverged"
    hist = sorted(cl.get_metric_history(res.run_id, "train/loss"), key=lambda m: m.step)
    assert [m.step for m in hist] == list(range(1, res.step + 1))  # every step up to the divergence
    assert all(math.isfinite(m.value) for m in hist[:-1]) and not math.isfinite(hist[-1].value)
    assert {a.path for a in cl.list_artifacts(res.run_id)} >= {"config.yaml", "router_weights.npz"}
