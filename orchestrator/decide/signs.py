"""Distribution-free intervals of the MEDIAN of paired differences, from the signs alone.

Why: the mean's intervals (``intervals``, ``sequential``) assume normal or symmetric differences, and
skewed or contaminated ones (one seed 10 sd worse) push their error toward a false "better" (2-9x the
nominal level, issue 33). Signs need no shape: for the true median m of the per-seed differences,
the indicators 1{d_i > m} are independent Bernoulli(1/2) for any continuous distribution.

``sign_interval`` (fixed n): the order statistics [d_(k), d_(n+1-k)] with k the largest count such
that 2 P(Bin(n, 1/2) <= k - 1) <= a: the set of mu that the two-sided exact sign test keeps
(``scipy.stats.binomtest``), coverage >= 1 - a for every continuous distribution; the whole line
while 2 / 2^n > a (no data could reject anything: 6 seeds at 95%).

``sign_sequence`` (time-uniform): for a candidate mu, S_n(mu) = #{i <= n: d_i > mu}. Under
"median = mu" the likelihood ratio of Bernoulli(p) against Bernoulli(1/2), mixed over
p ~ Beta(c, c), is M_n(mu) = 2^n B(c + S, c + n - S) / B(c, c): a nonnegative martingale with mean 1,
so by Ville's inequality P(sup_n M_n(mu) >= 1 / a) <= a. The confidence sequence is
{mu : M_n(mu) < 1 / a}; M_n is symmetric in S <-> n - S and falls toward S = n / 2, so the set is
again [d_(k), d_(n+1-k)], k the smallest min(S, n - S) with M_n < 1 / a. It is the sign-test
analogue of the mixture confidence sequences of Howard et al. 2021 and Wang & Ramdas 2023.
c = ``PRIOR_C`` = 1/2 (Jeffreys): it needs the fewest seeds to a finite sequence (9 at 98.33%).

Ties and discrete distributions (conservative, documented): both intervals are CLOSED, i.e. a
difference equal to mu counts for whichever side keeps mu. For any distribution, with m a median
(P(d < m) <= 1/2 <= P(d <= m)), a randomised tie-break turns the signs at m into exact
Bernoulli(1/2) variables that dominate 1{d_i > m} and 1{d_i < m} from the right sides, so excluding m
implies the randomised test rejects: coverage stays >= 1 - a. A verdict needs the interval to exclude
0 strictly, so zero differences (ties at 0) never count toward "better" or "worse".
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy import special as spc
from scipy import stats as sps

PRIOR_C = 0.5
FIXED = "sign (median)"
SEQUENTIAL = "sign confidence sequence (median)"


@lru_cache(maxsize=4096)
def fixed_depth(n: int, level: float) -> int:
    """k of the fixed-n interval [d_(k), d_(n+1-k)]; 0 when it is the whole line."""
    a = 1.0 - level
    k = 0
    while k < (n + 1) // 2 and 2.0 * float(sps.binom.cdf(k, n, 0.5)) <= a * (1 + 1e-12):
        k += 1
    return k


def fixed_error(n: int, level: float) -> float:
    """The exact error bound of the fixed-n sign interval at ``level``: 2 P(Bin(n, 1/2) <= k - 1) at its
    depth k (at most 1 - level; what it leaves of 1 - level another interval may spend), 1.0 when the
    interval is the whole line."""
    k = fixed_depth(n, level)
    return min(1.0, 2.0 * float(sps.binom.cdf(k - 1, n, 0.5))) if k else 1.0


def log_mixture(s: np.ndarray | int, n: int, c: float = PRIOR_C) -> np.ndarray:
    """log M_n for S = s positive signs among n (see the module docstring)."""
    s = np.asarray(s, np.float64)
    return n * math.log(2.0) + spc.betaln(c + s, c + n - s) - spc.betaln(c, c)


@lru_cache(maxsize=4096)
def sequence_depth(n: int, level: float, c: float = PRIOR_C) -> int:
    """k of the sequence's [d_(k), d_(n+1-k)] at n; 0 when it is the whole line."""
    threshold = math.log(1.0 / (1.0 - level))
    # S = k positives (or k negatives) rejects while log M_n(k) >= log(1/a): the first k that does not.
    # log M_n falls as k rises toward n / 2 (log B(c + k, c + n - k) is convex and symmetric about
    # n / 2), so the rejecting k are a prefix and bisection finds its end: O(log n) evaluations, not
    # O(n) (the budget's projections, ``reach``, ask for depths at tens of thousands of seeds)
    lo, hi = 0, (n + 1) // 2
    while lo < hi:
        mid = (lo + hi) // 2
        if float(log_mixture(mid, n, c)) >= threshold * (1 - 1e-12):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _order_interval(d: np.ndarray, k: int) -> tuple[float, float]:
    if k == 0 or len(d) == 0:
        return -math.inf, math.inf
    s = np.sort(np.asarray(d, np.float64))
    return float(s[k - 1]), float(s[len(s) - k])


def sign_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    """The fixed-n interval of the median of d at ``level``."""
    return _order_interval(d, fixed_depth(len(d), level))


def sign_sequence(d: np.ndarray, level: float, c: float = PRIOR_C) -> tuple[float, float]:
    """The confidence sequence of the median at n = len(d), at ``level``."""
    return _order_interval(d, sequence_depth(len(d), level, c))


def min_seeds(level: float, sequential: bool = False, c: float = PRIOR_C) -> int:
    """The fewest differences whose interval (or sequence) can be finite at ``level``."""
    n = 1
    while (sequence_depth(n, level, c) if sequential else fixed_depth(n, level)) == 0:
        n += 1
    return n


def sign_min_p(n: int) -> float:
    """The smallest two-sided sign-test p that n differences can give (Tarone's criterion)."""
    return min(1.0, 2.0 * 0.5**n) if n > 0 else 1.0


def intervals_rows(d: np.ndarray, level: float, sequential: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The interval of every row of d (sims, n), vectorised: (lows, highs)."""
    d = np.asarray(d, np.float64)
    n = d.shape[1]
    k = sequence_depth(n, level) if sequential else fixed_depth(n, level)
    if k == 0:
        return np.full(len(d), -np.inf), np.full(len(d), np.inf)
    s = np.sort(d, axis=1)
    return s[:, k - 1], s[:, n - k]


def mde_dz(n: int, level: float, power: float = 0.8) -> float:
    """The shift, in sd of normal differences, that the fixed sign interval at ``level`` excludes with
    ``power`` on one side: P(Bin(n, Phi(dz)) >= n + 1 - k) = power (for normal differences the median
    is the mean); inf when the interval cannot be finite at n."""
    k = fixed_depth(n, level)
    if k == 0:
        return math.inf
    need = n + 1 - k  # that many differences on one side of 0
    p = float(optimize.brentq(lambda q: float(sps.binom.sf(need - 1, n, q)) - power, 0.5, 1 - 1e-15))
    return float(sps.norm.ppf(p))
