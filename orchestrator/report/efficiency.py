"""How well a sweep used its slots, for the report's compute section.

The **efficiency ratio** is ``sweep wall / (sum of trial wall / concurrent slots)``: the sweep's
wall time (the parent run's ``sweep/wall_s``: Ray Tune's run of the trials, summed over the
launches, Ray's own start not included) over the ideal, every slot busy with a trial all the
time. A trial's wall is its MLflow run's end - start (the compute table's wall time), so what a
trial spends before its run exists (a worker process's start, imports, data, model) counts as
lost time, as do Ray's scheduling and an unbalanced last wave. 1.00 is no loss.

The **start-up breakdown** is the median (and max and total) over the trials of each
``startup/<phase>_s`` metric the trials logged (``orchestrator.engine.startup`` describes the
phases; the last attempt's value for a retried trial), and ``trial/wall_s`` (every attempt's
time in its worker). Sweeps that logged none of these get no lines: their reports stay as they were.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from orchestrator.core import record
from orchestrator.core.fmt import num, table

PHASES = (
    ("process", "a fresh worker process's start: Ray's worker, the imports (0 in a reused worker)"),
    ("import", "of which importing torch, lime_arch and the orchestrator"),
    ("prepare", "resetting the process for the trial"),
    ("resume", "finding and loading the newest checkpoint (0 for a fresh start)"),
    ("mlflow", "MLflow client, experiment, run and params"),
    ("data", "building the data (0 when a reused worker has it)"),
    ("model", "model and optimizer"),
    ("to_first_step", "the trial's start (process start, or function entry in a reused worker) to its first step"),
)


@dataclass(frozen=True)
class Efficiency:
    sweep_wall_s: float
    trial_wall_s: float  # summed over the trials with a wall time
    trials: int
    slots: int
    launches: int
    ray_start_s: float  # the last launch's, nan when not logged

    @property
    def ideal_s(self) -> float:
        return self.trial_wall_s / self.slots

    @property
    def ratio(self) -> float:
        return self.sweep_wall_s / self.ideal_s


def _finite(values) -> np.ndarray:
    arr = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").to_numpy(dtype=float)
    return arr[np.isfinite(arr)]


def efficiency(df: pd.DataFrame, parent_metrics: dict[str, float]) -> Efficiency | None:
    """The ratio's numbers, None when the parent run has no sweep wall time or no trial a wall."""
    wall, slots = parent_metrics.get(record.SWEEP_WALL), parent_metrics.get(record.SLOTS)
    walls = _finite(df["wall_time_s"]) if "wall_time_s" in df.columns else np.zeros(0)
    if wall is None or not slots or not math.isfinite(wall) or not len(walls) or walls.sum() <= 0:
        return None
    pm = parent_metrics
    return Efficiency(float(wall), float(walls.sum()), len(walls), int(slots), int(pm.get(record.LAUNCHES, 1)),
                      float(pm.get(record.RAY_START, math.nan)))


def startup_rows(df: pd.DataFrame) -> list[list[str]]:
    """One row per start-up phase the trials logged: phase, what, trials, median, max, total (s)."""
    rows = []
    for phase, what in (*PHASES, ("trial wall", "every attempt's time in its worker (trial/wall_s)")):
        col = record.TRIAL_WALL if phase == "trial wall" else f"startup/{phase}_s"
        v = _finite(df[col]) if col in df.columns else np.zeros(0)
        if len(v):
            rows.append([phase, what, str(len(v)), num(float(np.median(v)), 3), num(float(v.max()), 3),
                         num(float(v.sum()), 4)])
    return rows


def lines(df: pd.DataFrame, parent_metrics: dict[str, float]) -> list[str]:
    """The compute section's efficiency paragraph and start-up table (nothing when neither was logged)."""
    eff, rows = efficiency(df, parent_metrics), startup_rows(df)
    out: list[str] = []
    if eff is not None:
        launches = f"{eff.launches} launches; a resumed sweep's numbers are approximate" if eff.launches > 1 \
            else "1 launch"
        ray = f", Ray's start ({num(eff.ray_start_s, 3)} s) not included" if math.isfinite(eff.ray_start_s) else ""
        out += ["", f"Sweep efficiency: {eff.sweep_wall_s:.1f} s of sweep wall time (Ray Tune's run of the trials, "
                f"{launches}{ray}) for {eff.trial_wall_s:.1f} s of trial wall time ({eff.trials} trials, as in the "
                f"table above) at {eff.slots} concurrent slot{'s' if eff.slots != 1 else ''}: the ideal is "
                f"{eff.ideal_s:.1f} s, so sweep wall / (sum of trial wall / slots) = **{eff.ratio:.2f}** (1.00: every "
                "slot busy with a trial's run all the time; what is above it went to starting workers and trials, "
                "Ray's scheduling and the last wave)."]
        first = _finite(df["startup/to_first_step_s"]) if "startup/to_first_step_s" in df.columns else np.zeros(0)
        if len(first) and eff.sweep_wall_s > eff.ideal_s:
            out[-1] += (f" Of the {eff.sweep_wall_s - eff.ideal_s:.1f} s above the ideal, the trials' start-up "
                        f"(sum of to_first_step / slots, below) accounts for about {first.sum() / eff.slots:.1f} s.")
    if rows:
        reused = _finite(df["startup/worker_trial"]) if "startup/worker_trial" in df.columns else np.zeros(0)
        out += ["", f"Start-up of the trials (seconds; {int((reused > 1).sum())} of {len(reused)} trials ran in a "
                "worker process that had run a trial before):", ""]
        out += table(["phase", "what", "trials", "median", "max", "total"], rows)
    return out
