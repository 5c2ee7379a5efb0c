"""The stability monitor: a planted spike is caught at its step with its z (computed here with numpy
from the series itself), a smooth series has none, and a resumed trial ends with the counts of an
uninterrupted one."""
import math

import numpy as np
import pytest

from orchestrator.core.status import TrialStatus
from orchestrator.engine.stability import (
    MAX_Z,
    MIN_POINTS,
    WINDOW,
    Z_THRESHOLD,
    SpikeDetector,
    StabilityHook,
)
from orchestrator.engine.trial import Hook, Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig

OFF = Tracking(enabled=False)


def naive_z(x, past):
    """Robust z by hand: the last 3 values' median carried 2 steps on by the median difference,
    against the MAD of the trailing window's differences scaled to a normal sd."""
    w = np.asarray(past[-WINDOW:], np.float64)
    d = np.diff(w)
    slope = np.median(d)
    expected = np.median(w[-3:]) + 2 * slope
    spread = max(1.4826 * np.median(np.abs(d - slope)), 0.01 * abs(expected))
    return (x - expected) / spread


def smooth(n=80, seed=0):
    """A training-like loss: exponential fall to a floor plus 1% noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 3.0 + 5.0 * np.exp(-t / 15.0) + 0.01 * rng.standard_normal(n)


def test_a_planted_spike_is_caught_at_its_step_with_its_z():
    series = smooth()
    series[50] += 0.5  # 50 times the noise
    det = SpikeDetector()
    found = [det.observe("train/loss", 10 * i, v) for i, v in enumerate(series)]
    spikes = [s for s in found if s is not None]
    assert [(s.series, s.step) for s in spikes] == [("train/loss", 500)]
    assert spikes[0].z == pytest.approx(naive_z(series[50], list(series[:50])), rel=1e-9)
    assert spikes[0].z > 10  # +0.5 on a level of ~3.2: the 1% floor (0.032) bounds z by ~16
    counts = det.counts()
    assert counts["stability/train_loss_spikes"] == 1 and counts["stability/val_loss_spikes"] == 0
    assert counts[MAX_Z] == pytest.approx(spikes[0].z)
    assert counts["stability/train_loss_checked"] == 80 - MIN_POINTS and counts["stability/val_loss_checked"] == 0
    assert det.tags() == {"stability": "spiky", "stability_steps": "train/loss@500"}


def test_a_smooth_series_has_no_spike_and_its_largest_z_is_small():
    for seed in range(5):
        det = SpikeDetector()
        for i, v in enumerate(smooth(seed=seed)):
            det.observe("train/loss", i, v)
            det.observe("train/grad_norm", i, 1.0 + 0.05 * math.sin(i) + 0.01 * i)
        assert det.spikes == [] and det.tags()["stability"] == "stable"
        assert det.max_z < Z_THRESHOLD


def test_the_window_and_the_warm_up_are_honoured():
    det = SpikeDetector()
    for i in range(MIN_POINTS):  # too few earlier values: a jump here is not judged
        assert det.observe("val/loss", i, 1.0 if i < MIN_POINTS - 1 else 9.0) is None
    assert math.isnan(det.max_z)
    # a flat stretch (MAD 0): the floor makes a 0.5% wiggle z=0.5, a 10% jump z=10
    det = SpikeDetector()
    for i in range(10):
        det.observe("val/loss", i, 2.0)
    assert det.observe("val/loss", 10, 2.01) is None
    spike = det.observe("val/loss", 11, 2.2)
    assert spike is not None and spike.z == pytest.approx(naive_z(2.2, [2.0] * 10 + [2.01]))
    assert det.observe("val/loss", 12, float("nan")) is None  # a non-finite value is the trainer's divergence


def test_the_steps_tag_names_the_first_hundred_spikes():
    det = SpikeDetector()
    for i in range(3000):  # a flat series with a jump every 20th point: 150 spikes
        det.observe("train/grad_norm", i, 10.0 if i % 20 == 19 else 1.0)
    n = len(det.spikes)
    assert n == det.counts()["stability/grad_norm_spikes"] == 150
    steps = det.tags()["stability_steps"].split(",")
    assert len(steps) == 101 and steps[0] == f"train/grad_norm@{det.spikes[0].step}"
    assert steps[-1] == f"... {n - 100} more"


def tiny(steps=40, **train):
    return TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
        "train": {"steps": steps, "batch_size": 2, "seq_len": 16, "log_interval": 1, "eval_interval": 1000,
                  "eval_batches": 1, **train}})


class TripleLossAt(Hook):
    """Plants a training-loss spike: the step's reported loss times 3 at one step (0-based)."""

    def __init__(self, step):
        self.step = step

    def after_backward(self, t, loss):
        return 3.0 * loss if t.step == self.step else None


