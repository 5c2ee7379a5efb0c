"""The final metric read off a trial's curve: the mean of its last k evaluations (``report.final_evals``).

A trial's ``final/val_loss`` is its last validation; one spike landing on that step decides it (the
default sweep's ``full`` seed 0: +0.3 nats at step 200 from one flip of a byte bigram). With
``report.final_evals: k`` (k > 1) the report reads, for a metric ``final/<name>`` whose per-step
history ``val/<name>`` the report loads (``runs.HISTORY_KEYS``: ``val/loss``), the mean of the
last k values of that history, the final evaluation included (it is logged as ``val/loss`` at the
last step too), in place of the last value. k = 1 (the default) is the last evaluation, as before.
A trial with fewer than k evaluations gives the mean of those it has; one without the history
keeps its last value; the report says both.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

FINAL, CURVE = "final/", "val/"


def history_key(metric: str) -> str | None:
    """The per-step history a final metric is the last value of (``final/val_loss`` -> ``val/loss``)."""
    if not metric.startswith(FINAL) or not metric[len(FINAL):].startswith("val_"):
        return None
    return CURVE + metric[len(FINAL) + len("val_"):]


def last_k_mean(steps: np.ndarray, values: np.ndarray, k: int) -> float:
    """The mean of the values at the last ``k`` steps (all of them when there are fewer); NaN if none."""
    if not len(values):
        return math.nan
    order = np.argsort(steps, kind="stable")
    return float(np.mean(np.asarray(values, dtype=np.float64)[order][-k:]))


def apply_final_evals(frame: pd.DataFrame, histories: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
                      metric: str, k: int) -> list[str]:
    """Replace ``frame[metric]`` by the mean of each trial's last ``k`` evaluations (k > 1); the
    notes the report shows. ``histories``: run id -> key -> (steps, values) (``runs.SweepRuns``)."""
    if k <= 1 or metric not in frame.columns:
        return []
    key = history_key(metric)
    if key is None:
        return [f"report.final_evals={k} applies to a final/val_* metric with a logged curve; {metric} is the "
                "last value"]
    short, missing = [], []
    values = []
    for _, row in frame.iterrows():
        steps, vals = histories.get(row["run_id"], {}).get(key, (np.zeros(0), np.zeros(0)))
        if not len(vals) or pd.isna(row[metric]):
            missing.append(str(row["trial_id"]))
            values.append(row[metric])
            continue
        if len(vals) < k:
            short.append(str(row["trial_id"]))
        values.append(last_k_mean(steps, vals, k))
    frame[metric] = pd.Series(values, index=frame.index, dtype=np.float64)
    notes = [f"{metric} is the mean of each trial's last {k} evaluations of {key} (report.final_evals), "
             "the final one included"]
    if short:
        notes.append(f"{len(short)} trial(s) had fewer than {k} evaluations (the mean of those they have): "
                     + ", ".join(short[:8]) + (" ..." if len(short) > 8 else ""))
    if missing:
        notes.append(f"{len(missing)} trial(s) without a {key} curve keep their last value: "
                     + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
    return notes
