"""The result types of ``orchestrator.report.paired`` and their rendering (markdown, frames).

Fixed order (the comparison's group order), fixed number formatting and no timestamps, so the
same inputs give the same text.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from functools import partial

import pandas as pd

from orchestrator.core.fmt import cell, num, pct, table
from orchestrator.report import verdicts

_f = partial(num, digits=4, missing="nan")


def magnitude_pct(x: float) -> str:
    """A size as a percentage without a sign (an MDE is a magnitude, not a change)."""
    return "nan" if x != x else ("inf" if x == float("inf") else f"{x:.2f}%")


def _mde(r) -> str:
    return "not reachable" if r.mde == float("inf") else f"{_f(r.mde)} ({magnitude_pct(r.mde_pct)})"


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
    ci_low: float  # bootstrap CI of the mean difference
    ci_high: float
    confidence: float
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

    def verdict_lines(self) -> list[str]:
        """The verdicts in words, one bullet per variant."""
        if not self.paired or self.baseline is None:
            return [f"- No verdicts: {self.why}"]
        head = (f"At alpha {self.alpha:g}, {verdicts.direction_words(self.mode)} for `{cell(self.metric)}`; "
                f"each variant against `{cell(self.baseline)}` on the seeds both have (paired "
                f"permutation test of the mean difference, Holm over {len(self.rows)} comparison(s)):")
        return [head, ""] + [verdicts.sentence(r, self.baseline, self.alpha, self.mode, len(self.rows))
                             for r in self.rows]

    def to_markdown(self) -> str:
        lines = [f"Design: {self.design}. {self.why}", ""]
        if self.friedman is not None:
            lines += [self._friedman_line(), ""]
        if self.rows:
            lines += self._tables()
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def _friedman_line(self) -> str:
        fr = self.friedman
        if fr.status != "ok":
            return f"Friedman: {fr.status}."
        line = (f"Friedman (blocks = seeds, midranks within a seed, tie-corrected): chi2 = {_f(fr.chi2)}, "
                f"df = {len(fr.groups) - 1}, p = {_f(fr.p)} (chi-square); permutation p = {_f(fr.perm_p)} "
                f"({fr.perm_method}, {fr.perm_count} within-seed permutations); Kendall's W = "
                f"{_f(fr.kendall_w)}; {fr.blocks} seeds x {len(fr.groups)} variants; smallest reachable "
                f"permutation p {_f(fr.min_p)}.")
        return line

    def _tables(self) -> list[str]:
        level = f"{self.rows[0].confidence * 100:g}%"
        effects = table(["variant", "seeds", "baseline mean", "mean diff", "change", f"{level} CI (diff)",
                         "sd (diff)", "d_z", "MDE (80% power)"],
                        [[cell(r.variant), str(r.n), _f(r.base_mean), _f(r.diff_mean), pct(r.diff_pct, "nan"),
                          f"[{_f(r.ci_low)}, {_f(r.ci_high)}]", _f(r.diff_sd), _f(r.d_z),
                          _mde(r)] for r in self.rows])
        tests = table(["variant", "permutation p", "p (Holm)", "test", "W+", "Wilcoxon p", "p (Holm)", "test",
                       "min p (Holm)", "verdict"],
                      [[cell(r.variant), _f(r.p_perm), _f(r.p_perm_holm), r.perm_method, _f(r.w_plus),
                        _f(r.p_wilcoxon), _f(r.p_wilcoxon_holm),
                        cell(r.wilcoxon_method + (f", {r.zeros} zero(s) dropped" if r.zeros else "")),
                        _f(r.min_p_holm), r.verdict] for r in self.rows])
        return (["Paired effects (difference = variant - baseline per seed; CI: percentile bootstrap "
                 "of the mean difference; d_z = mean / sd of the differences; MDE: the true mean "
                 "difference the permutation test finds with 80% power at this n, Holm over the "
                 "comparisons, given the observed sd):", ""] + effects
                + ["", "Paired tests (two-sided; Holm within each test over the comparisons with the "
                   "baseline; min p (Holm): the smallest adjusted p these seeds can reach):", ""] + tests)
