"""Power of the report's verdict rule, by seeded simulation; torch-free, numbers only.

A comparison is decided when its interval at the family's level excludes 0 (since issue 33 the
median's sign interval, ``orchestrator.decide.rule``; before, the mean's t ∪ sign-flip hull). With
Bonferroni each comparison's power depends only on its own n, level
and standardised effect d_z = mean / sd of the per-seed differences, so no other comparison enters.

- ``verdict_power(n, level, dz)``: P(decided) for N(d_z, 1) differences, exact: the sign interval
  [d_(k), d_(n+1-k)] excludes 0 when n + 1 - k differences fall on one side, each with probability
  Phi(d_z) (``signs.fixed_depth``).
- ``verdict_mde_dz(n, level)``: the d_z found with 80% power (two decimals), inf when n seeds cannot
  give a finite interval at that level.
- ``verdict_seeds(level, dz)``: the fewest seeds per arm with that power (None above ``MAX_SEEDS``).
- ``sequential_seeds(level, dz, first, wave, max_seeds)``: the mean seeds the sequential design uses
  (the median's sign confidence sequence, ``orchestrator.decide.signs``) until it excludes 0, and
  its power, by simulation.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps

from orchestrator.decide import signs

SIMS = 2000
MAX_SEEDS = 200
TARGET = 0.8


def min_seeds_finite(level: float) -> int:
    return signs.min_seeds(level)


def verdict_power(n: int, level: float, dz: float, sims: int = SIMS, seed: int = 0) -> float:
    """P(the sign interval at ``level`` excludes 0) for n differences N(dz, 1), exact (``sims`` and
    ``seed`` are kept for the callers; nothing is simulated)."""
    k = signs.fixed_depth(n, level)
    if k == 0:
        return 0.0
    need, p = n + 1 - k, float(sps.norm.cdf(dz))
    return float(sps.binom.sf(need - 1, n, p) + sps.binom.sf(need - 1, n, 1 - p))


@lru_cache(maxsize=1024)
def verdict_mde_dz(n: int, level: float, target: float = TARGET, sims: int = SIMS, seed: int = 0) -> float:
    """The smallest d_z (two decimals) decided with power >= target at n seeds; inf if unreachable."""
    if n < min_seeds_finite(level):
        return math.inf
    lo, hi = 0.0, 1.0
    while verdict_power(n, level, hi, sims, seed) < target:
        lo, hi = hi, hi * 2
        if hi > 64:
            return math.inf
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if verdict_power(n, level, mid, sims, seed) >= target:
            hi = mid
        else:
            lo = mid
    return math.ceil(hi * 100) / 100


def verdict_seeds(level: float, dz: float, target: float = TARGET, sims: int = SIMS, seed: int = 0) -> int | None:
    """The fewest seeds per arm decided with power >= target (None: more than ``MAX_SEEDS``, or no effect)."""
    if not dz > 0:
        return None
    n = min_seeds_finite(level)
    if math.isfinite(dz):
        z = sps.norm.isf((1 - level) / 2) + sps.norm.ppf(target)
        n = max(n, math.ceil((z / dz) ** 2) - 2)  # the normal approximation, less a margin
    while n <= MAX_SEEDS:
        if not math.isfinite(dz) or verdict_power(n, level, dz, sims, seed) >= target:
            while n - 1 >= min_seeds_finite(level) and math.isfinite(dz) and \
                    verdict_power(n - 1, level, dz, sims, seed) >= target:
                n -= 1
            return n
        n += 1
    return None


@lru_cache(maxsize=256)
def sequential_seeds(level: float, dz: float, first: int, wave: int, max_seeds: int, sims: int = SIMS,
                     seed: int = 0) -> tuple[float, float]:
    """(mean seeds used, power) of the sequential design for N(dz, 1) differences: looks after
    ``first`` seeds, then every ``wave`` more, up to ``max_seeds``."""
    d = np.random.default_rng([seed, 7]).normal(size=(sims, max_seeds)) + dz
    used = np.full(sims, float(max_seeds))
    hit = np.zeros(sims, bool)
    looks = list(range(first, max_seeds, wave)) + [max_seeds]
    for n in looks:
        lo, hi = signs.intervals_rows(d[:, :n], level, sequential=True)
        now = ~hit & ((lo > 0) | (hi < 0))
        used[now] = n
        hit |= now
    return float(used.mean()), float(hit.mean())
