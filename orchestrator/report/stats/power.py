"""Power of the report's paired verdict tests, by seeded simulation; torch-free, numbers only.

The model behind every number: m variants are each compared with one baseline on n seeds (the
blocks). A seed's shared part (data order, shared initial weights) cancels in the per-seed
difference, so only each arm's own noise matters: every arm gets N(0, 1/2) per seed, which gives
the paired differences unit variance (and correlation 1/2 between comparisons, as they share the
baseline's seeds). One variant is shifted by ``dz`` (the standardized paired effect: mean
difference / sd of the per-seed differences, Cohen's d_z); the other m - 1 equal the baseline,
which is the hardest case for Holm. Power is the fraction of simulated sweeps in which the
shifted comparison's Holm-adjusted p is below alpha.

The tests are the report's: the paired sign-flip permutation test of the mean difference
(exact enumeration up to ``EXACT_SIM_N`` seeds; above, its p is approximated by the paired
t-test's, which it matches closely for normal differences at that size) and the exact
Wilcoxon signed-rank test (its null distribution for n untied differences, up to 50; above,
the normal approximation). Everything is seeded: the same arguments give the same numbers.

``mde_dz`` inverts this (the d_z detected with the wanted power at n seeds) and
``seeds_needed`` searches n; ``normal_power`` is the closed-form check used by the tests.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps

from orchestrator.report.stats.paired import WILCOXON_EXACT_MAX, sign_matrix

EXACT_SIM_N = 12  # 2^12 sign vectors per simulated comparison: exact and still fast
SIMS = 2000  # simulated sweeps per power value (standard error <= 0.011)
CHUNK = 250
TESTS = ("permutation", "wilcoxon")
MAX_SEEDS = 200


def holm_adjust(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values along the last axis (min(1, running max of (m - i) p_(i)))."""
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    adj = np.minimum(1.0, np.maximum.accumulate(sorted_p * (m - np.arange(m)), axis=-1))
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    return out


def _perm_p(d: np.ndarray) -> np.ndarray:
    """Two-sided sign-flip p of each row of d (sims, n)."""
    n = d.shape[1]
    if n > EXACT_SIM_N:
        t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
        return 2 * sps.t.sf(np.abs(t), n - 1)
    flips = sign_matrix(n)  # (2^n, n)
    out = np.empty(len(d))
    for i in range(0, len(d), CHUNK):
        part = d[i:i + CHUNK]
        obs = np.abs(part.sum(axis=1, keepdims=True))
        tol = 1e-9 * np.maximum(1.0, np.abs(part).sum(axis=1, keepdims=True))
        out[i:i + CHUNK] = np.mean(np.abs(part @ flips.T) >= obs - tol, axis=1)
    return out


@lru_cache(maxsize=64)
def _wilcoxon_table(n: int) -> np.ndarray:
    """Two-sided exact p of W+ = 0..n(n+1)/2 for n untied, nonzero differences."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:len(counts) - r]
        counts = counts + shifted
    total = n * (n + 1) / 2
    dev = np.abs(2 * np.arange(len(counts)) - total)
    return np.array([counts[dev >= x].sum() for x in dev]) / 2.0**n


def _wilcoxon_p(d: np.ndarray) -> np.ndarray:
    n = d.shape[1]
    ranks = np.argsort(np.argsort(np.abs(d), axis=1), axis=1) + 1
    w = np.sum(ranks * (d > 0), axis=1)
    if n <= WILCOXON_EXACT_MAX:
        return np.minimum(1.0, _wilcoxon_table(n)[w])
    z = (w - n * (n + 1) / 4) / math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return 2 * sps.norm.sf(np.abs(z))


def _p_values(d: np.ndarray, test: str) -> np.ndarray:
    if test == "permutation":
        return _perm_p(d)
    if test == "wilcoxon":
        return _wilcoxon_p(d)
    raise ValueError(f"unknown test {test!r}; tests: {TESTS}")


@lru_cache(maxsize=256)
def _noise(n: int, m: int, sims: int, seed: int) -> np.ndarray:
    """Per-seed paired differences under H0, (m, sims, n): arm noise N(0, 1/2), minus the
    baseline's. Shared by every effect size (common random numbers keep bisection monotone)."""
    rng = np.random.default_rng([seed, n, m])
    arms = rng.normal(0.0, math.sqrt(0.5), size=(m + 1, sims, n))
    return arms[1:] - arms[0]


