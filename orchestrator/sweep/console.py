"""What the driver shows Ray and the console: the readable trial names and the compact live
view (instead of Ray's full table on every refresh).

Both are stored in Ray's experiment state (``tuner.pkl``) and come back on ``Tuner.restore``, so
they keep only plain values and reset their run-time state in ``setup``. Importing this module
does not import Ray (every ``lime sweep`` command imports it): Ray requires its callbacks to be
``ray.tune.Callback`` subclasses, so ``live_view`` makes that subclass of ``LiveView`` on first use.
"""
from __future__ import annotations

import functools
import math
import sys
import time
from typing import Any

from orchestrator.core.outbox import BUFFERED, HANDED_OFF, LAST_KEPT, LAST_OUTAGE_S, OUTAGE_S
from orchestrator.core.status import TrialStatus
from orchestrator.core.watch import ServerWatch
from orchestrator.sweep.mlflow_runs import CONFIG_ERROR, OWN_ERROR, RAY_DONE, RAY_ERROR, RESUMED
from orchestrator.sweep.spec import SweepSpec, trial_dirname
from orchestrator.sweep.view import fmt_time as _fmt_time

# a trial whose worker (process or node) is lost is retried without spending its retries, this
# many times at most in one launch: a trial that kills its own process each time still ends
LOST_RETRIES_ENV, LOST_RETRIES = "LIME_LOST_WORKER_RETRIES", 10


class TrialNamer:
    """Trial name (= the sweep's trial id) and folder from the trial's config.

    Grid: ``router=full,seed=2``. Search: ``sample=3,lr=0.00123,router=full,seed=1`` where the
    sample number comes from Ray's trial counter (each sample runs ``repeat`` seeds)."""

    def __init__(self, spec: SweepSpec, dirname: bool = False):
        self.spec, self.dirname = spec, dirname

    def name(self, trial) -> str:
        spec, cfg = self.spec, trial.config
        if spec.search is None:
            if not all(a in cfg for a in spec.grid):  # Ray may name a trial before its config is resolved
                return getattr(trial, "custom_trial_name", None) or str(trial.trial_id)
            return spec.trial_id({a: cfg[a] for a in spec.grid})
        s = spec.search
        try:
            counter = int(str(trial.experiment_tag).split("_", 1)[0])
        except ValueError:
            counter = 1
        sample = (counter - 1) // s.repeat
        seed = spec.seed_of(int(cfg.get("__trial_index__", 0)))
        vals = ",".join(f"{a}={_short(cfg[a])}" for a in s.space)
        return f"sample={sample},{vals},seed={seed}"

    def __call__(self, trial) -> str:
        n = self.name(trial)
        return trial_dirname(n) if self.dirname else n


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def live_view(**kwargs: Any) -> LiveView:
    """A ``LiveView`` that Ray accepts as a callback."""
    return _ray_live_view()(**kwargs)


@functools.cache
def _ray_live_view() -> type:
    from ray import tune

    return type("RayLiveView", (LiveView, tune.Callback), {"__module__": __name__})


