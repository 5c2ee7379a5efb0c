"""The rank tests and intervals behind ``orchestrator.report.stats.compare``.

Kruskal-Wallis' permutation p (from rank sums, vectorised), two-sided Mann-Whitney U with the
method chosen for small samples and ties, Holm's correction, Cliff's delta, the smallest p a
pair of sample sizes can reach, and the percentile-bootstrap CI of a mean. Why each choice is
made is in the docstring of ``orchestrator.report.stats``.
"""
from __future__ import annotations

import gc
import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

EXACT_MWU_MAX_N = 40  # scipy's exact U distribution (no ties) is cheap well beyond this


def _rng_kwargs(func: Callable[..., Any], seed: int) -> dict[str, Any]:
    """scipy renamed random_state to rng (1.15); pass whichever the installed version has."""
    name = "rng" if "rng" in inspect.signature(func).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def cliffs_delta(a: np.ndarray, b: np.ndarray) -> float:
    """P(a > b) - P(a < b) over all pairs; equals the rank-biserial correlation 2U/(n_a n_b) - 1."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.sign(a[:, None] - b[None, :]).mean())


def min_reachable_p(n_a: int, n_b: int) -> float:
    """Smallest two-sided exact Mann-Whitney p-value for n_a vs n_b samples (no ties)."""
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


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


def mann_whitney(a: np.ndarray, b: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float, str]:
    """Two-sided Mann-Whitney U of a vs b: (U of a, p, the method used)."""
    pooled = np.concatenate([a, b])
    if np.all(pooled == pooled[0]):
        # Every split gives the same U, so the exact p is 1; scipy's approximation would divide 0/0.
        return len(a) * len(b) / 2.0, 1.0, "all values identical"
    ties = len(np.unique(pooled)) < len(pooled)
    if not ties and len(pooled) <= EXACT_MWU_MAX_N:
        res = sps.mannwhitneyu(a, b, alternative="two-sided", method="exact")
        return float(res.statistic), float(res.pvalue), "exact"
    if ties and math.comb(len(pooled), len(a)) <= n_resamples:
        perm = sps.PermutationMethod(n_resamples=n_resamples,
                                     **_rng_kwargs(sps.PermutationMethod, seed))
        res = sps.mannwhitneyu(a, b, alternative="two-sided", method=perm)
        return float(res.statistic), float(res.pvalue), "exact permutation (ties)"
    res = sps.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    return float(res.statistic), float(res.pvalue), "asymptotic"


def kruskal_permutation_p(samples: list[np.ndarray], n_resamples: int,
                            seed: int) -> tuple[float, str, int]:
    """The permutation p of Kruskal-Wallis' H: (p, "exact" or "monte-carlo", permutations)."""
    sizes = [len(s) for s in samples]
    n = sum(sizes)
    ranks = sps.rankdata(np.concatenate(samples))
    _, counts = np.unique(ranks, return_counts=True)
    # Tie correction and N are the same for every permutation of the pooled ranks.
    tie_c = 1.0 - float(np.sum(counts**3 - counts)) / (n**3 - n)

    def h_stat(*groups: np.ndarray, axis: int = -1) -> np.ndarray:
        s = sum(np.sum(g, axis=axis) ** 2 / g.shape[axis] for g in groups)
        return (12.0 / (n * (n + 1)) * s - 3.0 * (n + 1)) / tie_c

    bounds = np.cumsum(sizes)[:-1]
    distinct = math.factorial(n) // math.prod(math.factorial(k) for k in sizes)
    res = sps.permutation_test(tuple(np.split(ranks, bounds)), h_stat,
                               permutation_type="independent", vectorized=True,
                               n_resamples=n_resamples, alternative="greater",
                               **_rng_kwargs(sps.permutation_test, seed))
    # scipy enumerates exactly when n_resamples >= the number of distinct assignments.
    if n_resamples >= distinct:
        return float(res.pvalue), "exact", distinct
    return float(res.pvalue), "monte-carlo", n_resamples


def bootstrap_ci(x: np.ndarray, confidence: float, n_resamples: int,
                 seed: int) -> tuple[float, float]:
    """The percentile-bootstrap CI of the mean of x."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate-data warnings become notes upstream
        res = sps.bootstrap((x,), np.mean, confidence_level=confidence, method="percentile",
                            n_resamples=n_resamples, **_rng_kwargs(sps.bootstrap, seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
