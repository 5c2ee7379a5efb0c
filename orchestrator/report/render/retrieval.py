"""Router plots beside the source maps: the retrieval statistics of the paper's Figure 9, and the
spread over tokens of a token-dependent router's map (arXiv 2502.09245, Figures 2-3 and 9).

From a cell's mean source map M (rows: layer l, columns: source layer s, each row summing to 1):

- **retrieval from later layers** of layer s: the mean over the later layers l > s of M[l, s], the
  weight the layers above put on s (several peaks: separate information streams);
- **self-retrieval** of layer l: M[l, l], the weight a layer puts on its own K/V.

One figure per depth (cells of the same number of layers share it). The spread maps come from the
``router_spread.npz`` artifacts that token-dependent routers write (``orchestrator.engine.hooks``):
the standard deviation over validation tokens of the per-token source map, averaged over a cell's
seeds. Same rules as the other report figures: a bare ``Figure``, fixed style and DPI, no PNG
metadata.
"""
from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.style  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from orchestrator.analysis.plots import plot_router_map  # noqa: E402
from orchestrator.core.fmt import slug  # noqa: E402
from orchestrator.core.tracking import quiet_downloads  # noqa: E402

_DPI = 100
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def retrieval_curves(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(from later layers (L-1,): mean_{l > s} M[l, s] for s = 0..L-2, self (L,): M[l, l])."""
    m = np.asarray(m, dtype=np.float64)
    L = m.shape[0]
    later = np.array([np.nanmean(m[s + 1:, s]) for s in range(L - 1)])
    return later, np.diag(m).copy()


def plot_retrieval(maps: Mapping[str, np.ndarray], path: str | Path, title: str) -> Path:
    """The two curves of every cell in ``maps`` (label -> (L, L) mean map), two panels."""
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(11.0, 4.2))
        left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        for i, (label, m) in enumerate(maps.items()):
            later, own = retrieval_curves(m)
            c = _COLORS[i % len(_COLORS)]
            left.plot(np.arange(len(later)), later, color=c, marker=".", label=label)
            right.plot(np.arange(len(own)), own, color=c, marker=".", label=label)
        left.set_xlabel("source layer s")
        left.set_ylabel("mean weight from layers l > s")
        left.set_title("retrieval from later layers", fontsize=10)
        right.set_xlabel("layer l")
        right.set_ylabel("weight on its own layer")
        right.set_title("self-retrieval", fontsize=10)
        for ax in (left, right):
            ax.grid(True, alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
        right.legend(fontsize=8)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=_DPI, metadata={"Software": None})
        return out


def retrieval_plots(maps: Mapping[str, tuple[np.ndarray, int]], labels: Sequence[str], out_dir: Path,
                    name: str) -> list[tuple[str, str]]:
    """Figure 9's curves, one figure per depth, for the cells with a routed map (``none``'s is the
    identity: left out). Returns [(caption, file name)]."""
    by_depth: dict[int, dict[str, np.ndarray]] = {}
    for lab in labels:
        if lab in maps:
            m = maps[lab][0]
            if not np.allclose(np.nan_to_num(m), np.eye(len(m))):
                by_depth.setdefault(len(m), {})[lab] = m
    out = []
    for L, part in sorted(by_depth.items()):
        fname = f"retrieval_L{L}.png"
        plot_retrieval(part, out_dir / fname, f"{name}: retrieval statistics, {L} layers (mean maps over seeds)")
        out.append((f"Retrieval from later layers and self-retrieval per layer at {L} layers (as in the paper's "
                    "Figure 9), from the cells' mean source maps", fname))
    return out


def spread_maps(cl, runs_by_label: Mapping[str, Sequence[str]]) -> dict[str, tuple[np.ndarray, int]]:
    """label -> (mean over its runs of the ``router_spread.npz`` maps, runs); runs without the
    artifact (static routers) are skipped silently, cells without any are left out."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for lab, run_ids in runs_by_label.items():
            maps = []
            for rid in run_ids:
                try:
                    with quiet_downloads():
                        p = cl.download_artifacts(rid, "router_spread.npz", str(Path(tmp) / rid))
                    with np.load(p) as z:
                        maps.append(np.asarray(z["spread"], dtype=np.float64))
                except Exception:  # noqa: BLE001 - a static router writes no spread
                    continue
            maps = [m for m in maps if m.shape == maps[0].shape]
            if maps:
                out[lab] = (np.mean(np.stack(maps), axis=0), len(maps))
    return out


def spread_plots(cl, runs_by_label: Mapping[str, Sequence[str]], labels: Sequence[str],
                 out_dir: Path) -> list[tuple[str, str]]:
    """Heatmaps of the token spread of the cells whose runs wrote one (token-dependent routers)."""
    spreads = spread_maps(cl, runs_by_label)
    out = []
    for lab in labels:
        if lab in spreads:
            m, n = spreads[lab]
            fname = f"router_spread_{slug(lab)}.png"
            plot_router_map(m, out_dir / fname, title=f"{lab}: std over tokens of the source map (n={n})",
                            label="std over tokens", vmax=None)
            out.append((f"Spread over validation tokens of the source map of {lab} (a token-dependent router; "
                        f"mean over {n} seed(s))", fname))
    return out
