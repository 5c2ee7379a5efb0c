"""The result types of ``orchestrator.report.stats`` and their rendering.

``Comparison`` (what ``stats.compare`` returns) holds one ``GroupSummary`` per value of the axis,
the Kruskal-Wallis ``Omnibus`` and the post-hoc ``PairTest`` rows; it renders as pandas frames
(``to_frame``, ``posthoc_frame``, ``excluded_frame``) and as markdown (``to_markdown``) in the
order of its groups, with fixed number formatting and no timestamps, so the same inputs give the
same text.
All names are re-exported by ``orchestrator.report.stats``.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from orchestrator.core.fmt import cell, num, pct, table


@dataclass(frozen=True)
class GroupSummary:
    value: Hashable
    n: int
    n_excluded: int
    mean: float
    std: float
    median: float
    ci_low: float
    ci_high: float
    change_pct: float


@dataclass(frozen=True)
class Omnibus:
    status: str  # "ok", "all values identical", or "not run: <why>"
    groups: tuple[Hashable, ...]
    n_total: int
    df: int
    h: float
    p: float  # chi-square approximation
    epsilon_sq: float
    perm_p: float  # nan when not computed
    perm_method: str  # "exact", "monte-carlo", or "" when not computed
    perm_count: int  # partitions enumerated (exact) or resamples drawn (monte-carlo)
    test: str = "kruskal-wallis"


@dataclass(frozen=True)
class PairTest:
    family: str  # "baseline" (variant vs baseline) or "all-pairs"
    a: Hashable
    b: Hashable
    n_a: int
    n_b: int
    u: float  # U statistic of a
    p: float
    p_holm: float
    reject: bool
    cliffs_delta: float
    min_p: float
    method: str


def _formatter(digits: int) -> Callable[[float], str]:
    """A statistic with ``digits`` significant digits; an undefined one (NaN) as ``nan``."""
    return partial(num, digits=digits, missing="nan")


@dataclass
class Comparison:
    metric: str
    axis: str
    baseline: Hashable | None
    confidence: float
    alpha: float
    seed: int
    n_resamples: int
    groups: list[GroupSummary]
    omnibus: Omnibus
    posthoc: list[PairTest]
    excluded: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def group(self, value: Hashable) -> GroupSummary:
        for g in self.groups:
            if g.value == value:
                return g
        raise KeyError(value)

    def to_frame(self) -> pd.DataFrame:
        """One row per group, columns as in GroupSummary."""
        return pd.DataFrame([asdict(g) for g in self.groups],
                            columns=list(GroupSummary.__dataclass_fields__))

    def posthoc_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(r) for r in self.posthoc],
                            columns=list(PairTest.__dataclass_fields__))

    def excluded_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.excluded, columns=["value", "seed", "status", "reason"]
                            + (["trial_id"] if any("trial_id" in e for e in self.excluded) else []))

    def to_markdown(self, digits: int = 4) -> str:
        """The comparison as markdown: header, group table, Kruskal-Wallis line, post-hoc table,
        excluded trials and notes. NaN is written ``nan`` (a statistic that is undefined)."""
        base = "none" if self.baseline is None else f"`{cell(self.baseline)}`"
        lines = [f"**{cell(self.metric)}** by `{cell(self.axis)}` (baseline: {base}; "
                 f"samples are seeds; seed {self.seed}, {self.n_resamples} resamples)", ""]
        lines += self._group_table(digits)
        lines += ["", self._omnibus_line(digits)]
        if self.posthoc:
            lines += ["", "Post-hoc: two-sided Mann-Whitney U, Holm-corrected within each family; "
                      "delta is Cliff's delta (positive: a has the larger metric); "
                      "min p is the smallest p the sample sizes allow.", ""]
            lines += self._posthoc_table(digits)
        if self.excluded:
            lines += ["", "Excluded trials:", ""]
            lines += table(["value", "seed", "status", "reason"],
                           [[cell(e["value"]), cell(e["seed"]), cell(e["status"]), cell(e["reason"])]
                            for e in self.excluded])
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def _group_table(self, digits: int) -> list[str]:
        f = _formatter(digits)
        level = f"{self.confidence * 100:g}%"
        return table(["value", "n", "mean", "std", "median", f"{level} CI (mean)", "change vs baseline"],
                     [[cell(g.value), str(g.n), f(g.mean), f(g.std), f(g.median),
                       f"[{f(g.ci_low)}, {f(g.ci_high)}]", pct(g.change_pct, missing="nan")]
                      for g in self.groups])

    def _omnibus_line(self, digits: int) -> str:
        f = _formatter(digits)
        o = self.omnibus
        if o.status != "ok":
            return f"Kruskal-Wallis: {o.status} (H = {f(o.h)}, p = {f(o.p)})."
        line = (f"Kruskal-Wallis (tie-corrected): H = {f(o.h)}, df = {o.df}, "
                f"p = {f(o.p)} (chi-square), epsilon^2 = {f(o.epsilon_sq)}, N = {o.n_total}")
        if o.perm_method:
            line += f"; permutation p = {f(o.perm_p)} ({o.perm_method}, {o.perm_count} permutations)"
        return line + "."

    def _posthoc_table(self, digits: int) -> list[str]:
        f = _formatter(digits)
        return table(["family", "a", "b", "n_a", "n_b", "U", "p", "p (Holm)", f"Holm p <= {self.alpha:g}",
                      "delta", "min p", "test"],
                     [[r.family, cell(r.a), cell(r.b), str(r.n_a), str(r.n_b), f(r.u), f(r.p), f(r.p_holm),
                       "yes" if r.reject else "no", f(r.cliffs_delta), f(r.min_p), r.method]
                      for r in self.posthoc])
