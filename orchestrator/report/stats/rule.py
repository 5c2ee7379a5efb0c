"""The one fixed-n interval of a paired difference that every report section prints (verdict tables,
iso-FLOP changes, the depth view), and its name. Sections call ``interval`` and print ``LABEL``
instead of importing the verdict rule's function themselves, so that when the rule changes
(``orchestrator.decide.intervals``) every printed interval and its label follow it; a section with
its own interval (the percentile bootstrap the iso-FLOP table used covered 75-89% at the shipped seed
counts) would print a number the verdicts do not stand behind.
"""
from __future__ import annotations

import numpy as np

from orchestrator.decide import intervals

LABEL = intervals.HULL  # the name of the interval the reports print


def interval(d: np.ndarray, level: float, seed: int = 0) -> intervals.Interval:
    """The verdict rule's fixed-n interval of the per-seed differences ``d`` at ``level``."""
    return intervals.paired_interval(np.asarray(d, np.float64), level, seed)


def label(level: float) -> str:
    """The column text of an interval at ``level``, e.g. "95% t ∪ sign-flip"."""
    return f"{100 * level:.4g}% {LABEL}"


def sequence(d: np.ndarray, level: float) -> intervals.Interval:
    """The sequential rule's anytime-valid interval (the confidence sequence) after ``len(d)`` seeds."""
    from orchestrator.decide.sequential import confidence_sequence  # the one the waves stop on

    return confidence_sequence(np.asarray(d, np.float64), level)


def margin_seeds(sd: float, margin: float, level: float, limit: int = 100_000) -> int | None:
    """The fewest seeds at which the sequence of differences with mean 0 and sd ``sd`` lies inside
    +-``margin`` (the best case for an "equivalent" verdict at that spread); None above ``limit``."""
    if not (margin > 0) or not sd >= 0:
        return None

    def inside(n: int) -> bool:
        z = np.arange(n, dtype=np.float64)
        z = (z - z.mean()) / z.std(ddof=1)  # mean 0, sd 1 exactly
        iv = sequence(sd * z, level)
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