def expected_train_spikes(history):
    """(step, z) of every train/loss spike, recomputed from the logged series with numpy."""
    series = [(h["step"], h["train/loss"]) for h in history if "train/loss" in h]
    out = []
    for i, (step, v) in enumerate(series):
        past = [x for _, x in series[:i]]
        if len(past) >= MIN_POINTS:
            z = naive_z(v, past)
            if z >= Z_THRESHOLD:
                out.append((step, z))
    return out


def test_a_planted_spike_in_a_trial_is_caught_and_survives_a_resume(tmp_path):
    whole = run_trial(tiny(), tracking=OFF, hooks=[TripleLossAt(30)])
    assert whole.status is TrialStatus.FINISHED
    expected = expected_train_spikes(whole.history)
    assert [s for s, _ in expected] == [31]  # the step's loss is logged once the step is done
    assert whole.metrics["stability/train_loss_spikes"] == 1
    assert whole.metrics[MAX_Z] >= expected[0][1] == pytest.approx(expected[0][1])

    ck = str(tmp_path / "ck")
    first = run_trial(tiny(checkpoint_dir=ck), tracking=OFF, hooks=[TripleLossAt(30)], stop_at=33)
    assert first.status is TrialStatus.STOPPED
    monitor = StabilityHook()
    resumed = run_trial(tiny(checkpoint_dir=ck), tracking=OFF, resume=ck, hooks=[monitor])
    stab = {k: v for k, v in resumed.metrics.items() if k.startswith("stability/")}
    assert stab == {k: v for k, v in whole.metrics.items() if k.startswith("stability/")}
    assert monitor.end_tags(None) == {"stability": "spiky", "stability_steps": "train/loss@31"}


def test_the_run_is_tagged(mlflow_uri):
    from mlflow.tracking import MlflowClient

    res = run_trial(tiny(), tracking=Tracking(experiment="stab"), hooks=[TripleLossAt(30)])
    run = MlflowClient(mlflow_uri).get_run(res.run_id)
    assert run.data.tags["stability"] == "spiky" and run.data.tags["stability_steps"] == "train/loss@31"
    assert run.data.metrics["stability/train_loss_spikes"] == 1


class ValSpikeAt(Hook):
    """Plants a validation spike: +1 nat on the evaluation at one step (runs before the monitor,
    so the monitor sees the planted value, as it would a real one)."""

    def __init__(self, step):
        self.step = step

    def on_start(self, t):
        evaluate = t.evaluate

        def planted(*a, **k):
            out = evaluate(*a, **k)
            return {**out, "val/loss": out["val/loss"] + 1.0} if t.step == self.step else out

        t.evaluate = planted


def test_a_val_spike_at_the_final_evaluation_is_caught():
    from orchestrator.engine.trainer import Trainer

    monitor = StabilityHook()
    res = Trainer(tiny(steps=30, eval_interval=2), [ValSpikeAt(30), monitor]).run()
    assert res.metrics["stability/val_loss_spikes"] == 1 and res.metrics["stability/train_loss_spikes"] == 0
    assert res.metrics["stability/val_loss_checked"] == 15 - MIN_POINTS  # evaluations at 2, 4, ..., 30
    assert monitor.end_tags(None) == {"stability": "spiky", "stability_steps": "val/loss@30"}
    vals = [(h["step"], h["val/loss"]) for h in res.history if "val/loss" in h]
    assert vals[-1][0] == 30 and res.final_val_loss == vals[-1][1]  # the planted value is the final one
    z = naive_z(vals[-1][1], [v for _, v in vals[:-1]])
    assert z >= Z_THRESHOLD and res.metrics[MAX_Z] == pytest.approx(z)
