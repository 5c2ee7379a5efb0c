"""What the driver's console says about a trial's attempts and its tracking server (issues 30, 39),
from the results a trial reports: where a retried or resumed attempt continues, as the attempt
itself says, whether a retry was spent (only a trial's own errors spend one; a lost worker is
retried in the same launch), and when its MLflow server went away and came back. Ray's callbacks
are called on stand-in trials (the methods are plain Python; ``live_view`` only adds Ray's base
class)."""
from __future__ import annotations

import types

import pytest

from lime_arch.errors import ConfigError
from orchestrator.sweep.console import LiveView
from orchestrator.sweep.driver import lost_retries


class _Trial:
    """What the view reads of a Ray trial."""

    def __init__(self, name: str, failures: int = 0, checkpoint=None):
        self.name, self.checkpoint, self.max_failures = name, checkpoint, 2
        self.run_metadata = types.SimpleNamespace(num_failures=failures)
        self.status, self.path = "RUNNING", f"/results/{name}"

    def __str__(self) -> str:
        return self.name


_trial = _Trial


def _view() -> LiveView:
    return LiveView(total=1, steps={"base": 100}, default_steps=100, metric="final/val_loss", mode="min", every=1e9)


def _lines(capsys) -> list[str]:
    return [ln.split("] ", 1)[1] for ln in capsys.readouterr().out.splitlines()]


def test_a_retry_says_whether_it_has_a_checkpoint_and_the_attempt_where_it_continues(capsys):
    v = _view()
    t = _trial("base", failures=1, checkpoint=object())
    v.on_trial_result(0, [t], t, {"own_error": "RuntimeError: boom", "step": 0})  # before the attempt raises
    v.on_trial_recover(0, [t], t)
    v.on_trial_start(0, [t], t)
    v.on_trial_result(0, [t], t, {"step": 20, "start_step": 10, "resumed": 1})
    v.on_trial_result(0, [t], t, {"step": 30, "start_step": 10, "resumed": 1})  # said once per attempt
    bare = _trial("base", failures=1)
    v.on_trial_recover(0, [bare], bare)  # no error of its own reported: its worker was lost
    v.on_trial_start(0, [bare], bare)
    v.on_trial_result(0, [bare], bare, {"step": 10, "start_step": 0, "resumed": 0})
    assert _lines(capsys) == [
        "retry  base (its error 1 of 2 allowed: RuntimeError: boom): it has a checkpoint to continue from",
        "start  base (attempt 2)",
        "resume base: continues from its checkpoint at step 10",
        "retry  base: its worker was lost (a killed process or node; 1 of 10 allowed, $LIME_LOST_WORKER_RETRIES), "
        "no retry of its 2 spent: no checkpoint yet: it starts over at step 0",
        "start  base (attempt 2)",
        "resume base: no checkpoint to continue from: starts over at step 0",
    ]


def _fail(v: LiveView, t: _Trial, own_error: str | None = None) -> None:
    """A failing attempt as Ray's controller handles it (``TuneController._process_trial_failure``):
    the error counted, then Ray's own ``Trial.should_recover`` decides between a retry and the end."""
    from ray.tune.experiment.trial import Trial

    if own_error:  # the attempt's last report, before it raises (orchestrator.sweep.mlflow_runs.report_own_error)
        v.on_trial_result(0, [t], t, {"own_error": own_error, "step": 0, "status": "failed"})
    t.run_metadata.num_failures += 1
    if Trial.should_recover(t):
        v.on_trial_recover(0, [t], t)
        v.on_trial_start(0, [t], t)
    else:
        v.on_trial_error(0, [t], t)


def test_only_a_trials_own_errors_spend_its_retries_and_lost_workers_are_retried_in_the_same_launch(capsys):
    v = LiveView(total=2, steps={}, default_steps=100, metric="final/val_loss", mode="min", every=1e9, retries=1,
                 lost_retries=2)
    t = _trial("base", checkpoint=object())
    t.max_failures = 1  # as Ray's FailureConfig made it: the view sets it at every start
    v.on_trial_start(0, [t], t)
    assert t.max_failures == -1
    _fail(v, t)  # a killed worker: retried, nothing spent
    _fail(v, t, "RuntimeError: boom")  # its own error: the one retry it has
    _fail(v, t)  # lost again: still retried, its budget spent already
    assert t.status == "RUNNING" and t.max_failures == 0  # the next failure, of any kind, ends it
    _fail(v, t, "RuntimeError: boom")
    other = _trial("other", checkpoint=object())
    v.on_trial_start(0, [other], other)
    for _ in range(3):
        _fail(v, other)
    out = _lines(capsys)
    lost = ("retry  {}: its worker was lost (a killed process or node; {} of 2 allowed, $LIME_LOST_WORKER_RETRIES), "
            "no retry of its 1 spent: it has a checkpoint to continue from")
    assert [ln for ln in out if not ln.startswith(("start", "0/2", "1/2"))] == [
        lost.format("base", 1),
        "retry  base (its error 1 of 1 allowed: RuntimeError: boom): it has a checkpoint to continue from",
        lost.format("base", 2),
        "FAILED base after 2 error(s) of its own (1 retries allowed): RuntimeError: boom; see /results/base/trial.log "
        "and error.txt",
        lost.format("other", 1),
        lost.format("other", 2),
        "FAILED other: its worker was lost 3 times ($LIME_LOST_WORKER_RETRIES=2); see /results/other/trial.log and "
        "error.txt",
    ]


