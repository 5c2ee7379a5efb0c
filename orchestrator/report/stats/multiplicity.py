"""Multiple comparisons: Holm's step-down adjustment, and the smallest adjusted p a family can reach.

Pure functions on lists of p-values (no frames, no MLflow).
"""
from __future__ import annotations

import gc

from statsmodels.stats.multitest import multipletests


def holm(pvalues: list[float], alpha: float = 0.05) -> tuple[list[float], list[bool]]:
    """Holm-adjusted p-values and which of them are below alpha (statsmodels "holm")."""
    if not pvalues:
        return [], []
    # statsmodels' Holm branch runs gc.collect() on every call, a full heap scan that costs
    # ~0.2 s once torch/scipy are loaded. Freezing the existing objects for the call limits the
    # scan to new ones; unfreeze puts them back, so nothing else changes.
    gc.freeze()
    try:
        reject, adjusted, _, _ = multipletests(pvalues, alpha=alpha, method="holm")
    finally:
        gc.unfreeze()
    return [float(x) for x in adjusted], [bool(x) for x in reject]


def holm_min_p(min_ps: list[float]) -> list[float]:
    """A lower bound on the Holm-adjusted p each comparison can reach: its own smallest p, and
    never below m times the family's smallest (Holm's first step). Exact when all are equal."""
    if not min_ps:
        return []
    floor = len(min_ps) * min(min_ps)
    return [min(1.0, max(p, floor)) for p in min_ps]
