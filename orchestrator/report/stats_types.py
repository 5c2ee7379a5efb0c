"""The result types of ``orchestrator.report.stats`` and their rendering.

``Comparison`` (what ``stats.compare`` returns) holds one ``GroupSummary`` per value of the axis,
the Kruskal-Wallis ``Omnibus`` and the post-hoc ``PairTest`` rows; it renders as pandas frames
(``to_frame``, ``posthoc_frame``, ``excluded_frame``) and as markdown (``to_markdown``) in the
order of its groups, with fixed number formatting and no timestamps, so the same inputs give the
same text.
All names are re-exported by ``orchestrator.report.stats``.
"""
from __future__ import annotations

import math
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


def _fmt(x: float, digits: int) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "nan"
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"  # also turns -0.0 into 0
    if abs(x) >= 10**digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _pct(x: float) -> str:
    return "nan" if math.isnan(x) else ("0.00%" if x == 0 else f"{x:+.2f}%")


def _cell(v: Any) -> str:
    return "(missing)" if v is None else str(v).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


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
        f = lambda x: _fmt(x, digits)  # noqa: E731
        base = "none" if self.baseline is None else f"`{_cell(self.baseline)}`"
        level = f"{self.confidence * 100:g}%"
        lines = [f"**{_cell(self.metric)}** by `{_cell(self.axis)}` (baseline: {base}; "
                 f"samples are seeds; seed {self.seed}, {self.n_resamples} resamples)", ""]
        lines += _table(["value", "n", "mean", "std", "median", f"{level} CI (mean)",
                         "change vs baseline"],
                        [[_cell(g.value), str(g.n), f(g.mean), f(g.std), f(g.median),
                          f"[{f(g.ci_low)}, {f(g.ci_high)}]", _pct(g.change_pct)]
                         for g in self.groups])
        o = self.omnibus
        lines.append("")
        if o.status == "ok":
            line = (f"Kruskal-Wallis (tie-corrected): H = {f(o.h)}, df = {o.df}, "
                    f"p = {f(o.p)} (chi-square), epsilon^2 = {f(o.epsilon_sq)}, N = {o.n_total}")
            if o.perm_method:
                line += (f"; permutation p = {f(o.perm_p)} "
                         f"({o.perm_method}, {o.perm_count} permutations)")
            lines.append(line + ".")
        else:
            lines.append(f"Kruskal-Wallis: {o.status} (H = {f(o.h)}, p = {f(o.p)}).")
        if self.posthoc:
            lines += ["", "Post-hoc: two-sided Mann-Whitney U, Holm-corrected within each family; "
                      "delta is Cliff's delta (positive: a has the larger metric); "
                      "min p is the smallest p the sample sizes allow.", ""]
            lines += _table(["family", "a", "b", "n_a", "n_b", "U", "p", "p (Holm)",
                             f"Holm p <= {self.alpha:g}", "delta", "min p", "test"],
                            [[r.family, _cell(r.a), _cell(r.b), str(r.n_a), str(r.n_b), f(r.u),
                              f(r.p), f(r.p_holm), "yes" if r.reject else "no",
                              f(r.cliffs_delta), f(r.min_p), r.method] for r in self.posthoc])
        if self.excluded:
            lines += ["", "Excluded trials:", ""]
            lines += _table(["value", "seed", "status", "reason"],
                            [[_cell(e["value"]), _cell(e["seed"]), _cell(e["status"]),
                              _cell(e["reason"])] for e in self.excluded])
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"
