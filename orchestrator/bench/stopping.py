"""When the benchmark stops adding paired rounds to a row (torch-free).

A row's per-round ratios (its step over the mean of the two ``none`` steps around it, ``timing``)
are looked at after every round, so a fixed-n interval would lose its level to the repeated looks.
The bench uses the project's anytime-valid interval of a median instead: the sign confidence
sequence of ``orchestrator.decide.signs`` (the one the sweep's sequential sign rule uses; for the
true median ratio m, P(the sequence ever excludes m) <= 1 - level, whatever the ratios'
distribution and however often it is looked at). A row stops when

- it has a target (a routed row, ratio target 1 + target % / 100) and its interval lies on one side
  of it: ``meets`` (upper end <= target) or ``misses`` (lower end > target);
- it has no target (the peers, the depth mixes) and its interval is at most ``width`` wide;
- or it reached its cap (``undecided`` for a target row whose interval still straddles it).

A ``meets`` verdict for a row whose true median equals its target is then an error of probability at
most 1 - level (``tests/orchestrator/bench/test_stopping.py`` simulates it). The sequence is the
whole line below ``min_rounds`` (7 at 95%), so no row stops before that.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.decide.signs import min_seeds, sign_sequence

LEVEL = 0.95
# rows without a target stop once the interval of their median ratio is at most 4 points wide
# (+-2% of none's step: finer than the +-15% drift of this VM's matmuls that pairing cancels)
WIDTH = 0.04


@dataclass(frozen=True)
class Stopping:
    """The stopping rule: ``level`` of the confidence sequence, ``width`` for rows without a target
    (ratio units), ``cap`` rounds at most."""

    cap: int
    level: float = LEVEL
    width: float = WIDTH

    @property
    def min_rounds(self) -> int:
        """The fewest rounds whose sequence is finite: no row can stop earlier."""
        return min_seeds(self.level, sequential=True)

    def interval(self, ratios) -> tuple[float, float]:
        """The confidence sequence of the median ratio after these rounds."""
        return sign_sequence(np.asarray(ratios, np.float64), self.level)

    def side(self, ratios, target: float | None) -> str:
        """``meets`` / ``misses`` the ratio target (1 + target % / 100), ``undecided``; ``-`` without one."""
        if target is None:
            return "-"
        lo, hi = self.interval(ratios)
        return "meets" if hi <= target else "misses" if lo > target else "undecided"

    def done(self, ratios, target: float | None) -> bool:
        """Whether a row with these ratios stops (before its next round)."""
        if len(ratios) >= self.cap:
            return True
        if target is None:
            lo, hi = self.interval(ratios)
            return hi - lo <= self.width
        return self.side(ratios, target) != "undecided"


def ratio_target(target_pct: float | None) -> float | None:
    """A step-time target in percent of overhead as a ratio to none's step."""
    return None if target_pct is None else 1.0 + target_pct / 100.0
