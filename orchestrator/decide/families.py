"""Families of comparisons and the level of each interval in one (Bonferroni).

A report's comparisons fall in two families, each with its own error rate ``alpha``:

- ``baseline``: every variant against the baseline, over every table of the report (the pooled one
  and each per-depth one): a sweep whose 3 depths each compare full with none has 4 comparisons;
- ``all-pairs``: every pair of non-baseline variants, over the same tables.

Within a family of m comparisons every interval is at level 1 - alpha / m (Bonferroni). Why
Bonferroni and not Holm: a verdict is read off its interval, and Bonferroni's intervals are plain
intervals that hold simultaneously (P(every interval of the family covers) >= 1 - alpha); Holm's
step-down gains power on p-values, but its compatible simultaneous intervals (Strassburger and
Bretz 2008) collapse to one-sided bounds at 0 for every rejected comparison, which cannot show a
size. Holm-adjusted p-values over the same family stay in the report's tables as supporting numbers.
Both give the same first step (m p_(1) < alpha), so neither can decide anything the other cannot
reach at its smallest p.

Since issue 33 (``rule``) a comparison of zero variance is not tested and leaves its family, and in
a fixed-seed report one whose seeds cannot reach alpha / K leaves it too (Tarone): ``size`` is K.

``FAMILY_NOTE`` is the sentence the report prints.
"""
from __future__ import annotations

from dataclasses import dataclass

BASELINE, PAIRS = "baseline", "all-pairs"
FAMILY_NOTE = ("Bonferroni: within a family of m comparisons each interval is at level 1 - alpha/m, so all of a "
               "family's intervals cover together with probability >= 1 - alpha")


@dataclass(frozen=True)
class Family:
    name: str  # BASELINE or PAIRS
    size: int  # comparisons in it
    alpha: float

    @property
    def level(self) -> float:
        """The confidence of each of its intervals."""
        return 1.0 - self.alpha / max(1, self.size)

    def text(self) -> str:
        if self.size == 0:  # every comparison untested or left out (Tarone)
            return f"{self.name} family: no comparison that can reach alpha {self.alpha:g}"
        return (f"{self.name} family: {self.size} comparison(s), each interval at "
                f"{100 * self.level:.4g}% (alpha {self.alpha:g} / {self.size})")
