"""Compute multipliers (issue 35): how many times the compute a variant is worth, with an interval and
a verdict.

For each variant and block (seed) of a report's paired tables: the training FLOPs the baseline
(same block) needs to reach the variant's final validation loss, read off the baseline's own
``val/loss`` curve against training FLOPs (``curve``: linearly in log FLOPs inside the curve, a
power law fitted to its tail below it, the extrapolation flagged per seed), over the variant's own
training FLOPs (``seeds``). Above 1x the variant is worth more compute than it costs.

The per-seed log-multipliers are decided by the report's one rule (``orchestrator.decide.rule``,
through ``decisions.baseline_family``): the median's sign interval (or sign confidence sequence
after seeds were added until decided, as the loss verdicts), with higher better; Bonferroni over
every table's multiplier comparisons as one family of their own (like the all-pairs family: its
intervals hold together at 1 - alpha), untested and Tarone-excluded comparisons leaving it as in
the loss family. The report's equivalence margin is a margin of the metric, not of compute: it is
not applied, so no multiplier verdict says "equivalent". The median multiplier is exp of the
median log-multiplier, and its interval is exp of the interval's ends.

``render`` writes the section, the ranking's column, the summary.csv and per_seed.csv columns and
the parent run's metrics.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core.fmt import same_value
from orchestrator.decide.families import Family
from orchestrator.report.compare import decisions
from orchestrator.report.compare.by_seed import paired_row
from orchestrator.report.compare.results import PairedAnalysis, PairedRow
from orchestrator.report.multiplier.seeds import SeedValue, runs_by_block, table_values

__all__ = ["FAMILY", "Multipliers", "build"]
FAMILY = "compute-multiplier"
UNPAIRED = "the design is unpaired (seeds repeat within a variant), so there are no per-seed pairs"


@dataclass
class Multipliers:
    """Every table's multiplier comparisons, decided; or why there are none (``absent``)."""

    rows: dict[str, list[PairedRow]] = field(default_factory=dict)  # scope -> rows; diffs are log-multipliers
    values: dict[str, dict[Any, list[SeedValue]]] = field(default_factory=dict)  # scope -> variant -> blocks
    family: Family | None = None
    sequential: bool = False
    absent: str = ""  # one line's reason: no multiplier at all

    def row(self, scope: str, variant: Any) -> PairedRow | None:
        return next((r for r in self.rows.get(scope, []) if same_value(r.variant, variant)), None)

    def seed(self, scope: str, variant: Any, block: Any) -> SeedValue | None:
        vals = next((v for k, v in self.values.get(scope, {}).items() if same_value(k, variant)), [])
        return next((s for s in vals if s.block == block), None)


def build(df: pd.DataFrame, histories: Mapping, axis: str, blocks: list[str], tables: list[PairedAnalysis],
          alpha: float, sequential: bool = False, seed: int = 0, n_resamples: int = 9999) -> Multipliers:
    """The multipliers of a report's paired tables (the pooled one, then one per depth)."""
    paired = [pa for pa in tables if pa.paired and pa.baseline is not None and pa.rows]
    if not paired:
        return Multipliers(absent=UNPAIRED if tables and not tables[0].paired else "")
    runs = runs_by_block(df, axis, blocks)
    values = {pa.scope: table_values(pa, runs, histories) for pa in paired}
    every = [s for by in values.values() for vs in by.values() for s in vs]
    if not every:  # no variant shares a seed with the baseline: the loss verdicts say so
        return Multipliers()
    if not any(s.reach is not None for s in every):
        why = Counter(s.why for s in every).most_common(1)[0][0]
        return Multipliers(values=values, sequential=sequential, absent=f"{why} on every seed")
    raw = [[paired_row(r.variant, tuple(s.block for s in ok), np.array([s.log_m for s in ok]), float("nan"),
                       n_resamples, seed)
            for r in pa.rows for ok in [[s for s in values[pa.scope][r.variant] if s.reach is not None]]]
           for pa in paired]
    decided, family = decisions.baseline_family(raw, alpha, "max", None, sequential, n_resamples, seed)
    return Multipliers({pa.scope: rows for pa, rows in zip(paired, decided)}, values,
                       dataclasses.replace(family, name=FAMILY), sequential)
