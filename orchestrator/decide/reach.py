"""Whether an equivalence margin can be met within a sequential design's cap: the fewest seeds at
which the verdict rule's confidence sequence (the median's sign sequence, the one the waves stop
on) of typical normal differences with median 0 and a given sd (their quantiles, not a random draw)
lies inside +-margin. A true difference of 0 is the best case for an "equivalent" verdict, so more
seeds than the cap at the sd of the first look means the margin is out of reach: the sweep says so
at its first look (``orchestrator.sweep.decide``) and the report says it again
(``orchestrator.report.render.sequential``). It assumes the sd stays what the first look saw.
"""
from __future__ import annotations

import numpy as np
from scipy import stats as sps

from orchestrator.decide import rule


def margin_seeds(sd: float, margin: float, level: float, limit: int = 100_000) -> int | None:
    """About the fewest seeds at which the sequence of typical differences with median 0 and sd ``sd``
    lies inside +-``margin`` (the best case for an "equivalent" verdict at that spread); None above
    ``limit``. The sign sequence's limits are order statistics, so its width falls with n only up
    to their steps: doubling then bisection finds a seed count that fits, at most a few percent
    above the first one that does (tests/orchestrator/report/test_sequential_report.py)."""
    if not (margin > 0) or not sd >= 0:
        return None

    def inside(n: int) -> bool:
        z = sps.norm.ppf((np.arange(n) + 0.5) / n)  # n normal quantiles: median 0, sd about 1
        iv = rule.median_interval(sd * z, level, sequential=True)
        return iv.finite and -margin < iv.low and iv.high < margin

    n = 2
    while not inside(n):  # doubling, then bisection: the width falls with n once it is finite
        if n >= limit:
            return None
        n = min(2 * n, limit)
    lo = n // 2
    while lo + 1 < n:
        mid = (lo + n) // 2
        lo, n = (lo, mid) if inside(mid) else (mid, n)
    return n


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
                       + (f"{need} seeds" if need is not None else "more than 100000 seeds")
                       + " even with a true difference of 0")
    return out