def test_a_bad_lost_worker_setting_is_one_line(monkeypatch):
    monkeypatch.setenv("LIME_LOST_WORKER_RETRIES", "-1")
    with pytest.raises(ConfigError) as e:
        lost_retries()
    assert str(e.value) == "$LIME_LOST_WORKER_RETRIES: must be a whole number >= 0, got '-1'"
    monkeypatch.setenv("LIME_LOST_WORKER_RETRIES", "3")
    assert lost_retries() == 3


def test_a_resumed_sweeps_trial_that_left_no_checkpoint_says_it_starts_over(capsys):
    v = _view()  # a new launch: the view knows nothing of the killed one
    t = _trial("base")
    v.on_trial_start(0, [t], t)
    v.on_trial_result(0, [t], t, {"step": 10, "start_step": 0, "resumed": -1})
    fresh = _trial("other")
    v.on_trial_start(0, [fresh], fresh)
    v.on_trial_result(0, [fresh], fresh, {"step": 10, "start_step": 0, "resumed": 0})  # a first start: nothing
    assert _lines(capsys) == ["start  base", "resume base: no checkpoint to continue from: starts over at step 0",
                              "start  other"]


def test_an_outage_is_said_when_it_begins_and_when_it_ends(capsys):
    v = _view()
    t = _trial("base")
    ok = {"step": 10, "mlflow_outage_s": 0.0, "mlflow_buffered": 0.0, "mlflow_last_kept": 0.0}
    v.on_trial_result(0, [t], t, ok)
    v.on_trial_result(0, [t], t, {**ok, "step": 20, "mlflow_outage_s": 4.2, "mlflow_buffered": 80.0})
    v.on_trial_result(0, [t], t, {**ok, "step": 30, "mlflow_outage_s": 9.0, "mlflow_buffered": 160.0})
    v.on_trial_result(0, [t], t, {**ok, "step": 40, "mlflow_last_outage_s": 31.4, "mlflow_last_kept": 240.0})
    v.on_trial_result(0, [t], t, {**ok, "step": 50})
    assert _lines(capsys) == [
        "MLflow unreachable from base for 4 s: it keeps training and keeps its metrics (80 so far) until the server "
        "answers",
        "MLflow answers base again after 31 s: 240 kept metrics sent in order",
    ]


def test_the_console_says_an_outage_the_driver_sees_with_the_counts(capsys):
    from orchestrator.core import watch

    v = LiveView(total=3, steps={"base": 100}, default_steps=100, metric="final/val_loss", mode="min", every=1e9,
                 uri="http://tracking:5000")
    up = [False]

    def probe():
        if not up[0]:
            raise ConnectionRefusedError(111, "Connection refused")

    v.watch = watch.ServerWatch("http://tracking:5000", probe=probe)
    t = _trial("base")
    v.watch.check()
    v.on_step_end(0, [t])
    up[0] = True
    v.watch.check()
    v.on_step_end(0, [t])
    v.on_step_end(0, [t])
    v.watch.close()
    assert _lines(capsys) == [
        "MLflow at http://tracking:5000 unreachable from the driver (ConnectionRefusedError: [Errno 111] Connection "
        "refused); trials train on and keep what they log, a starting trial's run is created when it answers, an "
        "ending trial's is sent in the background (at most 1800 s: $LIME_TRACKING_WAIT_S) | 0/3 done, 1 running, "
        "2 pending",
        "MLflow at http://tracking:5000 answers again after 0 s; the trials send what they kept | 0/3 done, 1 running, "
        "2 pending",
    ]
    assert LiveView(total=1, steps={}, default_steps=1, metric="m/x", mode="min", uri="sqlite:///x.db").watch is None
