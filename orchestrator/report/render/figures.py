"""PNG plots of a sweep report: loss curves, per-seed final metric, metric against depth, router
heatmaps, the spread maps of token-dependent routers and the retrieval curves of Figure 9
(``render/retrieval.py``); ``make_plots`` draws all of them from the report's runs frame.

Same rules as ``orchestrator.analysis.plots`` (whose router heatmap the report reuses): a bare
``Figure`` on the Agg canvas (no pyplot, no display, no global state), matplotlib's default style
(a user's matplotlibrc cannot leak in), a fixed DPI and no "Software" PNG metadata, so the same
inputs give byte-identical files. Colors follow the order of the variants passed in, so one
variant has the same color in every figure of a report.
"""
from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.style  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from orchestrator.analysis.metrics import router_source_map  # noqa: E402
from orchestrator.analysis.plots import plot_router_map  # noqa: E402
from orchestrator.core.fmt import cell_text, norm_value, order_key, same_value, slug, to_float  # noqa: E402
from orchestrator.core.status import TrialStatus  # noqa: E402
from orchestrator.core.tracking import quiet_downloads  # noqa: E402
from orchestrator.report.render.retrieval import retrieval_plots, spread_plots  # noqa: E402

__all__ = ["Curve", "aggregate_curves", "plot_curves", "plot_final", "plot_depth",
           "router_map_from_npz", "mean_router_map", "router_maps", "make_plots", "finished"]
CURVE_KEYS = ("train/loss", "val/loss")

_DPI = 100
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")

# One run's curve: steps, values, and FLOPs per step (nan when unknown).
Curve = tuple[np.ndarray, np.ndarray, float]


def finished(df):
    """The rows of trials that finished (the samples of the statistics)."""
    return df[df["status"].map(lambda s: TrialStatus.parse(s) is TrialStatus.FINISHED)]


# ------------------------------------------------------------------ plots

def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=_DPI, metadata={"Software": None})
    return out


