"""Rank tests of independent samples, on plain arrays (behind ``orchestrator.report.compare.across_seeds``).

Kruskal-Wallis' permutation p (from rank sums, vectorised), two-sided Mann-Whitney U with the
method chosen for small samples and ties, Cliff's delta and the smallest p a pair of sample
sizes can reach. Why each choice is made is in the docstring of
``orchestrator.report.compare.across_seeds``.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats as sps

EXACT_MWU_MAX_N = 40  # scipy's exact U distribution (no ties) is cheap well beyond this


def rng_kwargs(func: Callable[..., Any], seed: int) -> dict[str, Any]:
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
                                     **rng_kwargs(sps.PermutationMethod, seed))
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
                               **rng_kwargs(sps.permutation_test, seed))
    # scipy enumerates exactly when n_resamples >= the number of distinct assignments.
    if n_resamples >= distinct:
        return float(res.pvalue), "exact", distinct
    return float(res.pvalue), "monte-carlo", n_resamples


