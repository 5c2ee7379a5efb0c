"""The trainer's hook protocol: phases in order, hook metrics logged, errors and statuses."""
import math

import pytest
import torch

from lime_arch import ConfigError
from orchestrator.core.status import TrialStatus
from orchestrator.engine.trial import Hook, Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig

OFF = Tracking(enabled=False)


def tiny(steps=8, **train):
    return TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
        "train": {"steps": steps, "batch_size": 2, "seq_len": 16, "log_interval": 2, "eval_interval": 4,
                  "eval_batches": 1, **train}})


class Recorder(Hook):
    def __init__(self, run_id=None):
        self.events, self.run_id = [], run_id

    def on_start(self, t):
        self.events.append(("start", t.step, t.resumed, t.run_id))
        if self.run_id:
            t.run_id = self.run_id

    def on_log(self, t, step, metrics, checkpoint):
        assert step == t.step and t.history[-1] == {"step": step, **metrics}
        self.events.append(("log", step, sorted(k.split("/")[0] for k in metrics), checkpoint is not None))

    def on_stop(self, t):
        self.events.append(("stop", t.step))

    def on_end(self, t, status):
        self.events.append(("end", t.step, status))

    def on_error(self, t, exc):
        self.events.append(("error", t.step, type(exc).__name__))


def test_phases_in_order_across_stop_and_resume(tmp_path):
    ck = str(tmp_path / "ck")
    first = Recorder(run_id="run-a")
    res = run_trial(tiny(checkpoint_dir=ck), tracking=OFF, stop_at=4, hooks=[first])
    assert res.status is TrialStatus.STOPPED and res.run_id == "run-a"
    train = ["perf"] * 6 + ["train"] * 4  # trainer: step time, peak; MemoryHook: 4 memory metrics
    assert first.events == [("start", 0, False, None), ("log", 2, train, False),
                            ("log", 4, train + ["val"] * 3, True), ("stop", 4)]
    assert torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)["run_id"] == "run-a"
    second = Recorder()
    res = run_trial(tiny(checkpoint_dir=ck), tracking=OFF, resume=ck, hooks=[second])
    assert res.status is TrialStatus.FINISHED and res.status == "finished" and res.run_id == "run-a"
    # val loss, its se and ppl; CostHook: step time, training memory; StabilityHook: 3 spike counts, 3 checked, max z
    final = ["final"] * 5 + ["stability"] * 7 + ["val"] * 3
    assert second.events == [("start", 4, True, "run-a"), ("log", 6, train, False), ("log", 8, train, False),
                             ("log", 8, final, True), ("end", 8, TrialStatus.FINISHED)]
    # the cost summary covers the whole run: the 2 windows before the stop and the 2 after the resume
    windows = [h for h in res.history if "perf/step_time_ms" in h]
    assert [h["step"] for h in windows] == [2, 4, 6, 8]
    times = sorted(h["perf/step_time_ms"] for h in windows)
    assert res.metrics["final/step_time_ms"] == pytest.approx((times[1] + times[2]) / 2)
    assert res.metrics["final/train_mem_mb"] == max(h["perf/train_mem_mb"] for h in windows)


class Extra(Hook):
    """A new kind of logging, as a hook: a metric at every log point and one at the end."""

    def log_metrics(self, t):
        return {"extra/step_squared": float(t.step ** 2)}

    def final_metrics(self, t):
        return {"extra/final_lr": t.optimizer.param_groups[0]["lr"]}


def test_hook_metrics_are_logged_like_the_engines(mlflow_uri):
    from mlflow.tracking import MlflowClient

    res = run_trial(tiny(), tracking=Tracking(experiment="hooks"), hooks=[Extra()])
    logged = [h for h in res.history if "train/loss" in h]
    assert [h["extra/step_squared"] for h in logged] == [4.0, 16.0, 36.0, 64.0]
    assert list(logged[1])[:7] == ["step", "train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s",
                                   "perf/step_time_ms", "perf/peak_mem_mb"]
    assert list(logged[1])[-4:] == ["extra/step_squared", "val/loss", "val/loss_se", "val/ppl"]  # after the hooks
    assert "val/loss" in logged[1]  # step 4 is also an eval point: after the hook's metric
    assert res.metrics["extra/final_lr"] == pytest.approx(3e-4)  # cosine to min_lr at the end
    cl = MlflowClient(mlflow_uri)
    hist = cl.get_metric_history(res.run_id, "extra/step_squared")
    assert sorted((m.step, m.value) for m in hist) == [(2, 4.0), (4, 16.0), (6, 36.0), (8, 64.0)]
    assert cl.get_run(res.run_id).data.metrics["extra/final_lr"] == pytest.approx(3e-4)


class Boom(Hook):
    def __init__(self, exc):
        self.exc = exc

    def on_log(self, t, step, metrics, checkpoint):
        if step == 4:
            raise self.exc


@pytest.mark.parametrize("exc, status, mlflow_status", [
    (RuntimeError("boom"), "failed", "FAILED"), (KeyboardInterrupt(), "killed", "KILLED")])
def test_an_error_reaches_every_hook_and_ends_the_run(exc, status, mlflow_status, mlflow_uri):
    from mlflow.tracking import MlflowClient

    rec = Recorder()
    with pytest.raises(type(exc)):
        run_trial(tiny(), tracking=Tracking(experiment="err"), hooks=[rec, Boom(exc)])
    assert rec.events[-1] == ("error", 4, type(exc).__name__)
    cl = MlflowClient(mlflow_uri)
    (run,) = cl.search_runs([cl.get_experiment_by_name("err").experiment_id])
    assert run.info.status == mlflow_status and run.data.tags["status"] == status
    assert [m.step for m in cl.get_metric_history(run.info.run_id, "train/loss")] == [2, 4]  # flushed


def test_tracked_divergence_ends_as_diverged_without_a_heatmap(mlflow_uri):
    # the NaN router weights of a diverged trial have no source map; the run still ends cleanly
    from mlflow.tracking import MlflowClient

    cfg = tiny(steps=30, log_interval=1)
    cfg.optim.lr, cfg.optim.min_lr, cfg.optim.grad_clip, cfg.optim.warmup_steps = 1e8, 0.0, 0.0, 0
    rec = Recorder()
    res = run_trial(cfg, tracking=Tracking(experiment="dv"), hooks=[rec])
    assert res.status is TrialStatus.DIVERGED and res.final_val_loss is None
    assert rec.events[-1] == ("end", res.step, TrialStatus.DIVERGED)
    assert not math.isfinite(res.history[-1]["train/loss"])
    cl = MlflowClient(mlflow_uri)
    run = cl.get_run(res.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "diverged"
    assert {a.path for a in cl.list_artifacts(res.run_id)} == {"config.yaml", "router_weights.npz"}


def test_data_errors_come_before_the_tracking_run(mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = TrialConfig.from_dict({
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "ffn_dim": 32},
        "data": {"source": "arithmetic", "n_train": 50, "n_val": 10},
        "train": {"steps": 5, "seq_len": 8, "checkpoint_dir": str(tmp_path)}})
    rec = Recorder()
    with pytest.raises(ConfigError, match=r"train\.seq_len"):
        run_trial(cfg, tracking=Tracking(experiment="early"), hooks=[rec])
    assert rec.events == []
    assert MlflowClient(mlflow_uri).get_experiment_by_name("early") is None