def aggregate_curves(runs: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over runs at every step any run logged (union of steps).

    A run contributes only at the steps it has; a step logged by one run only has min = max.
    Returns (steps, mean, lo, hi).
    """
    steps = np.unique(np.concatenate([np.asarray(s, np.float64) for s, _, _ in runs]))
    grid = np.full((len(runs), len(steps)), np.nan)
    for i, (s, v, _) in enumerate(runs):
        grid[i, np.searchsorted(steps, np.asarray(s, np.float64))] = np.asarray(v, np.float64)
    grid[~np.isfinite(grid)] = np.nan
    keep = ~np.all(np.isnan(grid), axis=0)
    grid, steps = grid[:, keep], steps[keep]
    return steps, np.nanmean(grid, axis=0), np.nanmin(grid, axis=0), np.nanmax(grid, axis=0)


def plot_curves(curves: Mapping[str, Mapping[str, Sequence[Curve]]], path: str | Path,
                title: str) -> Path | None:
    """One row per metric key (e.g. train/loss, val/loss), columns: by step and by FLOPs.

    ``curves[key][label]`` lists the runs of one variant; the line is their mean, the band their
    min-max. The FLOPs axis is step x (3 x FLOPs/token x tokens/step) of the variant (median over
    its runs). Returns None when there is nothing to draw.
    """
    keys = [k for k, by_label in curves.items() if any(len(r) for r in by_label.values())]
    if not keys:
        return None
    labels = list(dict.fromkeys(lab for k in keys for lab in curves[k]))
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(11.0, 3.8 * len(keys)))
        axes = fig.subplots(len(keys), 2, squeeze=False)
        for row, key in enumerate(keys):
            _curve_row(axes[row], key, curves[key], labels)
        fig.suptitle(title, fontsize=10)
        # Fixed margins: tight_layout would lay out every tick label once more (slow, same look).
        fig.subplots_adjust(left=0.07, right=0.97, bottom=0.45 / (3.8 * len(keys)) + 0.06,
                            top=1 - 0.5 / (3.8 * len(keys)), hspace=0.35, wspace=0.22)
        return _save(fig, path)


def _curve_row(axes_row, key: str, by_label: Mapping[str, Sequence[Curve]], labels: list[str]) -> None:
    """One metric of ``plot_curves``: by step on the left, by training FLOPs on the right."""
    ax_step, ax_flop = axes_row
    any_flops = False
    for label, runs in by_label.items():
        runs = [r for r in runs if len(r[0])]
        if not runs:
            continue
        color = _color(labels.index(label))
        steps, mean, lo, hi = aggregate_curves(runs)
        name = f"{label} (n={len(runs)})"
        # markers on sparse curves (e.g. a few evaluations), where a line alone can vanish
        mk = {"marker": "o", "markersize": 3} if len(steps) <= 30 else {}
        ax_step.plot(steps, mean, color=color, label=name, linewidth=1.4, **mk)
        ax_step.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
        per_step = float(np.median([r[2] for r in runs]))
        if np.isfinite(per_step) and per_step > 0:
            any_flops = True
            x = steps * per_step
            ax_flop.plot(x, mean, color=color, label=name, linewidth=1.4, **mk)
            ax_flop.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
    ax_step.set_xlabel("step")
    ax_flop.set_xlabel("training FLOPs (3 x forward)")
    for ax in (ax_step, ax_flop):
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
    if any_flops:
        ax_flop.set_xscale("log")
    else:
        ax_flop.text(0.5, 0.5, "no model/flops_per_token logged", ha="center",
                     va="center", transform=ax_flop.transAxes)
    ax_step.legend(fontsize=7)
    ax_step.set_title(f"{key}: mean, band = min-max over seeds", fontsize=9)


def plot_final(values: Mapping[str, Sequence[tuple[object, float]]], path: str | Path,
               metric: str, title: str) -> Path:
    """Box plot per variant with every seed as a labelled point (x offsets fixed, not random)."""
    labels = list(values)
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(max(5.0, 1.3 * len(labels) + 2.0), 4.4))
        ax = fig.add_subplot()
        for i, label in enumerate(labels):
            pts = [(s, float(v)) for s, v in values[label] if np.isfinite(v)]
            if not pts:
                continue
            ys = np.array([v for _, v in pts])
            if len(ys) > 1:
                ax.boxplot([ys], positions=[i], widths=0.5, showfliers=False,
                           medianprops={"color": _color(i)})
            offsets = np.linspace(-0.15, 0.15, len(pts)) if len(pts) > 1 else np.zeros(1)
            ax.scatter(i + offsets, ys, color=_color(i), s=22, zorder=3)
            for dx, (s, v) in zip(offsets, pts):
                ax.annotate(str(s), (i + dx, v), xytext=(3, 2), textcoords="offset points",
                            fontsize=6, color="0.3")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20 if len(labels) > 4 else 0, ha="right"
                           if len(labels) > 4 else "center", fontsize=8)
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_ylabel(metric)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        return _save(fig, path)


def plot_depth(series: Mapping[str, Mapping[float, Sequence[float]]], path: str | Path,
               metric: str, title: str, xlabel: str = "n_layers") -> Path:
    """Metric against depth: one line per variant, mean with +-1 std error bars over seeds."""
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(6.4, 4.4))
        ax = fig.add_subplot()
        depths_all: list[float] = []
        for i, (label, by_depth) in enumerate(series.items()):
            pts = [(float(d), np.asarray([x for x in v if np.isfinite(x)], np.float64))
                   for d, v in sorted(by_depth.items())]
            pts = [(d, v) for d, v in pts if len(v)]
            if not pts:
                continue
            d = np.array([p[0] for p in pts])
            m = np.array([p[1].mean() for p in pts])
            s = np.array([p[1].std(ddof=1) if len(p[1]) > 1 else 0.0 for p in pts])
            depths_all += list(d)
            ax.errorbar(d, m, yerr=s, color=_color(i), marker="o", capsize=3, label=label)
        if depths_all and min(depths_all) > 0 and max(depths_all) / min(depths_all) >= 4:
            ax.set_xscale("log", base=2)
        if depths_all:
            ticks = sorted(set(depths_all))
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=8)
        fig.tight_layout()
        return _save(fig, path)


# ------------------------------------------------------------------ router maps

def router_map_from_npz(path: str | Path, n_kv_heads: int | None = None) -> np.ndarray:
    """The (L, L) normalized mean-|w| source map of one run's ``router_weights.npz``.

    R (KV heads) is read off layer 0's (R, R) matrix; ``n_kv_heads`` only when layer 0 is absent.
    """
    with np.load(path) as z:
        layers = sorted((k for k in z.files if k.startswith("layer_")), key=lambda k: int(k[6:]))
        dense = {int(k[6:]): z[k] for k in layers}
    if not dense or sorted(dense) != list(range(len(dense))):
        raise ValueError(f"expected arrays layer_0 .. layer_<L-1>, got {layers}")
    r = int(dense[0].shape[0]) if 0 in dense else int(n_kv_heads or 0)
    # Layer 0 never has router parameters: it reads only its own K/V.
    return router_source_map([None] + [dense[l] for l in range(1, len(dense))], r)


def mean_router_map(maps: Sequence[np.ndarray]) -> np.ndarray:
    """Mean over seeds of per-run maps (NaN rows of an all-zero router are skipped)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.stack(maps), axis=0)


