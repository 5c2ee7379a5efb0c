"""Baseline tuning: compare every variant at its own best value of a tuning axis (usually lr).

A sweep that sets ``report.tune: lr`` (parent param ``sweep.report.tune``) runs each variant at
several values of that axis; the report then keeps, per variant, the trials at the value whose
mean over finished seeds is best (lowest, or highest for accuracy-like metrics) and compares
those. This answers "is the variant better than a baseline that got the same tuning?" rather
than "is it better at one lr that may suit one of them".

The choice is made on the same seeds that are then compared, so each variant's chosen mean is
optimistic (the winner's curse, larger when the axis has many values and the seeds spread
widely); the report says so. Checking the chosen values on fresh seeds would remove the bias and
is not done here. Ties go to the value first in the axis order; a variant without any finished
value keeps its trials at the first value, so its failures stay visible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core.fmt import cell_text, norm_value, num, order_key, same_value, table
from orchestrator.report.compare.across_seeds import Rows, exclusion


@dataclass
class Tuning:
    axis: str
    values: list[Any]  # the tuning axis' values, in order
    chosen: dict[Any, Any]  # variant -> chosen value
    means: dict[tuple[Any, Any], tuple[float, int]]  # (variant, value) -> (mean, finished seeds)
    notes: list[str] = field(default_factory=list)


def select(df: pd.DataFrame, metric: str, axis: str, tune: str, mode: str,
           baseline: Any = None) -> tuple[pd.DataFrame, Tuning]:
    """The trials at each variant's best value of ``tune``, and what was chosen (variants in
    report order: the baseline first)."""
    if tune not in df.columns or df[tune].map(lambda v: norm_value(v) is None).all():
        raise ConfigError(f"report.tune: {tune!r} has no value in any run; it must be an axis of the sweep")
    rows = Rows.of(df, metric, axis)
    tv = [norm_value(v) for v in df[tune]]
    variants = sorted({v for v in rows.values if v is not None}, key=lambda v: order_key(v, first=baseline))
    values = sorted({v for v in tv if v is not None}, key=order_key)
    samples: dict[tuple[Any, Any], list[float]] = {}
    for i, v in enumerate(rows.values):
        if exclusion(v, rows.statuses[i], rows.numeric[i], rows.raw_metric[i], axis) is None and tv[i] is not None:
            samples.setdefault((v, tv[i]), []).append(float(rows.numeric[i]))
    means = {k: (float(np.mean(x)), len(x)) for k, x in samples.items()}
    sign = 1.0 if mode == "min" else -1.0
    chosen, notes = {}, []
    for v in variants:
        tried = [(sign * means[(v, t)][0], i, t) for i, t in enumerate(values) if (v, t) in means]
        if tried:
            chosen[v] = min(tried)[2]
        else:
            chosen[v] = values[0]
            notes.append(f"{axis}={v} has no finished trial at any {tune}; its trials at {tune}={values[0]} are kept")
    keep = [v is not None and same_value(t, chosen.get(v)) for v, t in zip(rows.values, tv)]
    return df[keep].copy(), Tuning(tune, values, chosen, means, notes)


def lines(t: Tuning, metric: str, axis: str, mode: str) -> list[str]:
    """The report's tuning section."""
    best = "lowest" if mode == "min" else "highest"
    body = []
    for v, c in t.chosen.items():
        cells = []
        for val in t.values:
            mean, n = t.means.get((v, val), (math.nan, 0))
            text = "-" if not n else f"{num(mean, 4)} (n={n})"
            cells.append(f"**{text}**" if n and val == c else text)
        body.append([cell_text(v), cell_text(c)] + cells)
    out = ["", "## Tuning", "",
           f"`{t.axis}` is the tuning axis: each {axis} is compared at its own {t.axis} with the {best} mean "
           f"`{metric}` over finished seeds (bold); every table and test above uses only those trials.", "",
           *table([axis, f"chosen {t.axis}"] + [f"{t.axis}={cell_text(x)}" for x in t.values], body), "",
           f"- Selection bias (winner's curse): the chosen {t.axis} is picked on the same seeds that are then "
           f"compared, so each variant's mean at its chosen value is optimistic, by more when the {t.axis} values "
           "are many and the seeds spread widely. A held-out check (new seeds at the chosen values) would "
           "remove the bias; it is not run here."]
    edge = [cell_text(v) for v, c in t.chosen.items() if len(t.values) > 1 and c in (t.values[0], t.values[-1])]
    if edge:
        out.append(f"- Chosen at the edge of the {t.axis} range ({', '.join(edge)}): the best value may lie outside "
                   "the range tried.")
    return out + [f"- {n}" for n in t.notes]
