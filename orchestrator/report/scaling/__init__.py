"""The report's hook for the scaling analysis and the iso-FLOP comparison.

``build`` (called by ``orchestrator.report.build``) turns the finished trials into lines and
rungs (``rungs``), writes ``scaling.png`` when the sweep has a size axis, and returns the
markdown of both sections with the numbers the parent MLflow run gets as metrics (``log``):
``scaling/<variant>/E|A|alpha`` (and ``_ci_low``/``_ci_high``), ``.../N/...`` and ``.../ND/...``
for the fits against parameters, ``.../holdout_error(_pct)``, ``.../multiplier_at_max`` (with its
CI and compute), ``.../crossover_flops``, ``.../depth_match_layers``, ``.../depth_trend_per_doubling``
and ``isoflop/<variant>/<rung>/diff``. The plot reaches the parent run with the report's files
(artifact path ``report/``).

The iso-FLOP section is in every report whose runs log curves and FLOPs; the scaling section
only when some variant was trained at more than one size.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.core.fmt import slug
from orchestrator.report.render.figures import finished
from orchestrator.report.scaling import depth, fits, isoflop, markdown
from orchestrator.report.scaling.figure import plot_scaling
from orchestrator.report.scaling.rungs import build_lines, has_size_axis

__all__ = ["ScalingSection", "build", "log", "log_metrics"]
PLOT = "scaling.png"


@dataclass
class ScalingSection:
    lines: list[str] = field(default_factory=list)  # markdown: iso-FLOP, then scaling
    metrics: dict[str, float] = field(default_factory=dict)
    plot: str | None = None
    iso: dict[str, tuple[float, float]] = field(default_factory=dict)  # variant -> (metric at the budget, diff)


def build(df: pd.DataFrame, histories: Mapping[str, Any], metric: str, axis: str, baseline: Any, mode: str,
          factors: list[str], out_dir: Path, name: str, seed: int = 0,
          n_boot: int | None = None, margin: Any = None, verdicts: dict | None = None) -> ScalingSection:
    """The iso-FLOP and scaling sections of a report (see the module docstring); ``verdicts``:
    (variant, depth) -> the verdict of the report's per-depth table, quoted by the depth view."""
    n_boot = fits.N_BOOT if n_boot is None else n_boot
    lines = build_lines(finished(df), metric, axis, baseline, factors)
    out = ScalingSection()
    if not lines:
        return out
    rows = isoflop.iso_rows(lines, histories)
    out.lines += isoflop.section(rows, metric)
    if not has_size_axis(lines) and len({r.line.label for r in rows}) == len(rows):  # one rung per line
        for r in rows:
            if math.isfinite(r.base_mean) and (r.line.is_baseline or math.isfinite(r.diff)):
                out.iso[str(r.line.value)] = (r.base_mean + (0.0 if r.line.is_baseline else r.diff),
                                              0.0 if r.line.is_baseline else r.diff)
    for r in rows:
        if not r.line.is_baseline and math.isfinite(r.diff):
            key = f"isoflop/{slug(r.line.label)}" + (f"/{slug(r.rung)}" if r.rung else "")
            out.metrics[f"{key}/diff"] = r.diff
    if not has_size_axis(lines):
        return out
    s = fits.analyze(lines, mode, seed, n_boot)
    views = depth.depth_views(lines, mode) if depth.is_depth_ladder(lines) else []
    out.plot = plot_scaling(s, out_dir / PLOT, metric, f"{name}: {metric} scaling").name
    out.lines += markdown.section(s, views, metric, axis, out.plot, margin, verdicts)
    out.metrics.update(fits.metrics(s, slug))
    for v in views:
        pre = f"scaling/{slug(v.line.label)}"
        if v.match is not None:
            out.metrics[f"{pre}/depth_match_layers"] = float(v.match[0])
        if v.trend is not None and math.isfinite(v.trend):
            out.metrics[f"{pre}/depth_trend_per_doubling"] = v.trend
    return out


def log(cl, run_id: str | None, sec: ScalingSection) -> None:
    """The section's numbers as metrics of the parent run (step 0)."""
    log_metrics(cl, run_id, sec.metrics)


def log_metrics(cl, run_id: str | None, metrics: dict[str, float]) -> None:
    """Numbers as metrics of the parent run (step 0; NaN and infinite values are left out)."""
    if not run_id or not metrics:
        return
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    ms = [Metric(k, float(v), ts, 0) for k, v in sorted(metrics.items()) if math.isfinite(v)]
    for i in range(0, len(ms), 1000):  # MLflow's batch limit
        cl.log_batch(run_id, metrics=ms[i:i + 1000])
