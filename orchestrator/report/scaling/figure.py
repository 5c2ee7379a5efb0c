"""The scaling plot of a report: the metric against training compute per variant (seeds, rung
means, the fit with its bootstrap 95% band), against parameters when that fit exists, and the
effective compute multiplier of each variant against C with its band.

Same rules as ``orchestrator.report.render.figures`` (a bare Agg ``Figure``, the default style, fixed DPI,
no PNG metadata): the same analysis gives the same bytes.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.style  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from orchestrator.report.render.figures import _color, _save  # noqa: E402
from orchestrator.report.scaling.fits import Fit, Scaling, quantiles  # noqa: E402
from orchestrator.report.scaling.laws import multiplier  # noqa: E402

__all__ = ["plot_scaling"]


def _log_x(ax, ticks=()) -> None:
    """Log x axis with ticks at the given values (the first line's rungs): a ladder often spans
    less than a decade, where the decades alone leave the axis unlabelled."""
    ax.set_xscale("log")
    ticks = sorted({float(t) for t in ticks if np.isfinite(t) and t > 0})
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:.2g}" for t in ticks], rotation=30, fontsize=7)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _band(fit: Fit, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    preds = np.array([b.predict(grid) for b in fit.boot if b is not None])  # (resamples, grid)
    if not len(preds):
        return np.full_like(grid, np.nan), np.full_like(grid, np.nan)
    lo = np.quantile(preds, 0.025, axis=0, method="inverted_cdf")
    hi = np.quantile(preds, 0.975, axis=0, method="inverted_cdf")
    return lo, hi


def _panel(ax, s: Scaling, kind: str, col: str, xlabel: str, metric: str) -> None:
    for i, res in enumerate(s.lines):
        color, ln = _color(i), res.line
        xs = np.array([r.get(col) for r in ln.rungs])
        for r in ln.rungs:
            v = r.array()
            ax.scatter(np.full(len(v), r.get(col)), v, color=color, s=8, alpha=0.45, linewidths=0)
        means = np.array([r.mean for r in ln.rungs])
        fit = res.fits.get(kind)
        ok = fit is not None and fit.law is not None and np.all(np.isfinite(xs))
        ax.plot(xs, means, "o" if ok else "o--", color=color, markersize=4, linewidth=0.8,
                label=ln.label if ok else f"{ln.label} (no fit)")
        if ok:
            grid = np.geomspace(xs.min() / 1.3, xs.max() * 1.3, 120)
            ax.plot(grid, fit.law.predict(grid), color=color, linewidth=1.4)
            lo, hi = _band(fit, grid)
            ax.fill_between(grid, lo, hi, color=color, alpha=0.2, linewidth=0)
    _log_x(ax, [r.get(col) for r in s.lines[0].line.rungs] if s.lines else ())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def _multiplier_panel(ax, s: Scaling) -> None:
    drawn = False
    index = {id(res.line): i for i, res in enumerate(s.lines)}
    fits = {id(res.line): res.fits["C"] for res in s.lines}
    for v in s.versus:
        if v.reason or not v.at:
            continue
        fv, fb = fits[id(v.line)], fits[id(v.base)]
        cs = np.array([c for _, c, *_ in v.at])
        grid = np.geomspace(cs.min(), cs.max(), 60)
        m = np.array([multiplier(fb.law, fv.law, c) for c in grid])
        pairs = [(b, x) for b, x in zip(fb.boot, fv.boot) if b is not None and x is not None]
        band = np.array([quantiles([multiplier(b, x, c) for b, x in pairs]) for c in grid])
        color = _color(index[id(v.line)])
        finite = np.isfinite(m)
        ax.plot(grid[finite], m[finite], color=color, linewidth=1.4, label=f"{v.line.label} vs {v.base.label}")
        lo, hi = band[:, 0], np.where(np.isfinite(band[:, 1]), band[:, 1], np.nan)
        ax.fill_between(grid, lo, hi, color=color, alpha=0.2, linewidth=0)
        ax.scatter(cs, [x[2] if math.isfinite(x[2]) else np.nan for x in v.at], color=color, s=14, zorder=3)
        drawn = True
    ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle=":")
    _log_x(ax, [c for v in s.versus[:1] for _, c, *_ in v.at])
    ax.set_xlabel("training FLOPs C")
    ax.set_ylabel("effective compute multiplier")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no identifiable pair of fits", ha="center", va="center", transform=ax.transAxes)


def plot_scaling(s: Scaling, path: str | Path, metric: str, title: str) -> Path:
    with_n = any("N" in res.fits for res in s.lines)
    cols = 3 if with_n else 2
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(5.2 * cols, 4.4))
        axes = fig.subplots(1, cols, squeeze=False)[0]
        _panel(axes[0], s, "C", "c", "training FLOPs C (3 x forward)", metric)
        axes[0].set_title("against compute", fontsize=9)
        if with_n:
            _panel(axes[1], s, "N", "n", "parameters N", metric)
            axes[1].set_title("against parameters (fixed tokens)", fontsize=9)
        _multiplier_panel(axes[-1], s)
        axes[-1].set_title("multiplier vs baseline (band: 95% bootstrap)", fontsize=9)
        fig.suptitle(title, fontsize=10)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.17, top=0.86, wspace=0.28)
        return _save(fig, path)
