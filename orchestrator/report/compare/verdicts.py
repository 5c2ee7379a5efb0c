"""Verdicts in words: is a variant better or worse than the baseline, equivalent within a margin, or
can this sweep not tell? The verdict itself is read off the comparison's interval
(``orchestrator.decide.verdict``; the interval and its family: ``orchestrator.report.compare.decisions``):

1. fewer than 2 common seeds: "not tested";
2. the interval at the family's level is the whole line: "cannot decide" (no data at this n could
   exclude anything; the sentence says how many seeds it takes);
3. it excludes 0: "better" or "worse", from the side and the metric's direction;
4. it lies inside (-margin, +margin): "equivalent within margin" (two one-sided tests, each at
   alpha / 2m);
5. otherwise "not decided", with the minimal detectable effect at this n and level and the observed
   spread of the per-seed differences, so an undecided comparison is never read as "equal". Without
   a margin no sentence claims that two variants match.

The direction: lower is better unless the metric's name says accuracy (``acc``, ``exact``,
``score``, the sweep layer's rule) or the sweep sets ``report.mode``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from orchestrator.core.fmt import cell_text, num, pct
from orchestrator.decide.signs import min_seeds
from orchestrator.decide.verdict import (  # noqa: F401 - the report's vocabulary
    BASELINE,
    BETTER,
    DECIDED,
    EQUIVALENT,
    MAX_WORDS,
    UNDECIDABLE,
    UNDECIDED,
    UNTESTED,
    WORSE,
    improvement,
    metric_mode,
)
from orchestrator.report.stats.verdict_power import MAX_SEEDS, verdict_seeds


def min_seeds_to_decide(m: int, alpha: float, sequential: bool = False) -> int:
    """The fewest seeds per arm at which a family of m comparisons can give a finite interval."""
    level = 1.0 - alpha / max(1, m)
    return min_seeds(level, sequential)


def interval_text(row: Any) -> str:
    """The verdict's interval naming its estimand; a median verdict (``orchestrator.decide.rule``)
    with the mean's interval and the skew/outlier flag beside it."""
    est = getattr(row, "estimand", "") or "mean"
    out = f"{row.confidence * 100:.4g}% interval of the {est} [{num(row.ci_low, 4)}, {num(row.ci_high, 4)}]"
    if est == "median":
        diffs = getattr(row, "diffs", ())
        med = f"median {num(float(np.median(diffs)), 4)}, " if len(diffs) else ""
        out = (f"{med}{out}; interval of the mean [{num(row.mean_ci_low, 4)}, {num(row.mean_ci_high, 4)}] "
               f"({row.mean_method}, not deciding)")
        if row.flag:
            out += f"; FLAG {row.flag}: mean and median may differ"
    return out


def sentence(row: Any, baseline: Any, alpha: float, mode: str, m: int) -> str:
    """The verdict of one ``PairedRow`` in words (markdown, one line)."""
    name, base = f"**{cell_text(row.variant)}**", f"`{cell_text(baseline)}`"
    change = (f"{pct(row.diff_pct)} (mean per-seed difference {num(row.diff_mean, 4)}, {interval_text(row)})")
    spread = f"sd of the per-seed differences {num(row.diff_sd, 3)}"
    margin = "" if not math.isfinite(row.margin) else f" (margin +-{num(row.margin, 3)})"
    sequential = "confidence sequence" in row.method
    note = getattr(row, "note", "")
    if row.verdict == UNTESTED:
        return f"- {name}: {note or 'not tested (fewer than 2 seeds shared with the baseline)'}."
    if row.verdict == UNDECIDABLE and note:
        return f"- {name}: cannot decide: {note}. Observed: {change}; {spread}."
    if row.verdict == UNDECIDABLE:
        return (f"- {name}: cannot decide: with {row.n} seeds and {m} comparison(s) in the family no interval at "
                f"{row.confidence * 100:.4g}% can exclude anything; it takes at least "
                f"{min_seeds_to_decide(m, alpha, sequential)} seeds per arm (`lime plan` sizes it for an effect). "
                f"Observed: {change}; {spread}.")
    if row.verdict in (BETTER, WORSE):
        small = (f"; the whole interval lies inside the margin +-{num(row.margin, 3)}: a real difference smaller "
                 "than the sweep calls negligible" if row.within_margin else "")
        # a fixed-n p-value means nothing after seeds were added until decided: the sequence's interval says it
        test = "" if sequential else f" (paired permutation p = {num(row.p_perm, 3)})"
        return (f"- {name}: {row.verdict} than {base} at alpha {alpha:g}: {change}, {row.n} seeds{test}; "
                f"{spread}{small}.")
    if row.verdict == EQUIVALENT:
        return (f"- {name}: equivalent to {base} within the margin +-{num(row.margin, 3)}: {change} lies inside it "
                f"(two one-sided tests, each at {alpha / (2 * m):.3g}), {row.n} seeds; {spread}.")
    if sequential:
        return (f"- {name}: not decided at the cap ({row.n} seeds): {change} holds 0{margin}; {spread}.")
    mde = ("not reachable" if not math.isfinite(row.mde) else
           f"{num(row.mde, 3)} ({abs(row.mde_pct):.2f}% of the baseline)")
    return (f"- {name}: not decided against {base} at alpha {alpha:g} ({row.n} seeds): {change} holds 0"
            f"{margin}. The smallest difference this design decides with 80% power (normal differences) is "
            f"{mde}; {spread}. {seeds_to_decide(row)}")


def seeds_to_decide(row: Any) -> str:
    """How many seeds per arm would decide a not-decided comparison if its observed effect were true."""
    dz = abs(float(getattr(row, "d_z", math.nan)))
    if not (math.isfinite(dz) and dz > 0):
        return ""
    n = verdict_seeds(float(row.confidence), dz)
    need = f"{n} seeds per arm" if n is not None else f"more than {MAX_SEEDS} seeds per arm"
    return (f"Were the observed effect (d_z {dz:.2f}) the true one, the rule would decide it with 80% power at "
            f"{need} (normal differences; `lime plan` sizes a design).")


def pair_sentence(p: Any, alpha: float) -> str:
    """One all-pairs comparison (a - b per seed) in words."""
    head = f"- **{cell_text(p.a)}** vs **{cell_text(p.b)}**" + ("" if p.scope == "all" else f" ({p.scope})")
    iv = f"mean per-seed difference {num(p.diff_mean, 4)}, {interval_text(p)}, {p.n} seeds"
    if getattr(p, "note", ""):
        iv += f"; {p.note}"
    if p.verdict in (BETTER, WORSE):
        return f"{head}: {cell_text(p.a)} is {p.verdict} ({iv}, permutation p = {num(p.p_perm, 3)})."
    if p.verdict == EQUIVALENT:
        return f"{head}: equivalent within the margin +-{num(p.margin, 3)} ({iv})."
    return f"{head}: {p.verdict} ({iv})."


def direction_words(mode: str) -> str:
    return "lower is better" if mode == "min" else "higher is better"
