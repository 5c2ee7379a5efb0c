"""The depth-only view of a fixed-width ladder (only ``n_layers`` changes between rungs): the
metric against depth per variant, the smallest depth at which a variant matches the baseline's
deepest model (the paper's "64-layer LIMe beats 128-layer LLaMA", arXiv 2502.09245 Figure 6),
and what the report's verdicts per depth say about the variant's advantage.

- Per depth, the difference variant - baseline is paired over the seeds both have, with the
  verdict rule's fixed-n interval at 95% (``orchestrator.report.stats.rule``, printed under its
  own name ``rule.LABEL``; the percentile bootstrap it replaced covered 75% at 3 seeds). It is one
  comparison at 95%, not the family-corrected verdict: the verdicts are the report's per-depth
  tables, and the sentences here quote them.
- "Reaches" compares a variant at depth d with the baseline at its deepest depth D (d <= D) over
  the seeds both have: at least as good by the mean, with that difference's interval. That
  comparison is no verdict of the report (no family, no correction), so the text says what its
  interval excludes and never "better"; "equivalent within the margin" only when a margin is set
  (``report.margin``) and the interval lies inside it; otherwise no match is claimed.
- The trend is the least-squares slope of the per-depth mean differences against log2(depth),
  descriptive only: no interval (a percentile bootstrap of 3-6 seeds per depth covers 75-86%).
  Whether the advantage grows with depth is not claimed from it; the text lists the verdicts per
  depth instead, and says "better at every depth" only when every depth's verdict is "better".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from orchestrator.core.fmt import num
from orchestrator.report.scaling.rungs import Line, Rung
from orchestrator.report.stats import rule

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
    beats: int | None = None  # smallest depth whose interval excludes the baseline's deepest being as good
    trend: float | None = None  # advantage per doubling (least squares, descriptive: no interval)
    notes: list[str] = field(default_factory=list)


def _depth(r: Rung) -> int | None:
    d = r.sizes.get("n_layers")
    return int(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def is_depth_ladder(lines: list[Line]) -> bool:
    """Rungs that differ in depth only (width, preset and steps fixed)."""
    rungs = [r for ln in lines for r in ln.rungs]
    return (any(len(ln.rungs) > 1 for ln in lines) and all(set(r.sizes) == {"n_layers"} for r in rungs)
            and all(_depth(r) is not None for r in rungs))


LEVEL = 0.95  # the depth view's intervals: one comparison each, not the family's level


def _paired(var: Rung, base: Rung) -> tuple[float, tuple[float, float], int]:
    shared = [s for s in var.values if s in base.values]
    if not shared:
        return math.nan, (math.nan, math.nan), 0
    d = np.array([var.values[s] - base.values[s] for s in shared], np.float64)
    iv = rule.interval(d, LEVEL)
    return float(d.mean()), (iv.low, iv.high), len(shared)


def _slope(depths: list[int], diffs: list[float]) -> float:
    x = np.log2(np.asarray(depths, np.float64))
    y = np.asarray(diffs, np.float64)
    ok = np.isfinite(y)
    if ok.sum() < 2 or np.ptp(x[ok]) == 0:
        return math.nan
    return float(np.polyfit(x[ok], y[ok], 1)[0])


def view(var: Line, base: Line, mode: str) -> DepthView:
    sign = 1.0 if mode == "min" else -1.0  # advantage = sign * (baseline - variant)
    by_b = {_depth(r): r for r in base.rungs}
    by_v = {_depth(r): r for r in var.rungs}
    depths = sorted(set(by_b) | set(by_v))
    rows = []
    for d in depths:
        row = DepthRow(d, by_b.get(d), by_v.get(d))
        if row.base is not None and row.var is not None:
            row.diff, row.ci, row.pairs = _paired(row.var, row.base)
        rows.append(row)
    deepest = max(by_b)
    out = DepthView(var, base, rows, deepest)
    top = by_b[deepest]
    for d in sorted(x for x in by_v if x <= deepest):
        r = by_v[d]
        diff, ci, _ = _paired(r, top)
        if not math.isfinite(diff):  # no seed in common: unpaired means, no interval
            diff, ci = r.mean - top.mean, (-math.inf, math.inf)
        if out.match is None and sign * diff <= 0:
            out.match = (d, diff, ci)
        if out.beats is None and (ci[1] < 0 if mode == "min" else ci[0] > 0):
            out.beats = d
    paired = [r for r in rows if r.pairs]
    if len(paired) >= 2:
        out.trend = -sign * _slope([r.depth for r in paired], [r.diff for r in paired])
    return out


def depth_views(lines: list[Line], mode: str) -> list[DepthView]:
    """One view per variant with a baseline line of the same other factors."""
    out = []
    for ln in lines:
        if ln.is_baseline:
            continue
        base = next((b for b in lines if b.is_baseline and b.rest == ln.rest), None)
        if base is not None and base.rungs and ln.rungs:
            out.append(view(ln, base, mode))
    return out


def _layers(d: int) -> str:
    return f"{d} layer" if d == 1 else f"{d} layers"


def statements(v: DepthView, metric: str, mode: str, margin=None, verdicts: dict | None = None) -> list[str]:
    """The view's findings in words (``margin``: ``orchestrator.decide.verdict.Margin`` or None;
    ``verdicts``: depth -> this variant's verdict in the report's per-depth table)."""
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
            noise = "the interval excludes 0 (one comparison at 95%, not one of the report's verdicts)"
        elif m is not None and -m < ci[0] and ci[1] < m:
            noise = f"equivalent within the margin +-{num(m, 3)}"
        elif m is None:
            noise = "the interval holds 0 and no margin (`report.margin`) is set: no match is claimed"
        else:
            noise = f"the interval holds 0 but is not inside the margin +-{num(m, 3)}: not decided"
        lines.append(f"`{var}` reaches `{base}`'s {d_max}-layer {metric} ({num(top.mean, 4)}) by the mean {where}: "
                     f"{num(top.mean + diff, 4)}, difference {num(diff, 3)} ({rule.label(LEVEL)} interval "
                     f"[{num(ci[0], 3)}, {num(ci[1], 3)}]; {noise}).")
        if v.beats is not None:
            lines.append(f"The smallest depth at which `{var}`'s difference to `{base}` at {d_max} layers has a "
                         f"{rule.label(LEVEL)} interval excluding 0 (one comparison, uncorrected): "
                         f"{_layers(v.beats)}.")
        else:
            lines.append(f"At no depth does `{var}`'s difference to `{base}` at {d_max} layers have a "
                         f"{rule.label(LEVEL)} interval excluding 0.")
    if v.trend is not None:
        lines.append(trend_text(v, metric, verdicts))
    return lines


def trend_text(v: DepthView, metric: str, verdicts: dict | None) -> str:
    """The verdicts per depth, and the slope as a description: "better at every depth" only when
    every paired depth's verdict is "better" (worse alike); nothing is said to grow or shrink."""
    var, base = v.line.label, v.base.label
    depths = [r.depth for r in v.rows if r.pairs]
    said = {d: verdicts[d] for d in depths if verdicts and d in verdicts}
    if said:
        each = "; ".join(f"{_layers(d)}: {said[d]}" for d in depths if d in said)
        kinds = set(said.values())
        whole = (f" `{var}` is {kinds.pop()} than `{base}` at every depth by the verdicts."
                 if len(said) == len(depths) and kinds in ({"better"}, {"worse"}) else "")
        head = f"The report's verdicts of `{var}` against `{base}` per depth: {each}.{whole}"
    else:
        head = f"No verdict of `{var}` against `{base}` per depth is in this report."
    return (f"{head} The least-squares slope of `{var}`'s advantage in {metric} on log2 depth is "
            f"{num(v.trend, 3)} per doubling (positive = a larger advantage at greater depth); it is descriptive, "
            "with no interval, and no trend is claimed from it.")
