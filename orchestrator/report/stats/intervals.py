"""Confidence intervals of a mean on plain arrays.

The percentile bootstrap (seeded: the same data and seed give the same interval).
"""
from __future__ import annotations

import warnings

import numpy as np
from scipy import stats as sps

from orchestrator.report.stats.ranks import rng_kwargs


def bootstrap_ci(x: np.ndarray, confidence: float, n_resamples: int,
                 seed: int) -> tuple[float, float]:
    """The percentile-bootstrap CI of the mean of x."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate-data warnings become notes upstream
        res = sps.bootstrap((x,), np.mean, confidence_level=confidence, method="percentile",
                            n_resamples=n_resamples, **rng_kwargs(sps.bootstrap, seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
