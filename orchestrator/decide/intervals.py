"""The fixed-n interval of a paired mean difference: the hull of two intervals that cover.

``t_interval`` is Student's t interval of the mean (exact for normal per-seed differences).
``sign_flip_interval`` inverts the report's exact sign-flip permutation test: the set of mu for which
the test of "the differences d - mu are symmetric about 0" has p >= a. Every sign vector s gives a
range of mu over which its flipped sum is at least as extreme as the observed one: the segment
between the mean of the d_i it flips and the mean of those it keeps (Hartigan 1969: the limits are
subset means), and it always contains mean(d), so the confidence set is one interval whose limits
are order statistics of those segment ends. It covers at least 1 - a for any continuous distribution
symmetric about its mean; while 2 / 2^n >= a (5 seeds or fewer at a = 0.05) it is the whole line: no
data could reject anything.

``paired_interval`` is their hull (the union's span): the set of mu that at least one of the two
tests keeps, so a difference counts as shown only when both the t-test and the exact permutation
test reject. The t interval alone under-covers skewed differences (93.3% at 8 seeds for gamma(4)
differences), the sign-flip interval alone under-covers them too (93.9%); the hull covers 94.3% there,
95.8% for normal ones, and is infinite below 6 seeds at 95% (coverage 1: a verdict needs 6 seeds).
The coverage simulation is ``tests/orchestrator/decide/test_coverage.py``; docs/STATISTICS.md has
the table. Strongly skewed differences (exponential) still under-cover (90.6% at 8 seeds): no
interval of a mean from 8 samples avoids that without assuming a shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats as sps

EXACT_MAX_FLIPS = 1 << 16  # enumerate every sign vector up to 16 seeds, else seeded Monte-Carlo
MC_FLIPS = 20_000
HULL = "t ∪ sign-flip"  # the method name the report prints


@dataclass(frozen=True)
class Interval:
    """A confidence interval (or one time of a confidence sequence) of a mean difference."""

    low: float
    high: float
    level: float  # confidence, e.g. 0.975
    n: int  # per-seed differences it rests on
    method: str

    @property
    def finite(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def t_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    """Student's t interval of mean(d); the whole line below 2 values, a point when all are equal."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n < 2:
        return -math.inf, math.inf
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
    half = float(sps.t.ppf(0.5 + level / 2, n - 1)) * se
    return mean - half, mean + half


@lru_cache(maxsize=32)
def _all_signs(n: int) -> np.ndarray:
    bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    return (1 - 2 * bits).astype(np.float64)  # (2^n, n)


def _signs(n: int, seed: int) -> tuple[np.ndarray, bool]:
    if 2**n <= EXACT_MAX_FLIPS:
        return _all_signs(n), True
    rng = np.random.default_rng([seed, n])
    return 1.0 - 2.0 * rng.integers(0, 2, size=(MC_FLIPS, n)), False


