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

from orchestrator.core.status import TrialStatus
from orchestrator.sweep.runs import RAY_DONE, RAY_ERROR
from orchestrator.sweep.spec import SweepSpec, trial_dirname
from orchestrator.sweep.view import fmt_time as _fmt_time


class TrialNamer:
    """Trial name (= the sweep's trial id) and folder from the trial's config.

    Grid: ``router=full,seed=2``. Search: ``sample=3,lr=0.00123,router=full,seed=1`` where the
    sample number comes from Ray's trial counter (each sample runs ``repeat`` seeds)."""

    def __init__(self, spec: SweepSpec, dirname: bool = False):
        self.spec, self.dirname = spec, dirname

    def name(self, trial) -> str:
        spec, cfg = self.spec, trial.config
        if spec.search is None:
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
    The methods are Ray Tune's callback hooks (``ray.tune.Callback``)."""

    def __init__(self, *, total: int, steps: dict[str, int], default_steps: int, metric: str, mode: str,
                 every: float = 15.0):
        self.total, self.steps, self.default_steps = total, dict(steps), default_steps
        self.metric, self.mode, self.every = metric, mode, every
        self.setup()

    def setup(self, **info) -> None:  # also called by Ray at the start of every (resumed) run
        self.t0 = time.monotonic()
        self.t_first: float | None = None  # the first trial start: the ETA's clock
        self.last_line = 0.0
        self.progress: dict[str, int] = {}  # trial -> latest step
        self.start_step: dict[str, int] = {}  # trial -> first step seen in this session
        self.current: dict[str, float] = {}
        self.best: tuple[float, str] | None = None
        self.final_status: dict[str, str] = {}  # trial -> Ray status at the end of the run

    # -- helpers -----------------------------------------------------------------------------------
    def _say(self, msg: str) -> None:
        print(f"[{_fmt_time(time.monotonic() - self.t0):>6}] {msg}", file=sys.stdout, flush=True)

    def _counts(self, trials) -> str:
        by: dict[str, int] = {}
        for t in trials:
            by[t.status] = by.get(t.status, 0) + 1
        done = by.get(RAY_DONE, 0)
        parts = [f"{done}/{self.total} done", f"{by.get('RUNNING', 0)} running"]
        pending = max(0, self.total - sum(by.values())) + by.get("PENDING", 0) + by.get("PAUSED", 0)
        parts.append(f"{pending} pending")
        if by.get(RAY_ERROR):
            parts.append(f"{by[RAY_ERROR]} failed")
        return ", ".join(parts)

    def _eta(self, trials) -> str:
        done_now = sum(max(0, s - self.start_step.get(n, s)) for n, s in self.progress.items())
        elapsed = time.monotonic() - (self.t_first or self.t0)
        if done_now <= 0 or elapsed <= 0:
            return "?"
        names = {str(t) for t in trials}
        remaining = 0
        for t in trials:
            n = str(t)
            if t.status in (RAY_DONE, RAY_ERROR):
                continue
            remaining += max(0, self.steps.get(n, self.default_steps) - self.progress.get(n, 0))
        remaining += max(0, self.total - len(names)) * self.default_steps
        return _fmt_time(remaining / (done_now / elapsed))

    def _status(self, trials, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_line < self.every:
            return
        self.last_line = now
        running = [str(t) for t in trials if t.status == "RUNNING"]
        cur = "; ".join(f"{n} step {self.progress.get(n, 0)}/{self.steps.get(n, self.default_steps)}"
                        + (f" loss {self.current[n]:.4g}" if n in self.current else "")
                        for n in running[:4])
        if len(running) > 4:
            cur += f"; +{len(running) - 4} more"
        best = f" | best {self.metric} {self.best[0]:.4g} ({self.best[1]})" if self.best else ""
        self._say(f"{self._counts(trials)}{best} | ETA {self._eta(trials)}" + (f" | {cur}" if cur else ""))

    # -- Ray callbacks -----------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info):
        n = str(trial)
        if self.t_first is None:
            self.t_first = time.monotonic()
        self._say(f"start  {n}" + (f" (from step {self.progress[n]})" if self.progress.get(n) else ""))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        n = str(trial)
        step = int(result.get("step", 0) or 0)
        if n not in self.start_step:
            self.start_step[n] = int(result.get("start_step", step) or 0)
        self.progress[n] = step
        for k in ("val/loss", "train/loss"):
            v = result.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.current[n] = v
                break
        self._status(trials)

    def on_trial_complete(self, iteration, trials, trial, **info):
        n = str(trial)
        r = trial.last_result or {}
        v = r.get(self.metric)
        status = r.get("status", TrialStatus.FINISHED.value)
        if status == TrialStatus.RUNNING.value:
            status = "stopped early"
        if isinstance(v, (int, float)) and math.isfinite(v):
            better = self.best is None or (v < self.best[0] if self.mode == "min" else v > self.best[0])
            if better:
                self.best = (v, n)
        val = f"{self.metric} {v:.4g}" if isinstance(v, (int, float)) else f"{self.metric} -"
        self._say(f"done   {n}: {status}, {val}, MLflow run {r.get('run_id', '?')}")
        self._status(trials, force=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._say(f"retry  {trial} (failure {trial.run_metadata.num_failures}); continues from its checkpoint")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._say(f"FAILED {trial} after {trial.run_metadata.num_failures} failure(s); see "
                  f"{trial.path}/trial.log and error.txt")
        self._status(trials, force=True)

    def on_experiment_end(self, trials, **info):
        self.final_status = {str(t): t.status for t in trials}
        self._status(trials, force=True)