def router_maps(cl, runs_by_label: Mapping[str, Sequence[str]]
                ) -> tuple[dict[str, tuple[np.ndarray, int]], list[str]]:
    """label -> (mean map over the label's runs, number of runs), plus notes on missing files."""
    out, notes = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for lab, run_ids in runs_by_label.items():
            maps, missing, why = [], 0, ""
            for rid in run_ids:
                try:
                    with quiet_downloads():
                        p = cl.download_artifacts(rid, "router_weights.npz", str(Path(tmp) / rid))
                    m = router_map_from_npz(p)
                except Exception as e:  # noqa: BLE001 - a run without the artifact is only noted
                    missing += 1
                    # no temporary paths in the text: the report must not change between runs
                    msg = (str(e).splitlines() or [""])[0].replace(tmp, "<download>")
                    why = why or f"{type(e).__name__}: {msg}"
                    continue
                if maps and m.shape != maps[0].shape:
                    notes.append(f"{lab}: run {rid} has a router of another depth; left out")
                    continue
                maps.append(m)
            if missing:
                notes.append(f"{lab}: {missing} finished run(s) without a readable "
                             f"router_weights.npz ({why[:160]})")
            if maps:
                out[lab] = (mean_router_map(maps), len(maps))
    return out, notes


# ------------------------------------------------------------------ all plots of a report

def make_plots(cl, df, histories: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]],
               labels: Sequence[str], metric: str, axis: str, axis_order: Sequence[Any],
               out_dir: Path, name: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Draw every plot of a report from the runs frame (one row per trial, ``_cell`` = label).

    Returns ([(caption, file name)], notes) in a fixed order.
    """
    plots: list[tuple[str, str]] = []
    fin = finished(df)
    cells = {lab: fin[fin["_cell"] == lab] for lab in labels}
    if plot_curves(_curves(cells, histories), out_dir / "loss_curves.png", f"{name}: loss curves (finished trials)"):
        plots.append(("Loss curves by step and by training FLOPs (mean, band = min-max over seeds)",
                      "loss_curves.png"))

    values = {lab: sorted(((norm_value(s), to_float(v)) for s, v in zip(part["seed"], part[metric])),
                          key=lambda p: (order_key(p[0]), p[1]))
              for lab, part in cells.items()}
    plot_final(values, out_dir / "final_metric.png", metric, f"{name}: {metric} per seed")
    plots.append((f"{metric} per seed (box over seeds, points labelled by seed)", "final_metric.png"))

    if "n_layers" in df.columns and len({str(norm_value(v)) for v in df["n_layers"]}) > 1:
        plot_depth(_depth_series(df, fin, metric, axis, axis_order), out_dir / "depth.png", metric,
                   f"{name}: {metric} against depth")
        plots.append((f"{metric} against depth (mean ± std over seeds)", "depth.png"))

    runs = {lab: list(part["run_id"]) for lab, part in cells.items()}
    maps, notes = router_maps(cl, runs)
    for lab in labels:
        if lab in maps:
            m, n = maps[lab]
            fname = f"router_{slug(lab)}.png"
            plot_router_map(m, out_dir / fname, title=f"{lab}: mean |w| by source layer (n={n})")
            plots.append((f"Router source map of {lab} (mean over {n} seed(s))", fname))
    plots += spread_plots(cl, runs, labels, out_dir)  # token-dependent routers: their spread over tokens
    plots += retrieval_plots(maps, labels, out_dir, name)  # the paper's Figure 9 curves
    return plots, notes


def _curves(cells: Mapping[str, Any], histories: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]
            ) -> dict[str, dict[str, list[Curve]]]:
    """key -> cell label -> the curves of the cell's finished runs (cells without any left out)."""
    curves: dict[str, dict[str, list[Curve]]] = {}
    for key in CURVE_KEYS:
        by = {}
        for lab, part in cells.items():
            runs = [(h[0], h[1], to_float(fps)) for rid, fps in zip(part["run_id"], part["flops_per_step"])
                    if (h := histories.get(rid, {}).get(key)) is not None and len(h[0])]
            if runs:
                by[lab] = runs
        if by:
            curves[key] = by
    return curves


def _depth_series(df, fin, metric: str, axis: str, axis_order: Sequence[Any]
                  ) -> dict[str, dict[float, list[float]]]:
    """One line per value of the axis (per router when depth is the axis; one line without a
    router column): depth -> the metric of each finished seed."""
    line_by = axis if axis != "n_layers" else ("router" if "router" in df.columns else None)
    keys: list[Any] = [None]
    if line_by == axis:
        keys = list(axis_order)
    elif line_by is not None:
        keys = sorted({norm_value(v) for v in fin[line_by]}, key=order_key)
    series: dict[str, dict[float, list[float]]] = {}
    for k in keys:
        part = fin if k is None else fin[fin[line_by].map(lambda v, k=k: same_value(v, k))]
        by_depth: dict[float, list[float]] = {}
        for d, v in zip(part["n_layers"], part[metric]):
            if norm_value(d) is not None:
                by_depth.setdefault(float(d), []).append(to_float(v))
        series["all" if k is None else cell_text(k)] = by_depth
    return series
