"""Headless PNG plots of the representation diagnostics (see docs/ARCHITECTURE.md, "Analysis").

Figures are built on a bare ``matplotlib.figure.Figure`` (Agg canvas), never through pyplot, so
plotting neither needs a display nor touches global pyplot state shared with other threads.
The output bytes depend only on the inputs: the style is reset to matplotlib's defaults (a
user's matplotlibrc cannot leak in), the DPI is fixed, and the PNG metadata that would carry the
matplotlib version is dropped, so identical inputs give byte-identical files that sweep reports
can cache and diff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless; harmless if another backend was never going to be used here

import matplotlib.style  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

__all__ = ["plot_entropy", "plot_probe", "plot_router_map", "plot_expected_source"]

_DPI = 100


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # "Software" would embed the matplotlib version; dropping it keeps bytes stable.
    fig.savefig(out, format="png", dpi=_DPI, metadata={"Software": None})
    return out


def _mean_std_lines(
    by_variant: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    title: str,
    ylabel: str,
    ylim: tuple[float, float] | None,
) -> Path:
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(6.4, 4.2))
        ax = fig.add_subplot()
        for name, (mean, std) in by_variant.items():
            m = np.asarray(mean, dtype=np.float64)
            s = np.asarray(std, dtype=np.float64)
            layers = np.arange(len(m))
            (line,) = ax.plot(layers, m, marker="o", label=name)
            # Shaded band = +-1 std over sequences (entropy) or folds (probe).
            ax.fill_between(layers, m - s, m + s, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel("layer")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
        if by_variant:
            ax.legend()
        fig.tight_layout()
        return _save(fig, path)


def plot_entropy(
    by_variant: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    title: str = "Renyi entropy by layer",
) -> Path:
    """Entropy (mean +- std over sequences) by layer, one line per variant."""
    return _mean_std_lines(by_variant, path, title, "matrix Renyi entropy (nats)", None)


def plot_probe(
    by_variant: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    title: str = "Linear probe accuracy by layer",
) -> Path:
    """Probe accuracy (mean +- std over folds) by layer, one line per variant; y in [0, 1]."""
    return _mean_std_lines(by_variant, path, title, "probe accuracy", (0.0, 1.02))


def plot_router_map(source_map: Any, path: str | Path, title: str = "Router source map",
                    label: str = "normalized mean |weight|", vmax: float | None = 1.0) -> Path:
    """Heatmap of M[layer, source layer]: layer on y (layer 0 on top), source layer on x; ``vmax``
    None: the map's own maximum (a spread map)."""
    m = np.asarray(source_map, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"expected a 2-D (L, L) map, got shape {m.shape}")
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(5.6, 4.8))
        ax = fig.add_subplot()
        # Masked so NaN rows (all-zero routers) show as blank instead of a colormap extreme.
        image = ax.imshow(
            np.ma.masked_invalid(m), cmap="viridis", vmin=0.0,
            vmax=vmax if vmax is not None else max(float(np.nanmax(m)) if np.isfinite(m).any() else 1.0, 1e-12),
            origin="upper", aspect="auto", interpolation="nearest",
        )
        fig.colorbar(image, ax=ax, label=label)
        ax.set_xlabel("source layer")
        ax.set_ylabel("layer")
        ax.set_title(title)
        n_rows, n_cols = m.shape
        step = max(1, int(np.ceil(max(n_rows, n_cols) / 16)))
        ax.set_xticks(np.arange(0, n_cols, step))
        ax.set_yticks(np.arange(0, n_rows, step))
        if max(n_rows, n_cols) <= 12:  # numbers stay legible only on small maps
            for (row, col), value in np.ndenumerate(m):
                if np.isfinite(value) and col <= row:
                    top = vmax if vmax is not None else max(float(np.nanmax(m)), 1e-12)
                    ax.text(col, row, f"{value:.2f}", ha="center", va="center",
                            fontsize=7, color="white" if value < 0.6 * top else "black")
        fig.tight_layout()
        return _save(fig, path)


def plot_expected_source(
    by_variant: Mapping[str, Any],
    path: str | Path,
    title: str = "Expected retrieved source layer",
) -> Path:
    """Expected source layer by layer, one line per variant, with y = l as the reference."""
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(6.4, 4.2))
        ax = fig.add_subplot()
        n_layers = max((len(np.asarray(v)) for v in by_variant.values()), default=1)
        diag = np.arange(n_layers)
        # y = l is the no-routing baseline (every layer reads only itself).
        ax.plot(diag, diag, linestyle="--", color="0.5", label="current layer (y = l)")
        for name, values in by_variant.items():
            v = np.asarray(values, dtype=np.float64)
            ax.plot(np.arange(len(v)), v, marker="o", label=name)
        ax.set_xlabel("layer")
        ax.set_ylabel("expected source layer")
        ax.set_title(title)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        return _save(fig, path)