class LiveView:
    """One line per state change, and a status line at most every ``every`` seconds:
    trials by state, the running trials' current step and loss, the best finished trial, ETA.
    The methods are Ray Tune's callback hooks (``ray.tune.Callback``).

    Ray calls ``on_trial_complete`` and ``on_trial_error`` before it changes the trial's status,
    so the view keeps its own record of the trials that ended: the counts printed with a "done"
    line include that trial. The ETA (``Eta``) comes from measured step rates only.

    Retries: Ray retries every failure (``FailureConfig(max_failures=-1)``) unless the view has set
    the trial's ``max_failures`` to 0 before it: an attempt that fails on its own error reports it
    first (``OWN_ERROR``), and only those spend the sweep's ``max_failures`` (``retries``); a failure
    with no such report is a lost worker or node, retried in the same launch up to ``lost_retries``
    times (``$LIME_LOST_WORKER_RETRIES``)."""

    def __init__(self, *, total: int, steps: dict[str, int], default_steps: int, metric: str, mode: str,
                 every: float = 15.0, uri: str = "", retries: int = 2, lost_retries: int = LOST_RETRIES):
        self.total, self.steps, self.default_steps = total, dict(steps), default_steps
        self.metric, self.mode, self.every = metric, mode, every
        self.retries, self.lost_retries = retries, lost_retries  # a trial's own errors, its lost workers
        # an MLflow server: watched from the driver too (``core.watch.ServerWatch``), so an outage is said
        # within seconds even while no trial reports (a starting trial reports at its first log point)
        self.watch = ServerWatch(uri) if uri.startswith(("http://", "https://")) else None
        # trials that ended during an outage, their runs sent by a background sender: over every Ray
        # experiment this view watches (a grown sweep's), which the driver waits for before its summary
        self.handed_off: set[str] = set()
        self.setup()

    def setup(self, **info) -> None:  # also called by Ray at the start of every (resumed) run
        self.t0 = time.monotonic()
        self.last_line = 0.0
        self.last_status = ""  # the last status line printed (the same line is not printed twice)
        self.progress: dict[str, int] = {}  # trial -> latest step
        self.current: dict[str, float] = {}
        self.best: tuple[float, str] | None = None
        self.ended: dict[str, str] = {}  # trial -> Ray status it ended with in this session
        self.config_failed: set[str] = set()  # trials that failed on a config mistake (not retried)
        self.eta = Eta()
        self.final_status: dict[str, str] = {}  # trial -> Ray status at the end of the run
        self.reported: set[str] = set()  # trials whose running attempt has reported
        self.away: dict[str, float] = {}  # trials whose MLflow server is unreachable -> outage seconds
        self.own: dict[str, int] = {}  # trial -> attempts that failed on an error of their own (this launch)
        self.lost: dict[str, int] = {}  # trial -> attempts whose worker or node was lost (this launch)
        self.failing: dict[str, str] = {}  # trial -> its running attempt's own error, reported before it raises

    # -- helpers -----------------------------------------------------------------------------------
    def _say(self, msg: str) -> None:
        print(f"[{_fmt_time(time.monotonic() - self.t0):>6}] {msg}", file=sys.stdout, flush=True)

    def _state(self, t) -> str:
        return self.ended.get(str(t), t.status)

    def _counts(self, trials) -> str:
        by: dict[str, int] = {}
        for t in trials:
            by[self._state(t)] = by.get(self._state(t), 0) + 1
        done = by.get(RAY_DONE, 0)
        parts = [f"{done}/{self.total} done", f"{by.get('RUNNING', 0)} running"]
        pending = max(0, self.total - sum(by.values())) + by.get("PENDING", 0) + by.get("PAUSED", 0)
        parts.append(f"{pending} pending")
        if by.get(RAY_ERROR):
            parts.append(f"{by[RAY_ERROR]} failed")
        return ", ".join(parts)

    def _eta(self, trials) -> str:
        running = {str(t): self.steps.get(str(t), self.default_steps) for t in trials if self._state(t) == "RUNNING"}
        waiting = sum(1 for t in trials if self._state(t) in ("PENDING", "PAUSED"))
        waiting += max(0, self.total - len(trials))
        if not running and not waiting:
            return ""
        left = self.eta.remaining(running, self.progress, waiting * [self.default_steps])
        return "" if left is None else f" | ETA {_fmt_time(left)}"

    def _status(self, trials, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_line < self.every:
            return
        running = [str(t) for t in trials if self._state(t) == "RUNNING"]
        cur = "; ".join(f"{n} step {self.progress.get(n, 0)}/{self.steps.get(n, self.default_steps)}"
                        + (f" loss {self.current[n]:.4g}" if n in self.current else "")
                        for n in running[:4])
        if len(running) > 4:
            cur += f"; +{len(running) - 4} more"
        best = f" | best {self.metric} {self.best[0]:.4g} ({self.best[1]})" if self.best else ""
        line = f"{self._counts(trials)}{best}{self._eta(trials)}" + (f" | {cur}" if cur else "")
        if line == self.last_status:
            return
        self.last_line, self.last_status = now, line
        self._say(line)

    # -- Ray callbacks -----------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info):
        n = str(trial)
        self.ended.pop(n, None)
        self.reported.discard(n)
        self.failing.pop(n, None)
        self.eta.start(n, self.progress.get(n, 0))
        # Ray retries every failure; the view decides, before each one, whether it ends the trial
        # (``max_failures`` 0) or not (-1): only the trial's own errors spend its retries
        if n not in self.config_failed:
            trial.max_failures = -1 if self.lost.get(n, 0) < self.lost_retries else 0
        failures = getattr(getattr(trial, "run_metadata", None), "num_failures", 0) or 0
        self._say(f"start  {n}" + (f" (attempt {failures + 1})" if failures else ""))

    def _attempt_line(self, n: str, trial, result: dict) -> None:
        """The first report of an attempt says where it continues (the attempt's own word)."""
        if n in self.reported or RESUMED not in result:
            return
        self.reported.add(n)
        start = int(result.get("start_step", 0) or 0)
        failures = getattr(getattr(trial, "run_metadata", None), "num_failures", 0) or 0
        if result[RESUMED] == 1:
            self._say(f"resume {n}: continues from its checkpoint at step {start}")
        elif result[RESUMED] == -1 or failures > 0 or n in self.progress:
            self._say(f"resume {n}: no checkpoint to continue from: starts over at step 0")

    def _tracking_line(self, n: str, result: dict) -> None:
        """Say when a trial's MLflow server goes away and comes back (the trial keeps training)."""
        away = result.get(OUTAGE_S)
        if not isinstance(away, (int, float)):
            return
        if away > 0 and n not in self.away:
            self._say(f"MLflow unreachable from {n} for {away:.0f} s: it keeps training and keeps its metrics "
                      f"({int(result.get(BUFFERED, 0))} so far) until the server answers")
        elif away <= 0 and n in self.away:
            last = result.get(LAST_OUTAGE_S)
            lasted = f" after {last:.0f} s" if isinstance(last, (int, float)) else ""
            self._say(f"MLflow answers {n} again{lasted}: {int(result.get(LAST_KEPT, 0))} kept metrics sent in order")
        if away > 0:
            self.away[n] = float(away)
        else:
            self.away.pop(n, None)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        n = str(trial)
        if result.get(OWN_ERROR):  # the attempt raises next: its own error, which spends a retry
            self.failing[n] = str(result[OWN_ERROR])
            self.own[n] = self.own.get(n, 0) + 1
            trial.max_failures = -1 if self.own[n] <= self.retries else 0
            return
        if result.get(CONFIG_ERROR):  # retrying cannot fix the config: the trial fails when it raises
            trial.max_failures = 0
            self.config_failed.add(n)
            self._say(f"FAILED {n}: {result[CONFIG_ERROR]} (not retried; traceback in {trial.path}/trial.log)")
            return
        self._attempt_line(n, trial, result)
        self._tracking_line(n, result)
        step = int(result.get("step", 0) or 0)
        self.progress[n] = step
        clock = result.get("time_total_s")
        self.eta.report(n, step, clock=float(clock) if isinstance(clock, (int, float)) else None)
        for k in ("val/loss", "train/loss"):
            v = result.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.current[n] = v
                break
        self._status(trials)

    def on_trial_complete(self, iteration, trials, trial, **info):
        n = str(trial)
        self.ended[n] = RAY_DONE
        self.eta.end(n)
        r = trial.last_result or {}
        if r.get(HANDED_OFF):
            self.handed_off.add(n)
        v = r.get(self.metric)
        status = r.get("status", TrialStatus.FINISHED.value)
        if status == TrialStatus.RUNNING.value:
            status = "stopped early"
        if isinstance(v, (int, float)) and math.isfinite(v):
            better = self.best is None or (v < self.best[0] if self.mode == "min" else v > self.best[0])
            if better:
                self.best = (v, n)
        val = f"{self.metric} {v:.4g}" if isinstance(v, (int, float)) else f"{self.metric} -"
        rid = r.get("run_id") or ("not created yet: a background sender creates it when the server answers"
                                  if r.get(HANDED_OFF) else "?")
        self._say(f"done   {n}: {status}, {val}, MLflow run {rid}")
        self._status(trials, force=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        n = str(trial)
        has = getattr(trial, "checkpoint", None) is not None
        where = "it has a checkpoint to continue from" if has else "no checkpoint yet: it starts over at step 0"
        if n in self.failing:
            self._say(f"retry  {n} (its error {self.own[n]} of {self.retries} allowed: {self.failing.pop(n)}): {where}")
            return
        self.lost[n] = self.lost.get(n, 0) + 1
        self._say(f"retry  {n}: its worker was lost (a killed process or node; {self.lost[n]} of {self.lost_retries} "
                  f"allowed, ${LOST_RETRIES_ENV}), no retry of its {self.retries} spent: {where}")

    def on_trial_error(self, iteration, trials, trial, **info):
        n = str(trial)
        self.ended[n] = RAY_ERROR
        self.eta.end(n)
        where = f"see {trial.path}/trial.log and error.txt"
        if n in self.failing:
            self._say(f"FAILED {n} after {self.own[n]} error(s) of its own ({self.retries} retries allowed): "
                      f"{self.failing.pop(n)}; {where}")
        elif n not in self.config_failed:  # that one said why already
            self._say(f"FAILED {n}: its worker was lost {self.lost.get(n, 0) + 1} times (${LOST_RETRIES_ENV}="
                      f"{self.lost_retries}); {where}")
        self._status(trials, force=True)

    def on_step_end(self, iteration, trials, **info):
        """Ray's controller loop: the driver's watch of the MLflow server, with the trials' counts."""
        if self.watch is None:
            return
        line = self.watch.start().news()
        if line:
            self._say(f"{line} | {self._counts(trials)}")

    def on_experiment_end(self, trials, **info):
        if self.watch is not None:
            self.watch.close()
        self.final_status = {str(t): self._state(t) for t in trials}
        self._status(trials, force=True)  # printed only if it differs from the last status line


class Eta:
    """Time left from measured step rates only: nothing until a trial has reported twice.

    A trial's rate is its seconds per step between its first and latest report in this session,
    on the trial's own clock (Ray's ``time_total_s``: the driver may receive several reports at
    once); a trial not yet started costs the median start-up time seen (from its start to its
    first report, less the steps in between) plus its steps at the median rate. The work left is
    shared by as many trials as have run at once."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[float, int]] = {}  # trial -> (driver time, step) at its start
        self.first: dict[str, tuple[float, int]] = {}  # (trial clock, step) of its first report
        self.seen: dict[str, float] = {}  # driver time of its latest report
        self.rates: dict[str, float] = {}  # seconds per step, measured
        self.startup: dict[str, float] = {}  # seconds from start to the first step
        self.width = 1  # the most trials seen running at once

    def start(self, n: str, step: int, now: float | None = None) -> None:
        self.started[n] = (time.monotonic() if now is None else now, step)
        self.first.pop(n, None)
        self.width = max(self.width, len(self.started))

    def report(self, n: str, step: int, now: float | None = None, clock: float | None = None) -> None:
        """A report of trial ``n`` at ``step``: ``now`` the driver's time, ``clock`` the trial's."""
        now = time.monotonic() if now is None else now
        clock = now if clock is None else clock
        self.seen[n] = now
        if n not in self.first:
            self.first[n] = (clock, step)
            if n in self.started:
                self.startup[n] = max(0.0, now - self.started[n][0])  # corrected by the rate below
            return
        t0, s0 = self.first[n]
        if step > s0 and clock > t0:
            self.rates[n] = (clock - t0) / (step - s0)
            if n in self.started:
                before = s0 - self.started[n][1]  # steps trained before the first report
                self.startup[n] = max(0.0, self.startup.get(n, 0.0) - before * self.rates[n])

    def end(self, n: str) -> None:
        self.started.pop(n, None)

    def remaining(self, running: dict[str, int], progress: dict[str, int], waiting: list[int],
                  now: float | None = None) -> float | None:
        """Seconds left: ``running`` maps trial -> its total steps, ``waiting`` lists the steps of
        the trials not started; None while no rate has been measured."""
        if not self.rates:
            return None
        now = time.monotonic() if now is None else now
        per_step = sorted(self.rates.values())[len(self.rates) // 2]
        startup = sorted(self.startup.values())[len(self.startup) // 2] if self.startup else 0.0
        ahead = []
        for n, total in running.items():
            left = max(0, total - progress.get(n, 0)) * self.rates.get(n, per_step)
            if n in self.seen:  # the time since its last report is spent already
                left = max(0.0, left - (now - self.seen[n]))
            elif n in self.started:  # not reported yet: still starting
                left += max(0.0, startup - (now - self.started[n][0]))
            ahead.append(left)
        queued = sum(startup + steps * per_step for steps in waiting)
        lanes = max(self.width, len(running), 1)
        return max(max(ahead, default=0.0), (sum(ahead) + queued) / lanes)


def launch_note(saved: dict[str, str], total: int, stale: int) -> str:
    """What the start line says about an earlier launch: trials its Ray experiment finished, and
    the runs it left running (closed now). Nothing when no earlier launch ran a trial."""
    if not saved and not stale:
        return ""
    done = sum(1 for st in saved.values() if st == RAY_DONE)
    parts = [f"resuming: {done}/{total} trials done"] if saved else []
    if stale:
        parts.append(f"{stale} run(s) an interrupted launch left running marked killed")
    return "; " + ", ".join(parts)
