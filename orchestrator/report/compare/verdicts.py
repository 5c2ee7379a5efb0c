"""Verdicts: is a variant better or worse than the baseline, or can this sweep not tell?

A verdict reads one paired comparison (``orchestrator.report.compare.by_seed``): the Holm-adjusted p of
the paired permutation test of the mean difference, the smallest Holm-adjusted p the design
can reach, and the direction of the metric. The rules, in order:

1. fewer than 2 common seeds: "not tested";
2. the smallest reachable Holm-adjusted p is >= alpha: "cannot decide" (no data could make it
   significant, so no direction is claimed, whatever the means say);
3. Holm-adjusted p < alpha: "better" or "worse", from the sign of the mean difference and the
   metric's direction;
4. otherwise "no detectable difference", with the minimal detectable effect at this n (the
   true mean difference the test finds with 80% power, ``orchestrator.report.stats.power``) and the
   observed spread of the per-seed differences, so "no difference" is never read as "equal".

The direction: lower is better unless the metric's name says accuracy (``acc``, ``exact``,
``score``, the sweep layer's rule) or the sweep sets ``report.mode``.
"""
from __future__ import annotations

import math
from typing import Any

from orchestrator.core.fmt import cell_text, num, pct

BETTER, WORSE, SAME, UNDECIDABLE, UNTESTED, BASELINE = (
    "better", "worse", "no detectable difference", "cannot decide", "not tested", "baseline")
MAX_WORDS = ("acc", "exact", "score")


def metric_mode(metric: str, mode: str | None = None) -> str:
    """"min" or "max": the sweep's ``report.mode`` when given, else from the metric's name."""
    if mode in ("min", "max"):
        return mode
    return "max" if any(w in metric for w in MAX_WORDS) else "min"


def improvement(diff: float, mode: str) -> float:
    """A difference variant - baseline turned so that positive is better."""
    return -diff if mode == "min" else diff


def verdict(n: int, diff: float, p_holm: float, min_p_holm: float, alpha: float, mode: str) -> str:
    """One of better / worse / no detectable difference / cannot decide / not tested."""
    if n < 2 or math.isnan(p_holm):
        return UNTESTED
    if min_p_holm >= alpha:
        return UNDECIDABLE
    if p_holm < alpha and diff != 0:
        return BETTER if improvement(diff, mode) > 0 else WORSE
    return SAME


def min_seeds_to_decide(m: int, alpha: float) -> int:
    """The fewest seeds per arm at which m paired comparisons can reach a Holm p below alpha."""
    n = 2
    while m * 2.0 / 2**n >= alpha:
        n += 1
    return n


def sentence(row: Any, baseline: Any, alpha: float, mode: str, m: int) -> str:
    """The verdict of one ``PairedRow`` in words (markdown, one line)."""
    name, base = f"**{cell_text(row.variant)}**", f"`{cell_text(baseline)}`"
    change = (f"{pct(row.diff_pct)} (mean per-seed difference {num(row.diff_mean, 4)}, "
              f"{row.confidence * 100:g}% CI [{num(row.ci_low, 4)}, {num(row.ci_high, 4)}])")
    spread = f"sd of the per-seed differences {num(row.diff_sd, 3)}"
    if row.verdict == UNTESTED:
        return f"- {name}: not tested (fewer than 2 seeds shared with the baseline)."
    if row.verdict == UNDECIDABLE:
        return (f"- {name}: cannot decide: with {row.n} seeds and {m} comparison(s) the smallest "
                f"reachable Holm-adjusted p is {num(row.min_p_holm, 3)} >= {alpha:g}, so no result could "
                f"be significant; it takes at least {min_seeds_to_decide(m, alpha)} seeds per arm "
                f"(`lime plan` sizes it for an effect). Observed: {change}; {spread}.")
    if row.verdict in (BETTER, WORSE):
        return (f"- {name}: {row.verdict} than {base} at alpha {alpha:g}: {change}, paired permutation "
                f"p = {num(row.p_perm, 3)}, Holm {num(row.p_perm_holm, 3)}, {row.n} seeds; {spread}.")
    mde = ("not reachable" if not math.isfinite(row.mde) else
           f"{num(row.mde, 3)} ({abs(row.mde_pct):.2f}% of the baseline)")
    return (f"- {name}: no detectable difference from {base} at alpha {alpha:g} (Holm p = "
            f"{num(row.p_perm_holm, 3)}, {row.n} seeds): {change}. The smallest mean difference "
            f"this design detects with 80% power is {mde}; {spread}.")


def direction_words(mode: str) -> str:
    return "lower is better" if mode == "min" else "higher is better"
