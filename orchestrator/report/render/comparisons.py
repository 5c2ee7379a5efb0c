"""Markdown of a sweep's comparison results (``orchestrator.report.compare.results``).

Fixed order (the comparison's group order), fixed number formatting and no timestamps, so the
same inputs give the same text. NaN is written ``nan`` (a statistic that is undefined).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

from orchestrator.core.fmt import cell, num, pct, table
from orchestrator.report.compare import verdicts
from orchestrator.report.compare.results import Comparison, PairedAnalysis


def _formatter(digits: int) -> Callable[[float], str]:
    """A statistic with ``digits`` significant digits; an undefined one (NaN) as ``nan``."""
    return partial(num, digits=digits, missing="nan")


_f = partial(num, digits=4, missing="nan")


def magnitude_pct(x: float) -> str:
    """A size as a percentage without a sign (an MDE is a magnitude, not a change)."""
    return "nan" if x != x else ("inf" if x == float("inf") else f"{x:.2f}%")


def _mde(r) -> str:
    if r.mde != r.mde:
        return "-"  # a confidence sequence: its seeds were added until decided, no fixed-n power
    return "not reachable" if r.mde == float("inf") else f"{_f(r.mde)} ({magnitude_pct(r.mde_pct)})"


def comparison_markdown(self: Comparison, digits: int = 4) -> str:
    """The comparison as markdown: header, group table, Kruskal-Wallis line, post-hoc table,
    excluded trials and notes. NaN is written ``nan`` (a statistic that is undefined)."""
    base = "none" if self.baseline is None else f"`{cell(self.baseline)}`"
    lines = [f"**{cell(self.metric)}** by `{cell(self.axis)}` (baseline: {base}; "
             f"samples are seeds; seed {self.seed}, {self.n_resamples} resamples)", ""]
    lines += _group_table(self, digits)
    lines += ["", _omnibus_line(self, digits)]
    if self.posthoc:
        lines += ["", "Post-hoc: two-sided Mann-Whitney U, Holm-corrected within each family; "
                  "delta is Cliff's delta (positive: a has the larger metric); "
                  "min p is the smallest p the sample sizes allow.", ""]
        lines += _posthoc_table(self, digits)
    if self.excluded:
        lines += ["", "Excluded trials:", ""]
        lines += table(["value", "seed", "status", "reason"],
                       [[cell(e["value"]), cell(e["seed"]), cell(e["status"]), cell(e["reason"])]
                        for e in self.excluded])
    if self.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
    return "\n".join(lines) + "\n"

def _group_table(self: Comparison, digits: int) -> list[str]:
    f = _formatter(digits)
    level = f"{self.confidence * 100:g}%"
    return table(["value", "n", "mean", "std", "median", f"{level} CI (mean)", "change vs baseline"],
                 [[cell(g.value), str(g.n), f(g.mean), f(g.std), f(g.median),
                   f"[{f(g.ci_low)}, {f(g.ci_high)}]", pct(g.change_pct, missing="nan")]
                  for g in self.groups])

def _omnibus_line(self: Comparison, digits: int) -> str:
    f = _formatter(digits)
    o = self.omnibus
    if o.status != "ok":
        return f"Kruskal-Wallis: {o.status} (H = {f(o.h)}, p = {f(o.p)})."
    line = (f"Kruskal-Wallis (tie-corrected): H = {f(o.h)}, df = {o.df}, "
            f"p = {f(o.p)} (chi-square), epsilon^2 = {f(o.epsilon_sq)}, N = {o.n_total}")
    if o.perm_method:
        line += f"; permutation p = {f(o.perm_p)} ({o.perm_method}, {o.perm_count} permutations)"
    return line + "."

def _posthoc_table(self: Comparison, digits: int) -> list[str]:
    f = _formatter(digits)
    return table(["family", "a", "b", "n_a", "n_b", "U", "p", "p (Holm)", f"Holm p <= {self.alpha:g}",
                  "delta", "min p", "test"],
                 [[r.family, cell(r.a), cell(r.b), str(r.n_a), str(r.n_b), f(r.u), f(r.p), f(r.p_holm),
                   "yes" if r.reject else "no", f(r.cliffs_delta), f(r.min_p), r.method]
                  for r in self.posthoc])


def verdict_lines(self: PairedAnalysis) -> list[str]:
    """The verdicts in words, one bullet per variant, then the all-pairs family's."""
    if not self.paired or self.baseline is None:
        return [f"- No verdicts: {self.why}"]
    m = self.rows[0].family_size if self.rows else 0
    method = self.rows[0].method if self.rows else ""
    head = (f"At alpha {self.alpha:g}, {verdicts.direction_words(self.mode)} for `{cell(self.metric)}`; "
            f"each variant against `{cell(self.baseline)}` on the seeds both have, read off its interval "
            f"({method}) at the baseline family's level (Bonferroni over {m} comparison(s) of this report):")
    lines = [head, ""] + [verdicts.sentence(r, self.baseline, self.alpha, self.mode, max(1, m)) for r in self.rows]
    if self.pairs:
        lines += ["", f"All pairs of variants (difference = first - second per seed; their own family, Bonferroni "
                  f"over {self.pairs[0].family_size} pair(s) of this report):", ""]
        lines += [verdicts.pair_sentence(p, self.alpha) for p in self.pairs]
    return lines

