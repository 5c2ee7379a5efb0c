"""The report's router-pruning section (the paper's Table 5, Sections 5.4 and 5.6), when trials
trained with ``model.router_prune``.

- **Counts** per cell, mean over its finished seeds of the trials' final metrics:
  ``final/pruned_weights`` of ``final/router_weights`` (``final/pruned_fraction``) and the source
  layers no head reads any more (``final/skipped_sources``): Table 5's layout.
- **What pruning costs and saves**: every pruned trial against its *twin*, the finished trial with
  the same router, seed and other factors (depth, width, ...) trained without pruning; per cell
  the paired differences pruned - twin of the report's metric (the loss cost) and of
  ``final/step_time_ms`` (the trial's median step time: the saving), each with the interval and
  verdict of ``orchestrator.decide`` (t ∪ sign-flip) at 95%. These are single comparisons at their
  own level; the report's all-pairs family (above) holds the same loss comparison with the
  family's correction.

The retrieval curves (Figure 9) are plots (``render/retrieval.py``). Torch-free: the runs frame
only.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from orchestrator.core.fmt import norm_value, same_value
from orchestrator.core.keys import FACTORS
from orchestrator.core.status import TrialStatus
from orchestrator.decide.verdict import verdict
from orchestrator.report.stats import rule

PRUNED = "final/pruned_weights"
COUNTS = (("final/pruned_weights", "pruned weights", "{:.0f}"), ("final/router_weights", "of", "{:.0f}"),
          ("final/pruned_fraction", "fraction", "{:.3f}"), ("final/skipped_sources", "source layers skipped", "{:.0f}"))
STEP = "final/step_time_ms"
LEVEL = 0.95


def _num(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def _finished(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"].map(lambda s: TrialStatus.parse(s) is TrialStatus.FINISHED)]


def _same(a, b) -> bool:
    a, b = norm_value(a), norm_value(b)
    return (a is None and b is None) or (a is not None and b is not None and same_value(a, b))


def _twin(df: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The unpruned trial with the same router, seed and other factors as ``row``."""
    factors = [c for c in (*FACTORS, "seed") if c in df.columns]
    keep = np.array([not math.isfinite(_num(v)) for v in df[PRUNED]], dtype=bool)
    for c in factors:
        keep &= np.array([_same(v, row[c]) for v in df[c]], dtype=bool)
    cand = df.loc[keep]
    return cand.iloc[0] if len(cand) else None


def _paired(d: list[float], mode: str = "min") -> str:
    if len(d) < 2:
        return f"{np.mean(d):+.4g} (n={len(d)}: not tested)" if d else "-"
    iv = rule.interval(np.array(d), LEVEL)
    lo, hi = ("-inf" if not math.isfinite(iv.low) else f"{iv.low:+.4g}"), (
        "inf" if not math.isfinite(iv.high) else f"{iv.high:+.4g}")
    return f"{np.mean(d):+.4g} [{lo}, {hi}] {verdict(iv, mode).word}"


def section(df: pd.DataFrame, labels: list[str], metric: str, mode: str) -> list[str]:
    """The markdown lines of the section; [] when no trial was pruned."""
    if PRUNED not in df.columns:
        return []
    fin = _finished(df)
    pruned = fin.loc[np.array([math.isfinite(_num(v)) for v in fin[PRUNED]], dtype=bool)]
    if pruned.empty:
        return []
    lines = ["", "## Router pruning (the paper's Table 5)", "",
             "Trained with `model.router_prune` (top-p masks of the router weights, `lime_arch/prune.py`). Counts at "
             "the end of training, mean over the finished seeds:", "",
             "| cell | n | " + " | ".join(c[1] for c in COUNTS) + " |", "|---|---:|" + "---:|" * len(COUNTS)]
    for lab in labels:
        part = pruned[pruned["_cell"] == lab]
        if part.empty:
            continue
        vals = [fmt.format(np.nanmean([_num(v) for v in part[k]])) if k in part.columns else "-"
                for k, _, fmt in COUNTS]
        lines.append(f"| {lab} | {len(part)} | " + " | ".join(vals) + " |")
    lines += ["", f"Each pruned trial against its twin (same router, seed and other factors, no pruning): the paired "
              f"differences pruned - twin, mean [{rule.label(LEVEL)} interval] and verdict of the pruned "
              f"trials (single comparisons; the all-pairs family above corrects the loss comparison for "
              f"multiplicity). Step time: `{STEP}`, the median step of a trial; ratio = pruned / twin.", "",
              f"| cell | twin | n | {metric} change | step time change ms | step time ratio |",
              "|---|---|---:|---|---|---:|"]
    for lab in labels:
        part = pruned[pruned["_cell"] == lab]
        if part.empty:
            continue
        dm, dt, ratio, twin_cells = [], [], [], set()
        for _, r in part.iterrows():
            t = _twin(fin, r)
            if t is None:
                continue
            twin_cells.add(t["_cell"])
            dm.append(_num(r[metric]) - _num(t[metric]))
            if STEP in fin.columns and math.isfinite(_num(r[STEP])) and math.isfinite(_num(t[STEP])):
                dt.append(_num(r[STEP]) - _num(t[STEP]))
                ratio.append(_num(r[STEP]) / _num(t[STEP]))
        if not dm:
            lines.append(f"| {lab} | (no unpruned twin) | 0 | - | - | - |")
            continue
        lines.append(f"| {lab} | {', '.join(sorted(twin_cells))} | {len(dm)} | {_paired(dm, mode)} | "
                     f"{_paired(dt, 'min')} | {np.mean(ratio):.3f} |" if ratio else
                     f"| {lab} | {', '.join(sorted(twin_cells))} | {len(dm)} | {_paired(dm, mode)} | - | - |")
    return lines + [""]
