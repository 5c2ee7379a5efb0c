"""How many seeds a comparison needs at the spread it shows: the fewest seeds at which the verdict
rule's confidence sequence (the median's sign sequence, the one the waves stop on) of typical normal
differences (their quantiles, not a random draw) with a given median and sd is decided: it excludes
0 ("better" or "worse") or lies inside +-margin ("equivalent").

Two readers:
- the margin's reach at the cap (``margin_seeds``): with a true difference of 0, the best case for
  an "equivalent" verdict; more seeds than the cap at the sd of the first look means the margin is
  out of reach: the sweep says so at its first look (``orchestrator.sweep.decide``) and the report
  says it again (``orchestrator.report.render.sequential``);
- the cost budget (``orchestrator.decide.budget``, ``seeds_needed``): before each wave, the seeds
  an undecided comparison needs at its observed median and sd, priced against what the budget has
  left.
Both assume the spread stays what the look saw.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps

from orchestrator.decide import signs

LIMIT = 100_000  # seeds per arm beyond which a projection says "more than LIMIT"


@lru_cache(maxsize=1 << 16)
def half_width(n: int, level: float) -> float:
    """The half-width, in sd, of the sign sequence at ``level`` of n typical normal differences with
    median 0 (the quantiles (i - 0.5) / n): its order statistics [z_(k), z_(n+1-k)] are
    -+Phi^-1((k - 0.5) / n); inf while the sequence is the whole line. The larger of the two ends
    (they differ in the last digits only), so that "inside" here is inside for the sample itself."""
    k = signs.sequence_depth(n, level)
    if k == 0:
        return math.inf
    p = (k - 0.5) / n
    return float(max(-sps.norm.ppf(p), sps.norm.ppf(1.0 - p)))


def seeds_needed(sd: float, level: float, margin: float | None = None, center: float = 0.0,
                 limit: int = LIMIT) -> int | None:
    """About the fewest seeds at which the sequence of typical differences with median ``center`` and
    sd ``sd`` is decided: [center - sd w, center + sd w] (w = ``half_width``) excludes 0, i.e.
    sd w < |center|, or lies inside +-``margin``, i.e. sd w < margin - |center|. None above ``limit``
    (or when neither can happen: a center of 0 without a margin). The sequence's limits are order
    statistics, so its width falls with n only up to their steps: doubling then bisection finds a
    seed count that fits, at most a few percent above the first one that does
    (tests/orchestrator/report/test_sequential_report.py, tests/orchestrator/decide/test_budget.py)."""
    if not sd >= 0 or not math.isfinite(center):
        return None
    room = abs(center)
    if margin is not None and margin > 0:
        room = max(room, margin - abs(center))
    if not room > 0:
        return None

    def fits(n: int) -> bool:
        return sd * half_width(n, level) < room  # 0 * inf is nan: not a fit

    n = 2
    while not fits(n):  # doubling, then bisection: the width falls with n once it is finite
        if n >= limit:
            return None
        n = min(2 * n, limit)
    lo = n // 2
    while lo + 1 < n:
        mid = (lo + n) // 2
        lo, n = (lo, mid) if fits(mid) else (mid, n)
    return n


def margin_seeds(sd: float, margin: float, level: float, limit: int = LIMIT) -> int | None:
    """About the fewest seeds at which the sequence of typical differences with median 0 and sd ``sd``
    lies inside +-``margin`` (the best case for an "equivalent" verdict at that spread); None above
    ``limit``."""
    if not (margin > 0):
        return None
    return seeds_needed(sd, level, margin, 0.0, limit)


def out_of_reach(diffs: dict, margin: float | None, level: float, cap: int) -> list[str]:
    """One line per comparison (variant -> its per-seed differences at this look) whose margin needs
    more seeds than ``cap`` at the sd it shows."""
    out = []
    for v, d in diffs.items():
        d = np.asarray(d, np.float64)
        if margin is None or len(d) < 2:
            continue
        sd = float(d.std(ddof=1))
        need = margin_seeds(sd, margin, level)
        if need is None or need > cap:
            out.append(f"{v}: the margin +-{margin:g} is out of reach at the cap of {cap} seeds: at the sd "
                       f"{sd:.3g} of its {len(d)} seeds an \"equivalent\" verdict needs "
                       + (f"{need} seeds" if need is not None else f"more than {LIMIT} seeds")
                       + " even with a true difference of 0")
    return out
