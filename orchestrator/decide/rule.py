"""The one verdict rule: every verdict of the project (report tables, the sequential waves, the
iso-FLOP and depth views, ``lime prune``) is ``rule.decide`` of the per-seed differences.

- Estimand: the MEDIAN of the paired differences. The verdict's interval is the sign interval
  (fixed n) or the sign confidence sequence (seeds added until decided), ``signs``: exact for any
  distribution, so skewed or contaminated differences cannot inflate the false-"better" rate (the
  mean's intervals reached 2-9x their level there, issue 33). Its price is power: at 8 seeds and
  95% the sign interval excludes 0 only when all 8 differences share a sign (docs/STATISTICS.md).
- Beside it, the MEAN's interval (``intervals.paired_interval``, the t ∪ sign-flip hull; or the
  mixture confidence sequence, ``sequential``), printed but not deciding, with ``flag``: an outlier
  (robust z = (d - median) / (1.4826 MAD) beyond 4, the seeds named) or strong skew (sample skewness
  G1 beyond 2 standard errors): where the flag is set, mean and median can tell different stories.
- "not tested": fewer than 2 differences, or differences of zero variance (identical models, a
  task every model scores 0 on): no statistic can say anything, and such a comparison leaves its
  family (``untested``).
- ``tarone``: in a fixed-n family, a comparison whose seed count cannot reach the family's level
  (the sign test's smallest p, 2 / 2^n, above alpha / K) is left out (Tarone 1990), and the seeds
  it would need are said.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.decide import signs
from orchestrator.decide.intervals import Interval, paired_interval
from orchestrator.decide.sequential import confidence_sequence
from orchestrator.decide.verdict import UNTESTED, Verdict, verdict

MEDIAN, MEAN = "median", "mean"
ROBUST_Z = 4.0
MAD_SCALE = 1.4826  # MAD -> sd for normal data
# below 5 differences the MAD is the smaller of two gaps (n = 3) or near it, so a robust z of 40 is
# ordinary: no seed is called an outlier there
MIN_OUTLIER_N = 5


@dataclass(frozen=True)
class Ruling:
    interval: Interval  # the verdict's interval (of the median)
    mean: Interval  # the mean's interval, shown beside it
    verdict: Verdict
    flag: str  # "" or why the mean and the median may differ
    estimand: str = MEDIAN
    why: str = ""  # why "not tested"


def untested(d: np.ndarray) -> str:
    """Why the differences cannot be tested ("" when they can)."""
    d = np.asarray(d, np.float64)
    if len(d) < 2:
        return f"{len(d)} paired seed(s)"
    if not np.all(np.isfinite(d)):
        return "a non-finite difference"
    if float(np.ptp(d)) == 0.0:
        return "zero variance: every seed gives the same difference" + (" (0)" if d[0] == 0 else "")
    return ""


def flag(d: np.ndarray, seeds: Sequence | None = None) -> str:
    """Outliers (robust z > 4, seeds named; from 5 differences on) and strong skew (|G1| > 2 se); ""
    for neither."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n < 3 or not np.all(np.isfinite(d)):
        return ""
    seeds = list(seeds) if seeds is not None and len(seeds) == n else list(range(n))
    med = float(np.median(d))
    scale = MAD_SCALE * float(np.median(np.abs(d - med)))
    if scale == 0:  # more than half the values equal: the mean absolute deviation (Iglewicz-Hoaglin)
        scale = 1.2533 * float(np.mean(np.abs(d - med)))
    out = []
    if scale > 0 and n >= MIN_OUTLIER_N:
        z = (d - med) / scale
        hits = [f"{seeds[i]} (z {z[i]:+.1f})" for i in np.flatnonzero(np.abs(z) > ROBUST_Z)]
        if hits:
            out.append("outlier: seed " + ", ".join(hits))
    g1 = skewness(d)
    se = skew_se(n)
    if math.isfinite(g1) and abs(g1) > 2 * se:
        out.append(f"skew: G1 {g1:+.2f} (se {se:.2f})")
    return "; ".join(out)


def skewness(d: np.ndarray) -> float:
    """The adjusted Fisher-Pearson sample skewness G1 (Excel's SKEW; scipy.stats.skew(bias=False))."""
    d = np.asarray(d, np.float64)
    n = len(d)
    m2 = float(np.mean((d - d.mean()) ** 2))
    if n < 3 or m2 == 0:
        return math.nan
    g1 = float(np.mean((d - d.mean()) ** 3)) / m2**1.5
    return g1 * math.sqrt(n * (n - 1)) / (n - 2)


def skew_se(n: int) -> float:
    """The standard error of G1 for n normal values."""
    return math.sqrt(6.0 * n * (n - 1) / ((n - 2) * (n + 1) * (n + 3))) if n > 2 else math.inf


def median_interval(d: np.ndarray, level: float, sequential: bool = False) -> Interval:
    lo, hi = signs.sign_sequence(d, level) if sequential else signs.sign_interval(d, level)
    return Interval(lo, hi, level, len(d), signs.SEQUENTIAL if sequential else signs.FIXED)


def mean_interval(d: np.ndarray, level: float, sequential: bool = False, seed: int = 0) -> Interval:
    return confidence_sequence(d, level) if sequential else paired_interval(d, level, seed)


def decide(d: np.ndarray, level: float, mode: str, margin: float | None = None, sequential: bool = False,
           seed: int = 0, seeds: Sequence | None = None) -> Ruling:
    """The verdict of one comparison (variant - baseline per seed) at ``level`` (the family's)."""
    d = np.asarray(d, np.float64)
    nan = Interval(math.nan, math.nan, level, len(d), signs.SEQUENTIAL if sequential else signs.FIXED)
    why = untested(d)
    if why:
        mean = mean_interval(d, level, sequential, seed) if len(d) >= 2 and np.all(np.isfinite(d)) else nan
        return Ruling(nan, mean, Verdict(UNTESTED), "", MEDIAN, why)
    iv = median_interval(d, level, sequential)
    return Ruling(iv, mean_interval(d, level, sequential, seed), verdict(iv, mode, margin), flag(d, seeds))


# -- the family ---------------------------------------------------------------------------------------------
def needed_seeds(alpha: float) -> int:
    """The fewest seeds whose sign test can reach p <= alpha (the fixed interval finite at 1 - alpha)."""
    return signs.min_seeds(1.0 - alpha)


def tarone(ns: Sequence[int], alpha: float) -> tuple[int, list[bool]]:
    """Tarone's modified Bonferroni for sign tests of ``ns`` differences each: the smallest K with
    #{i : 2 / 2^n_i <= alpha / K} <= K, and which comparisons enter the family (each tested at
    alpha / K). K is 0 when none can."""
    m = len(ns)
    for k in range(1, m + 1):
        keep = [signs.sign_min_p(n) <= alpha / k * (1 + 1e-12) for n in ns]
        if sum(keep) <= k:
            return (k if any(keep) else 0), keep
    return m, [True] * m  # unreachable: K = m keeps at most m
