"""The rungs of a scaling sweep: the report's runs frame -> one ``Line`` per variant, each with
its ``Rung``s (one per model size or training length), and the seeded bootstrap draws.

A sweep has a *size axis* when some variant was trained at more than one size: the trials differ
in ``n_layers``, ``d_model``, ``preset``, ``steps`` or in the tokens they trained on, besides the
compared axis (router, variant, ...). The compared axis itself is never a size axis (a sweep
that compares depths has its own tables).

- A *line* is a value of the compared axis together with every other factor that varies and is
  not a size (an ``lr`` axis splits a line); a factor that changes exactly with the size (a
  ``variant`` bundle per width: ``w256: {d_model: 256, ffn_dim: 704}``) belongs to the rung.
- A *rung* is one size: its training compute C (median of the trials' ``flops`` = 3 x forward
  FLOPs/token x tokens), parameters N (``model/params``), tokens D, and the metric per seed.
- The bootstrap resamples seeds with replacement within each rung, the same draws for every line,
  so a variant and its baseline stay paired by seed (a line that lacks a drawn seed skips it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core.fmt import cell_text, norm_value, order_key, same_value, to_float

__all__ = ["SIZE_KEYS", "Rung", "Line", "build_lines", "draws"]
SIZE_KEYS = ("n_layers", "d_model", "preset", "steps")


@dataclass
class Rung:
    key: tuple  # the size values (and tokens), comparable across lines
    label: str  # "n_layers=8" (the size values that vary)
    c: float  # training FLOPs
    n: float  # parameters
    d: float  # tokens
    values: dict[Any, float]  # seed -> metric
    sizes: dict[str, Any] = field(default_factory=dict)  # size key -> value (those that vary)
    runs: dict[Any, tuple[str, float]] = field(default_factory=dict)  # seed -> (run id, FLOPs per step)

    def array(self) -> np.ndarray:
        return np.array([self.values[s] for s in sorted(self.values, key=order_key)], np.float64)

    @property
    def mean(self) -> float:
        return float(self.array().mean())

    @property
    def std(self) -> float:
        v = self.array()
        return float(v.std(ddof=1)) if len(v) > 1 else math.nan

    def get(self, col: str) -> float:
        return {"c": self.c, "n": self.n, "d": self.d}[col]


@dataclass
class Line:
    label: str
    value: Any  # the compared axis' value
    rest: tuple  # the other non-size factors' values
    rungs: list[Rung] = field(default_factory=list)  # ascending compute (then parameters)
    is_baseline: bool = False

    def rung(self, key: tuple) -> Rung | None:
        return next((r for r in self.rungs if r.key == key), None)


def _varies(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and len({str(norm_value(v)) for v in df[col]}) > 1


def _text(v: Any) -> str:
    return str(norm_value(v))


def size_columns(df: pd.DataFrame, axis: str) -> list[str]:
    """The size keys that vary among the trials (the compared axis excluded)."""
    return [k for k in SIZE_KEYS if k != axis and _varies(df, k)]


def _tied(df: pd.DataFrame, col: str, sizes: list[str], axis: str) -> bool:
    """Whether ``col`` changes exactly with the size within each value of the axis."""
    if not sizes:
        return False
    for _, part in df.groupby(df[axis].map(_text), sort=False):
        pairs = {(tuple(_text(r[s]) for s in sizes), _text(r[col])) for _, r in part.iterrows()}
        if len({p[0] for p in pairs}) != len(pairs) or len({p[1] for p in pairs}) != len(pairs):
            return False
    return True


def build_lines(df: pd.DataFrame, metric: str, axis: str, baseline: Any, factors: list[str]) -> list[Line]:
    """The lines of the finished trials with a finite metric, the baseline's first, then in the
    order of the axis values. ``factors``: the columns that may split a sweep into cells."""
    fin = df[df[metric].map(lambda v: math.isfinite(to_float(v)))]
    if fin.empty:
        return []
    sizes = size_columns(fin, axis)
    others = [c for c in dict.fromkeys(factors) if c not in (axis, "seed", *SIZE_KEYS) and _varies(fin, c)]
    tied = [c for c in others if _tied(fin, c, sizes, axis)]
    rest_cols = [c for c in others if c not in tied]
    token_label = "steps" not in sizes and _varies(fin, "tokens")
    groups: dict[tuple, list] = {}
    for _, r in fin.iterrows():
        lkey = (_text(r[axis]),) + tuple(_text(r[c]) for c in rest_cols)
        tokens = to_float(r.get("tokens"))
        rkey = tuple(_text(r[c]) for c in sizes + tied) + (round(tokens) if math.isfinite(tokens) else None,)
        groups.setdefault(lkey, []).append((rkey, r))
    lines = []
    for rows in groups.values():
        first = rows[0][1]
        label = ", ".join([cell_text(first[axis])] + [f"{c}={cell_text(first[c])}" for c in rest_cols])
        line = Line(label, norm_value(first[axis]), tuple(norm_value(first[c]) for c in rest_cols),
                    is_baseline=same_value(first[axis], baseline))
        by_rung: dict[tuple, list] = {}
        for rkey, r in rows:
            by_rung.setdefault(rkey, []).append(r)
        for rkey, rs in by_rung.items():
            parts = [f"{c}={cell_text(rs[0][c])}" for c in sizes + tied]
            if token_label or not parts:
                parts.append(f"tokens={to_float(rs[0].get('tokens')):.4g}")
            line.rungs.append(Rung(rkey, ", ".join(parts), _median(rs, "flops"), _median(rs, "model/params"),
                                   _median(rs, "tokens"), _seed_values(rs, metric),
                                   {c: norm_value(rs[0][c]) for c in sizes}, _seed_runs(rs)))
        line.rungs.sort(key=lambda g: (_nan_last(g.c), _nan_last(g.n), _nan_last(g.d), g.label))
        lines.append(line)
    lines.sort(key=lambda ln: (not ln.is_baseline, order_key(ln.value), tuple(order_key(v) for v in ln.rest)))
    return lines


def _nan_last(x: float) -> tuple:
    return (1, 0.0) if not math.isfinite(x) else (0, x)


def _median(rows: list, col: str) -> float:
    v = np.array([to_float(r.get(col)) for r in rows], np.float64)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else math.nan


def _seed_values(rows: list, metric: str) -> dict[Any, float]:
    """seed -> metric; a seed that appears twice in one rung (a pooled factor) keeps its mean and
    the rung is still one sample per seed."""
    by: dict[Any, list[float]] = {}
    for i, r in enumerate(rows):
        s = norm_value(r.get("seed"))
        by.setdefault(f"row{i}" if s is None else s, []).append(to_float(r[metric]))
    return {s: float(np.mean(v)) for s, v in by.items()}


def _seed_runs(rows: list) -> dict[Any, tuple[str, float]]:
    """seed -> (run id, FLOPs per step) of the first run of each seed."""
    out: dict[Any, tuple[str, float]] = {}
    for i, r in enumerate(rows):
        s = norm_value(r.get("seed"))
        out.setdefault(f"row{i}" if s is None else s, (str(r.get("run_id")), to_float(r.get("flops_per_step"))))
    return out


def has_size_axis(lines: list[Line]) -> bool:
    return any(len(ln.rungs) > 1 for ln in lines)


def draws(lines: list[Line], n_boot: int, seed: int) -> list[dict[tuple, list]]:
    """``n_boot`` resamples: rung key -> seeds drawn with replacement from the seeds any line has
    at that rung (as many as there are). Seeded: the same lines give the same draws."""
    pool: dict[tuple, list] = {}
    for ln in lines:
        for r in ln.rungs:
            pool.setdefault(r.key, [])
            pool[r.key] += [s for s in r.values if s not in pool[r.key]]
    keys = sorted(pool, key=str)
    for k in keys:
        pool[k] = sorted(pool[k], key=order_key)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_boot):
        out.append({k: [pool[k][i] for i in rng.integers(0, len(pool[k]), len(pool[k]))] for k in keys})
    return out


def points(line: Line, draw: dict[tuple, list] | None, col: str, drop_key: tuple | None = None
           ) -> tuple[np.ndarray, np.ndarray, int]:
    """(x, metric) of a line's seeds (or of one resample's draws), the rung ``drop_key`` left out,
    and how many rungs contributed."""
    xs, ys, used = [], [], 0
    for r in line.rungs:
        if r.key == drop_key:
            continue
        seeds = list(r.values) if draw is None else [s for s in draw.get(r.key, []) if s in r.values]
        if seeds:
            used += 1
        xs += [r.get(col)] * len(seeds)
        ys += [r.values[s] for s in seeds]
    return np.array(xs, np.float64), np.array(ys, np.float64), used
