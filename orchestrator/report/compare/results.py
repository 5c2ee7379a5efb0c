"""The results of a sweep's comparisons, as data: the unpaired comparison across seeds
(``Comparison``: one ``GroupSummary`` per value of the axis, the Kruskal-Wallis ``Omnibus``, the
post-hoc ``PairTest`` rows) and the paired analysis with seeds as blocks (``PairedAnalysis``: the
``FriedmanResult`` and one ``PairedRow`` per variant). They render as pandas frames here and as
markdown in ``orchestrator.report.render.comparisons``.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd


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

    def excluded_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.excluded, columns=["value", "seed", "status", "reason"]
                            + (["trial_id"] if any("trial_id" in e for e in self.excluded) else []))


@dataclass(frozen=True)
class PairedRow:
    """One variant against the baseline on the seeds both have."""

    variant: Hashable
    n: int  # common seeds (pairs)
    seeds: tuple  # the common seeds
    base_mean: float  # the baseline's mean on those seeds
    diff_mean: float  # mean of variant - baseline per seed
    diff_pct: float  # 100 diff_mean / |base_mean|
    diff_sd: float
    d_z: float  # diff_mean / diff_sd
    ci_low: float  # the verdict's interval of the mean difference (``orchestrator.report.compare.decisions``)
    ci_high: float
    confidence: float  # its level: 1 - alpha / (the family's size)
    p_perm: float  # paired sign-flip permutation test (the verdict's test)
    p_perm_holm: float
    perm_method: str
    w_plus: float  # Wilcoxon signed-rank
    p_wilcoxon: float
    p_wilcoxon_holm: float
    wilcoxon_method: str
    zeros: int  # zero differences (dropped by Wilcoxon)
    min_p_holm: float  # smallest Holm-adjusted p the design can reach (permutation test)
    mde: float  # true mean difference found with 80% power at this n (inf: unreachable)
    mde_pct: float
    verdict: str
    diffs: tuple = ()  # the per-seed differences, in seed order
    method: str = ""  # the interval's: "t ∪ sign-flip" (fixed n) or the confidence sequence
    family_size: int = 0  # comparisons in its family (Bonferroni)
    margin: float = float("nan")  # the absolute equivalence margin (NaN: none)
    within_margin: bool = False  # a better/worse interval that also lies inside the margin
    estimand: str = ""  # "median" (the verdict's interval, ``orchestrator.decide.rule``); "" before issue 33
    mean_ci_low: float = float("nan")  # the mean's interval at the same level, shown beside the verdict
    mean_ci_high: float = float("nan")
    mean_method: str = ""
    flag: str = ""  # outlier (robust z > 4, seeds named) or strong skew; "" for neither
    note: str = ""  # why "not tested", or the seeds a comparison left out of its family would need


@dataclass(frozen=True)
class PairComparison:
    """Two non-baseline variants compared on the seeds both have (the all-pairs family)."""

    scope: str
    a: Hashable
    b: Hashable
    n: int
    diff_mean: float  # mean of a - b per seed
    diff_sd: float
    d_z: float
    ci_low: float
    ci_high: float
    confidence: float
    method: str
    family_size: int
    p_perm: float
    p_perm_holm: float
    margin: float
    verdict: str  # better / worse: a than b
    within_margin: bool
    estimand: str = ""  # "median" (the verdict's interval, ``orchestrator.decide.rule``); "" before issue 33
    mean_ci_low: float = float("nan")  # the mean's interval at the same level, shown beside the verdict
    mean_ci_high: float = float("nan")
    mean_method: str = ""
    flag: str = ""  # outlier (robust z > 4, seeds named) or strong skew; "" for neither
    note: str = ""  # why "not tested", or the seeds a comparison left out of its family would need


@dataclass(frozen=True)
class FriedmanResult:
    status: str  # "ok", "not run: <why>" or "all values tied within every block"
    groups: tuple
    blocks: int
    chi2: float
    p: float  # chi-square approximation
    perm_p: float
    perm_method: str
    perm_count: int
    kendall_w: float
    min_p: float  # smallest permutation p without ties


@dataclass
class PairedAnalysis:
    design: str  # "paired" or "unpaired"
    why: str  # one paragraph: which design applies and why
    metric: str
    axis: str
    baseline: Hashable | None
    alpha: float
    mode: str  # "min" or "max"
    friedman: FriedmanResult | None
    rows: list[PairedRow]
    notes: list[str] = field(default_factory=list)
    values: dict = field(default_factory=dict)  # variant -> {block: metric}: the samples the rows pair
    pairs: list[PairComparison] = field(default_factory=list)  # the all-pairs family's rows of this table
    scope: str = "all"

    @property
    def paired(self) -> bool:
        return self.design == "paired"

    def row(self, variant: Hashable) -> PairedRow:
        for r in self.rows:
            if r.variant == variant:
                return r
        raise KeyError(variant)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(r) for r in self.rows], columns=list(PairedRow.__dataclass_fields__))