def power(n: int, m: int, alpha: float, dz: float, test: str = "permutation", sims: int = SIMS,
          seed: int = 0) -> float:
    """P(Holm-adjusted p of the shifted comparison < alpha) for n seeds and m comparisons."""
    if n < 2 or m < 1:
        return 0.0
    noise = _noise(n, m, sims, seed)
    p = np.stack([_p_values(noise[0] + dz, test)] + [_null_p(n, m, sims, seed, j, test) for j in range(1, m)],
                 axis=1)  # (sims, m)
    return float(np.mean(holm_adjust(p)[:, 0] < alpha))


@lru_cache(maxsize=512)
def _null_p(n: int, m: int, sims: int, seed: int, j: int, test: str) -> np.ndarray:
    """The p-values of a comparison without effect: the same for every effect size, so cached."""
    return _p_values(_noise(n, m, sims, seed)[j], test)


def reachable(n: int, m: int, alpha: float) -> bool:
    """Whether n seeds can give a Holm-adjusted p below alpha over m comparisons (both paired
    tests' smallest exact p is 2 / 2^n)."""
    return n >= 2 and m * 2.0 / 2**n < alpha


def mde_dz(n: int, m: int, alpha: float, target: float = 0.8, test: str = "permutation",
           sims: int = SIMS, seed: int = 0) -> float:
    """The smallest d_z (two decimals) detected with power >= target; inf when n seeds cannot
    reach significance at all."""
    if not reachable(n, m, alpha):
        return math.inf
    lo, hi = 0.0, 1.0
    while power(n, m, alpha, hi, test, sims, seed) < target:
        lo, hi = hi, hi * 2
        if hi > 64:
            return math.inf
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if power(n, m, alpha, mid, test, sims, seed) >= target:
            hi = mid
        else:
            lo = mid
    return math.ceil(hi * 100) / 100


def normal_power(n: int, m: int, alpha: float, dz: float) -> float:
    """Closed-form large-n approximation: a two-sided z-test at alpha / m (Holm's first step)."""
    z = sps.norm.isf(alpha / (2 * m))
    return float(sps.norm.cdf(dz * math.sqrt(n) - z) + sps.norm.cdf(-dz * math.sqrt(n) - z))


def normal_seeds(m: int, alpha: float, dz: float, target: float = 0.8) -> int:
    """The closed-form seed count: ((z_{1-alpha/2m} + z_target) / d_z)^2, rounded up."""
    if dz <= 0:
        return MAX_SEEDS + 1
    z = sps.norm.isf(alpha / (2 * m)) + sps.norm.ppf(target)
    return max(2, math.ceil((z / dz) ** 2))


def seeds_needed(m: int, alpha: float, dz: float, target: float = 0.8, test: str = "permutation",
                 sims: int = SIMS, seed: int = 0) -> int | None:
    """The smallest number of seeds per arm whose simulated power reaches target; None when more
    than ``MAX_SEEDS`` would be needed (or d_z is 0)."""
    if dz <= 0:
        return None
    n = 2
    while not reachable(n, m, alpha):
        n += 1
    if not math.isfinite(dz):  # no spread: the first n that can reach significance does
        return n
    guess = normal_seeds(m, alpha, dz, target)
    if guess > MAX_SEEDS:
        return None
    n = max(n, guess - 2)
    if power(n, m, alpha, dz, test, sims, seed) >= target:
        while n > 2 and reachable(n - 1, m, alpha) and power(n - 1, m, alpha, dz, test, sims, seed) >= target:
            n -= 1
        return n
    while n < MAX_SEEDS:
        n += 1
        if power(n, m, alpha, dz, test, sims, seed) >= target:
            return n
    return None