def paired_markdown(self: PairedAnalysis) -> str:
    lines = [f"Design: {self.design}. {self.why}", ""]
    if self.friedman is not None:
        lines += [_friedman_line(self), ""]
    if self.rows:
        lines += _tables(self)
    if self.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in self.notes]
    return "\n".join(lines).rstrip() + "\n"

def _friedman_line(self: PairedAnalysis) -> str:
    fr = self.friedman
    if fr.status != "ok":
        return f"Friedman: {fr.status}."
    line = (f"Friedman (blocks = seeds, midranks within a seed, tie-corrected): chi2 = {_f(fr.chi2)}, "
            f"df = {len(fr.groups) - 1}, p = {_f(fr.p)} (chi-square); permutation p = {_f(fr.perm_p)} "
            f"({fr.perm_method}, {fr.perm_count} within-seed permutations); Kendall's W = "
            f"{_f(fr.kendall_w)}; {fr.blocks} seeds x {len(fr.groups)} variants; smallest reachable "
            f"permutation p {_f(fr.min_p)}.")
    return line

def _tables(self: PairedAnalysis) -> list[str]:
    level = f"{self.rows[0].confidence * 100:.4g}%"
    est = self.rows[0].estimand or "mean"
    effects = table(["variant", "seeds", "baseline mean", "mean diff", "change", f"{level} interval ({est} diff)",
                     f"{level} interval (mean diff)", "flag", "sd (diff)", "d_z", "MDE (80% power)"],
                    [[cell(r.variant), str(r.n), _f(r.base_mean), _f(r.diff_mean), pct(r.diff_pct, "nan"),
                      f"[{_f(r.ci_low)}, {_f(r.ci_high)}]",
                      f"[{_f(r.mean_ci_low)}, {_f(r.mean_ci_high)}]" if r.estimand else "-", cell(r.flag or "-"),
                      _f(r.diff_sd), _f(r.d_z), _mde(r)] for r in self.rows])
    tests = table(["variant", "permutation p", "p (Holm)", "test", "W+", "Wilcoxon p", "p (Holm)", "test",
                   "min p (Holm)", "verdict"],
                  [[cell(r.variant), _f(r.p_perm), _f(r.p_perm_holm), r.perm_method, _f(r.w_plus),
                    _f(r.p_wilcoxon), _f(r.p_wilcoxon_holm),
                    cell(r.wilcoxon_method + (f", {r.zeros} zero(s) dropped" if r.zeros else "")),
                    _f(r.min_p_holm), r.verdict] for r in self.rows])
    method = self.rows[0].method
    return ([f"Paired effects (difference = variant - baseline per seed; interval: {method} of the {est} "
             "difference at the family's Bonferroni level, the one the verdict is read off; the mean's interval "
             "beside it does not decide; flag: an outlier (robust z > 4, seeds named) or strong skew; d_z = mean / sd "
             "of the differences; MDE: the true difference the verdict's interval excludes with 80% power at this n, "
             "for normal differences of "
             "the observed sd):", ""] + effects
            + ["", "Paired tests (two-sided, supporting numbers; Holm within each test over the report's baseline "
               "family; min p (Holm): the smallest adjusted p these seeds can reach):", ""] + tests)
