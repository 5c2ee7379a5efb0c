"""The depth-only view of a fixed-width ladder (only ``n_layers`` changes between rungs): the
metric against depth per variant, the smallest depth at which a variant matches the baseline's
deepest model (the paper's "64-layer LIMe beats 128-layer LLaMA", arXiv 2502.09245 Figure 6),
and whether the variant's advantage grows with depth.

- Per depth, the difference variant - baseline is paired over the seeds both have, with the
  report's paired 95% interval (``orchestrator.decide.intervals.paired_interval``: Student's t and
  the inverted sign-flip test, which covers at the shipped seed counts; the percentile bootstrap it
  replaced covered 75% at 3 seeds).
- "Reaches" compares a variant at depth d with the baseline at its deepest depth D (d <= D) over
  the seeds both have: at least as good by the mean. It is "better beyond noise" when that
  difference's interval excludes 0, and "equivalent within the margin" only when a margin is set
  (``report.margin``) and the interval lies inside it; otherwise no match is claimed.
- The trend is the least-squares slope of the per-depth mean differences against log2(depth):
  the change of the advantage per doubling of depth, with a percentile-bootstrap interval of the
  seeds resampled within each depth (the same draws as the fits; at 3-6 seeds per depth a
  percentile bootstrap under-covers: 75-86% for a mean, ``tests/orchestrator/decide``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.fmt import num
from orchestrator.decide import rule
from orchestrator.report.scaling.fits import quantiles
from orchestrator.report.scaling.rungs import Line, Rung

__all__ = ["DepthRow", "DepthView", "depth_views", "is_depth_ladder"]


@dataclass
class DepthRow:
    depth: int
    base: Rung | None
    var: Rung | None
    diff: float = math.nan  # mean over shared seeds of variant - baseline
    ci: tuple[float, float] = (math.nan, math.nan)
    pairs: int = 0


@dataclass
class DepthView:
    line: Line
    base: Line
    rows: list[DepthRow]
    deepest: int  # the baseline's deepest depth
    match: tuple[int, float, tuple[float, float]] | None = None  # depth, diff vs deepest baseline, CI
    beats: int | None = None  # smallest depth whose CI excludes the baseline's deepest being as good
    trend: tuple[float, tuple[float, float]] | None = None  # advantage per doubling, CI
    notes: list[str] = field(default_factory=list)


def _depth(r: Rung) -> int | None:
    d = r.sizes.get("n_layers")
    return int(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def is_depth_ladder(lines: list[Line]) -> bool:
    """Rungs that differ in depth only (width, preset and steps fixed)."""
    rungs = [r for ln in lines for r in ln.rungs]
    return (any(len(ln.rungs) > 1 for ln in lines) and all(set(r.sizes) == {"n_layers"} for r in rungs)
            and all(_depth(r) is not None for r in rungs))


def _paired(var: Rung, base: Rung, samples: list[dict]) -> tuple[float, tuple[float, float], int, list[float]]:
    shared = [s for s in var.values if s in base.values]
    if not shared:
        return math.nan, (math.nan, math.nan), 0, [math.nan] * len(samples)
    d = np.array([var.values[s] - base.values[s] for s in shared], np.float64)
    diff = float(d.mean())
    iv = rule.decide(d, 0.95, "min").interval  # the verdict rule's interval (median), as every report's
    boot = []
    for draw in samples:
        seeds = [s for s in draw.get(var.key, []) if s in shared]
        boot.append(float(np.mean([var.values[s] - base.values[s] for s in seeds])) if seeds else math.nan)
    return diff, (iv.low, iv.high), len(shared), boot


def _slope(depths: list[int], diffs: list[float]) -> float:
    x = np.log2(np.asarray(depths, np.float64))
    y = np.asarray(diffs, np.float64)
    ok = np.isfinite(y)
    if ok.sum() < 2 or np.ptp(x[ok]) == 0:
        return math.nan
    return float(np.polyfit(x[ok], y[ok], 1)[0])


def view(var: Line, base: Line, samples: list[dict], mode: str) -> DepthView:
    sign = 1.0 if mode == "min" else -1.0  # advantage = sign * (baseline - variant)
    by_b = {_depth(r): r for r in base.rungs}
    by_v = {_depth(r): r for r in var.rungs}
    depths = sorted(set(by_b) | set(by_v))
    rows, boots = [], {}
    for d in depths:
        row = DepthRow(d, by_b.get(d), by_v.get(d))
        if row.base is not None and row.var is not None:
            row.diff, row.ci, row.pairs, boots[d] = _paired(row.var, row.base, samples)
        rows.append(row)
    deepest = max(by_b)
    out = DepthView(var, base, rows, deepest)
    top = by_b[deepest]
    for d in sorted(x for x in by_v if x <= deepest):
        r = by_v[d]
        diff, ci, _, _ = _paired(r, top, [])
        if not math.isfinite(diff):  # no seed in common: unpaired means, no interval
            diff, ci = r.mean - top.mean, (-math.inf, math.inf)
        if out.match is None and sign * diff <= 0:
            out.match = (d, diff, ci)
        if out.beats is None and (ci[1] < 0 if mode == "min" else ci[0] > 0):
            out.beats = d
    paired_depths = [d for d in depths if d in boots]
    if len(paired_depths) >= 2:
        slope = -sign * _slope(paired_depths, [next(r.diff for r in rows if r.depth == d) for d in paired_depths])
        sl_boot = [-sign * _slope(paired_depths, [boots[d][i] for d in paired_depths]) for i in range(len(samples))]
        out.trend = (slope, quantiles(sl_boot))
    return out


def depth_views(lines: list[Line], samples: list[dict], mode: str) -> list[DepthView]:
    """One view per variant with a baseline line of the same other factors."""
    out = []
    for ln in lines:
        if ln.is_baseline:
            continue
        base = next((b for b in lines if b.is_baseline and b.rest == ln.rest), None)
        if base is not None and base.rungs and ln.rungs:
            out.append(view(ln, base, samples, mode))
    return out


def _layers(d: int) -> str:
    return f"{d} layer" if d == 1 else f"{d} layers"


def statements(v: DepthView, metric: str, mode: str, margin=None) -> list[str]:
    """The view's findings in words (``margin``: ``orchestrator.decide.verdict.Margin`` or None)."""
    base, var, d_max = v.base.label, v.line.label, v.deepest
    top = next(r.base for r in v.rows if r.depth == d_max)
    lines = []
    if v.match is None:
        best = min((r for r in v.rows if r.var is not None and r.depth <= d_max),
                   key=lambda r: r.var.mean * (1 if mode == "min" else -1), default=None)
        tail = f"; its best is {num(best.var.mean, 4)} at {_layers(best.depth)}" if best else ""
        lines.append(f"`{var}` does not reach `{base}`'s {d_max}-layer {metric} ({num(top.mean, 4)}) at any "
                     f"depth up to {d_max}{tail}.")
    else:
        d, diff, ci = v.match
        where = "at the same depth only" if d == d_max else f"at {_layers(d)} ({d_max / d:g}x shallower)"
        m = margin.absolute(top.mean) if margin is not None else None
        if not ci[0] <= 0 <= ci[1]:
            noise = "better beyond noise"
        elif m is not None and -m < ci[0] and ci[1] < m:
            noise = f"equivalent within the margin +-{num(m, 3)}"
        elif m is None:
            noise = "the interval holds 0 and no margin (`report.margin`) is set: no match is claimed"
        else:
            noise = f"the interval holds 0 but is not inside the margin +-{num(m, 3)}: not decided"
        lines.append(f"`{var}` reaches `{base}`'s {d_max}-layer {metric} ({num(top.mean, 4)}) by the mean {where}: "
                     f"{num(top.mean + diff, 4)}, difference {num(diff, 3)} (paired 95% interval [{num(ci[0], 3)}, "
                     f"{num(ci[1], 3)}]; {noise}).")
        if v.beats is not None:
            lines.append(f"The smallest depth at which `{var}` is better than `{base}` at {d_max} layers beyond "
                         f"noise (interval excluding 0): {_layers(v.beats)}.")
        else:
            lines.append(f"At no depth is `{var}` better than `{base}` at {d_max} layers beyond noise.")
    if v.trend is not None:
        slope, (lo, hi) = v.trend
        if lo > 0:
            word = "grows"
        elif hi < 0:
            word = "shrinks"
        else:
            word = "shows no detectable trend"
        lines.append(f"`{var}`'s advantage over `{base}` in {metric} {word} with depth: {num(slope, 3)} per "
                     f"doubling of depth (least squares on log2 depth, percentile-bootstrap 95% CI over seeds within "
                     f"each depth [{num(lo, 3)}, {num(hi, 3)}]; positive = a larger advantage at greater depth).")
    return lines
