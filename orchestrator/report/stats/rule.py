"""The one fixed-n interval of a paired difference that every report section prints (verdict tables,
iso-FLOP changes, the depth view), and its name. Sections call ``interval`` and print ``LABEL``
instead of importing the verdict rule's function themselves, so that when the rule changes
(``orchestrator.decide.intervals``) every printed interval and its label follow it; a section with
its own interval (the percentile bootstrap the iso-FLOP table used covered 75-89% at the shipped seed
counts) would print a number the verdicts do not stand behind.
"""
from __future__ import annotations

import numpy as np

from orchestrator.decide import intervals, reach, sequential

LABEL = intervals.HULL  # the name of the interval the reports print


def interval(d: np.ndarray, level: float, seed: int = 0) -> intervals.Interval:
    """The verdict rule's fixed-n interval of the per-seed differences ``d`` at ``level``."""
    return intervals.paired_interval(np.asarray(d, np.float64), level, seed)


def label(level: float) -> str:
    """The column text of an interval at ``level``, e.g. "95% t ∪ sign-flip"."""
    return f"{100 * level:.4g}% {LABEL}"


def sequence(d: np.ndarray, level: float) -> intervals.Interval:
    """The sequential rule's anytime-valid interval (the confidence sequence) after ``len(d)`` seeds."""
    return sequential.confidence_sequence(np.asarray(d, np.float64), level)


margin_seeds = reach.margin_seeds  # the seeds an "equivalent" verdict needs at a spread (decide.reach)
