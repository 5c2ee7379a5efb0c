"""The one interval every report section prints beside a paired change (iso-FLOP changes, the
depth view, the pruning twins, the sequential looks), and its name: the verdict rule's
(``orchestrator.decide.rule``, the median's sign interval or sign confidence sequence). Sections
call these and print ``label`` instead of choosing an interval themselves, so that a printed
interval is always one the verdicts stand behind (the percentile bootstrap the iso-FLOP table used
before covered 75-89% at the shipped seed counts).
"""
from __future__ import annotations

import numpy as np

from orchestrator.decide import reach, rule, signs
from orchestrator.decide.intervals import Interval

LABEL = signs.FIXED  # the name of the interval the reports print


def interval(d: np.ndarray, level: float, seed: int = 0) -> Interval:
    """The verdict rule's fixed-n interval (of the median) of the per-seed differences ``d``."""
    return rule.median_interval(np.asarray(d, np.float64), level)


def label(level: float) -> str:
    """The column text of an interval at ``level``, e.g. "95% sign (median)"."""
    return f"{100 * level:.4g}% {LABEL}"


def sequence(d: np.ndarray, level: float) -> Interval:
    """The sequential rule's anytime-valid interval (of the median) after ``len(d)`` seeds."""
    return rule.median_interval(np.asarray(d, np.float64), level, sequential=True)


margin_seeds = reach.margin_seeds  # the seeds an "equivalent" verdict needs at a spread (decide.reach)
