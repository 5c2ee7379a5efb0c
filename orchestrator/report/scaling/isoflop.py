"""Iso-FLOP comparison: every variant's loss at the baseline's final training-FLOP budget.

A variant that costs more per step (a router adds FLOPs) has trained on more compute by its last
step than the baseline; comparing final losses favours it. Here each variant's validation-loss
curve, against cumulative training FLOPs (step x 3 x forward FLOPs/token x tokens/step, the x axis
of the report's loss-curve plot), is read at the baseline's final budget: linearly in log-FLOPs
between the two evaluations that bracket it, seed by seed. The budget is the baseline's median
final FLOPs at the same rung (model size and training length) and other factors.

A variant whose run ends before the budget (cheaper per step) would need an extrapolation; its
cell says how far it got instead. Differences are paired by seed: the mean change, with the verdict
rule's fixed-n interval at 95% of the median change (``orchestrator.report.stats.rule``, the one
every report section prints; the percentile bootstrap of seeds used here before covered 75-89% at
the shipped seed counts).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.core.fmt import num, pct, sci, table
from orchestrator.report.scaling.rungs import Line, Rung
from orchestrator.report.stats import rule

__all__ = ["CURVE", "IsoRow", "at_budget", "iso_rows", "section"]
CURVE = "val/loss"
History = Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]
LEVEL = 0.95  # one comparison per row, descriptive: not a verdict's family level


def at_budget(steps, values, flops_per_step: float, budget: float) -> tuple[float, tuple[float, float]]:
    """(value at ``budget`` FLOPs, the steps of the two evaluations around it), linear in
    log-FLOPs; NaN when the curve does not cover the budget (relative tolerance 1e-9)."""
    s, v = np.asarray(steps, np.float64), np.asarray(values, np.float64)
    ok = np.isfinite(v) & (s > 0)
    s, v = s[ok], v[ok]
    if not len(s) or not (flops_per_step > 0) or not math.isfinite(budget):
        return math.nan, (math.nan, math.nan)
    x = s * flops_per_step
    tol = 1e-9 * budget
    if budget < x[0] - tol or budget > x[-1] + tol:
        return math.nan, (math.nan, math.nan)
    lb = math.log(min(max(budget, x[0]), x[-1]))
    i = int(np.searchsorted(np.log(x), lb))
    lo, hi = max(i - 1, 0), min(i, len(x) - 1)
    return float(np.interp(lb, np.log(x), v)), (float(s[lo]), float(s[hi]))


@dataclass
class IsoRow:
    rung: str
    line: Line
    budget: float  # the baseline's final training FLOPs at this rung
    fps_ratio: float  # the variant's FLOPs per step / the baseline's
    values: dict[Any, float] = field(default_factory=dict)  # seed -> val/loss at the budget
    bracket: tuple[float, float] = (math.nan, math.nan)  # evaluation steps around the budget
    reached: float = math.nan  # share of the budget the variant's runs reached (median)
    final: float = math.nan  # the variant's own final val/loss (mean)
    diff: float = math.nan  # paired over seeds: variant - baseline at the budget
    ci: tuple[float, float] = (math.nan, math.nan)
    base_mean: float = math.nan


def _curve(histories: History, run_id: str) -> tuple[np.ndarray, np.ndarray] | None:
    h = histories.get(run_id, {}).get(CURVE)
    return h if h is not None and len(h[0]) else None


def _fps(r: Rung) -> float:
    v = [f for _, f in r.runs.values() if math.isfinite(f) and f > 0]
    return float(np.median(v)) if v else math.nan


def _row(label: str, ln: Line, vr: Rung, br: Rung, histories: History) -> IsoRow:
    ends = [x for rid, f in br.runs.values() if math.isfinite(x := _final_x(histories, rid, f))]
    budget = float(np.median(ends)) if ends else math.nan
    row = IsoRow(label, ln, budget, _fps(vr) / _fps(br))
    finals, reached = [], []
    for seed, (rid, fps) in vr.runs.items():
        curve = _curve(histories, rid)
        if curve is None:
            continue
        finals.append(float(curve[1][-1]))
        reached.append(_final_x(histories, rid, fps) / budget)
        val, bracket = at_budget(curve[0], curve[1], fps, budget)
        if math.isfinite(val):
            row.values[seed] = val
            row.bracket = bracket if math.isnan(row.bracket[0]) else row.bracket
    row.final = float(np.mean(finals)) if finals else math.nan
    row.reached = float(np.median(reached)) if reached else math.nan
    base_vals = {s: float(c[1][-1]) for s, (rid, _) in br.runs.items() if (c := _curve(histories, rid)) is not None}
    row.base_mean = float(np.mean(list(base_vals.values()))) if base_vals else math.nan
    shared = [s for s in row.values if s in base_vals]
    if shared and not ln.is_baseline:
        d = np.array([row.values[s] - base_vals[s] for s in shared], np.float64)
        row.diff = float(d.mean())
        iv = rule.interval(d, LEVEL)
        row.ci = (iv.low, iv.high)
    return row


def _final_x(histories: History, run_id: str, fps: float) -> float:
    c = _curve(histories, run_id)
    return float(c[0][-1]) * fps if c is not None and math.isfinite(fps) else math.nan


def iso_rows(lines: list[Line], histories: History) -> list[IsoRow]:
    """One row per line and rung that its baseline line also has, baseline rows included."""
    rows = []
    multi = any(len(ln.rungs) > 1 for ln in lines)
    for ln in lines:
        base = next((b for b in lines if b.is_baseline and b.rest == ln.rest), None)
        if base is None:
            continue
        for vr in ln.rungs:
            br = base.rung(vr.key)
            if br is None or not math.isfinite(_fps(br)) or not any(_curve(histories, r) for r, _ in br.runs.values()):
                continue
            rows.append(_row(vr.label if multi else "", ln, vr, br, histories))
    order = {id(ln): i for i, ln in enumerate(lines)}
    # by rung (in the baseline's compute order), then line
    rung_order = {r.label: i for ln in lines if ln.is_baseline for i, r in enumerate(ln.rungs)}
    return sorted(rows, key=lambda r: (rung_order.get(r.rung, 0), order[id(r.line)]))


def section(rows: list[IsoRow], metric: str) -> list[str]:
    """The markdown of the iso-FLOP comparison (nothing when no variant has a FLOPs curve)."""
    if not any(not r.line.is_baseline for r in rows):
        return []
    multi = any(r.rung for r in rows)
    head = (["rung"] if multi else []) + ["variant", "FLOPs/step vs baseline", "baseline budget (FLOPs)",
                                          f"{CURVE} at budget", f"change vs baseline (paired, {rule.label(LEVEL)})",
                                          "between steps", f"own final {CURVE}"]
    body = []
    for r in rows:
        arr = np.array(list(r.values.values()), np.float64)
        if len(arr):
            sd = f" ± {num(arr.std(ddof=1), 3)}" if len(arr) > 1 else ""
            at = f"{num(arr.mean(), 5)}{sd} (n={len(arr)})"
        else:
            at = f"- (its runs end at {num(100 * r.reached, 3)}% of the budget)"
        if r.line.is_baseline:
            change = "(baseline)"
        elif math.isfinite(r.diff):
            change = (f"{num(r.diff, 3)} ({pct(100 * r.diff / r.base_mean)}), "
                      f"[{num(r.ci[0], 3)}, {num(r.ci[1], 3)}]")
        else:
            change = "-"
        steps = "-" if math.isnan(r.bracket[0]) else f"{r.bracket[0]:g}-{r.bracket[1]:g}"
        body.append(([r.rung] if multi else []) + [r.line.label, pct(100 * (r.fps_ratio - 1)), sci(r.budget), at,
                                                   change, steps, num(r.final, 5)])
    note = [] if metric == f"final/{CURVE}" else [
        "", f"The curves are `{CURVE}`, the one evaluation curve every trial logs; the report's metric is "
            f"`{metric}`."]
    return (["", "## Iso-FLOP comparison", "",
             "Each variant's validation loss at the baseline's final training-FLOP budget (the baseline's "
             "median over seeds at the same rung), read off its own curve against cumulative training FLOPs "
             "(step x 3 x forward FLOPs/token x tokens/step; the right column of the loss-curve plot), linearly "
             "in log-FLOPs between the evaluations that bracket the budget. A variant that costs more per step "
             "is compared here before its last step, at equal compute; one whose runs end before the budget is "
             "not extrapolated. Changes are paired by seed: the mean change, and the verdicts' fixed-n interval "
             f"({rule.label(LEVEL)}: of the median change) of each row alone: no family correction, and no "
             "verdict.", ""]
            + table(head, body) + note)