def segments(d: np.ndarray, signs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each sign vector, the range of mu where |sum s (d - mu)| >= |sum (d - mu)|: between the
    mean of the flipped values and the mean of the kept ones (the whole line for +-all ones)."""
    n, total = len(d), float(d.sum())
    sd = signs @ d  # (B,)
    k = signs.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        flipped = (total - sd) / (n - k)  # the mean of the d_i with s_i = -1
        kept = (total + sd) / (n + k)  # the mean of the d_i with s_i = +1
    trivial = np.abs(k) == n
    lo = np.where(trivial, -np.inf, np.minimum(flipped, kept))
    hi = np.where(trivial, np.inf, np.maximum(flipped, kept))
    return lo, hi


def sign_flip_interval(d: np.ndarray, level: float, seed: int = 0) -> tuple[float, float]:
    """The set of mu that the two-sided sign-flip test of mean(d - mu) = 0 keeps at 1 - level.

    Exact over all 2^n sign vectors up to 16 values (p = count / 2^n); above, ``MC_FLIPS`` seeded
    random ones (p = (1 + count) / (1 + B), which is a valid p-value for every mu)."""
    d = np.asarray(d, np.float64)
    n = len(d)
    a = 1.0 - level
    if n == 0:
        return -math.inf, math.inf
    signs, exact = _signs(n, seed)
    lo, hi = segments(d, signs)
    # p(mu) >= a  <=>  count(mu) >= need, count(mu) = #{segments holding mu}
    need = math.ceil(a * len(signs) - 1e-9) if exact else math.ceil(a * (len(signs) + 1) - 1e-9) - 1
    if need <= (2 if exact else 0):  # the trivial vectors alone keep every mu
        return -math.inf, math.inf
    need = min(need, len(signs))
    upper = float(np.partition(hi, len(hi) - need)[len(hi) - need])  # the need-th largest upper end
    lower = float(np.partition(lo, need - 1)[need - 1])  # the need-th smallest lower end
    return lower, upper


def sign_flip_p(d: np.ndarray, mu: float = 0.0, seed: int = 0) -> float:
    """The two-sided sign-flip p of mean(d) = mu with the same sign vectors as the interval."""
    d = np.asarray(d, np.float64) - mu
    if not len(d) or not np.any(d):
        return 1.0
    signs, exact = _signs(len(d), seed)
    obs = abs(float(d.sum()))
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    hits = int(np.sum(np.abs(signs @ d) >= obs - tol))
    return hits / len(signs) if exact else (1 + hits) / (1 + len(signs))


def paired_interval(d: np.ndarray, level: float, seed: int = 0) -> Interval:
    """The hull of the t and the sign-flip intervals at ``level`` (see the module docstring)."""
    d = np.asarray(d, np.float64)
    t_lo, t_hi = t_interval(d, level)
    s_lo, s_hi = sign_flip_interval(d, level, seed)
    return Interval(min(t_lo, s_lo), max(t_hi, s_hi), level, len(d), HULL)


def min_seeds_finite(level: float) -> int:
    """The fewest differences whose sign-flip interval (and so the hull) is finite at ``level``."""
    n = 1
    while not (1.0 - level) * 2 ** (n - 1) > 1 + 1e-12:  # the most extreme flip's p, 2 / 2^n, below 1 - level
        n += 1
    return n


# -- many samples at once (the coverage simulations and the power of a design) ----------------------------
def paired_intervals(d: np.ndarray, level: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``paired_interval`` of every row of d (sims, n), vectorised: (lows, highs)."""
    d = np.asarray(d, np.float64)
    sims, n = d.shape
    if n < 2:
        return np.full(sims, -np.inf), np.full(sims, np.inf)
    mean, se = d.mean(axis=1), d.std(axis=1, ddof=1) / math.sqrt(n)
    half = float(sps.t.ppf(0.5 + level / 2, n - 1)) * se
    signs, exact = _signs(n, seed)
    a = 1.0 - level
    need = math.ceil(a * len(signs) - 1e-9) if exact else math.ceil(a * (len(signs) + 1) - 1e-9) - 1
    if need <= (2 if exact else 0):
        return np.full(sims, -np.inf), np.full(sims, np.inf)
    need = min(need, len(signs))
    total, k = d.sum(axis=1, keepdims=True), signs.sum(axis=1)[None, :]
    lows, highs = np.empty(sims), np.empty(sims)
    for i in range(0, sims, 512):  # (chunk, 2^n) segment ends at a time
        sd = d[i:i + 512] @ signs.T
        with np.errstate(divide="ignore", invalid="ignore"):
            flipped, kept = (total[i:i + 512] - sd) / (n - k), (total[i:i + 512] + sd) / (n + k)
        trivial = np.abs(k) == n
        lo = np.where(trivial, -np.inf, np.minimum(flipped, kept))
        hi = np.where(trivial, np.inf, np.maximum(flipped, kept))
        lows[i:i + 512] = np.partition(lo, need - 1, axis=1)[:, need - 1]
        highs[i:i + 512] = np.partition(hi, hi.shape[1] - need, axis=1)[:, hi.shape[1] - need]
    return np.minimum(mean - half, lows), np.maximum(mean + half, highs)
