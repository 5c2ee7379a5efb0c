"""What the driver's console says about a trial's attempts and its tracking server (issue 30),
from the results a trial reports: where a retried or resumed attempt continues, as the attempt
itself says, and when its MLflow server went away and came back. Ray's callbacks are called on
stand-in trials (the methods are plain Python; ``live_view`` only adds Ray's base class)."""
from __future__ import annotations

import types

from orchestrator.sweep.console import LiveView


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
    v.on_trial_recover(0, [t], t)
    v.on_trial_start(0, [t], t)
    v.on_trial_result(0, [t], t, {"step": 20, "start_step": 10, "resumed": 1})
    v.on_trial_result(0, [t], t, {"step": 30, "start_step": 10, "resumed": 1})  # said once per attempt
    bare = _trial("base", failures=1)
    v.on_trial_recover(0, [bare], bare)
    v.on_trial_start(0, [bare], bare)
    v.on_trial_result(0, [bare], bare, {"step": 10, "start_step": 0, "resumed": 0})
    assert _lines(capsys) == [
        "retry  base (failure 1 of 2 allowed): it has a checkpoint to continue from",
        "start  base (attempt 2)",
        "resume base: continues from its checkpoint at step 10",
        "retry  base (failure 1 of 2 allowed): no checkpoint yet: it starts over at step 0",
        "start  base (attempt 2)",
        "resume base: no checkpoint to continue from: starts over at step 0",
    ]


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
        "refused); training trials go on and keep their metrics, starting ones wait for it (at most 1800 s: "
        "$LIME_TRACKING_WAIT_S) | 0/3 done, 1 running, 2 pending",
        "MLflow at http://tracking:5000 answers again after 0 s; the trials send what they kept | 0/3 done, 1 running, "
        "2 pending",
    ]
    assert LiveView(total=1, steps={}, default_steps=1, metric="m/x", mode="min", uri="sqlite:///x.db").watch is None
