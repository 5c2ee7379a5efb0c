"""The paired tests behind ``orchestrator.report.compare.by_seed``: seeds are blocks.

A seed fixes a trial's data order and the initial weights of every parameter the variants
share, so the per-seed difference variant - baseline removes the seed-to-seed variation that
an unpaired test has to fight. Every function here takes plain arrays and is deterministic.

- ``sign_flip_test``: the exact paired permutation test of the mean difference (two-sided).
  Under H0 each per-seed difference is as likely positive as negative; the statistic is
  |sum d| (the same ordering as |mean d| at fixed n). All 2^n sign vectors are enumerated when
  2^n <= ``n_resamples``, else seeded Monte-Carlo sign flips with p = (1 + hits) / (1 + B).
- ``wilcoxon``: the signed-rank test. Zero differences are dropped (Wilcoxon's convention; the
  count is returned so the report can say so), tied |d| get midranks, and the null
  distribution of W+ conditional on those ranks is counted exactly (a subset-sum recursion on
  doubled ranks, which are integers) for up to ``WILCOXON_EXACT_MAX`` nonzero differences, with
  or without ties; above that the normal approximation with the tie correction.
- ``friedman``: the Friedman test (the blocked Kruskal-Wallis) with midranks within blocks and
  the tie correction, its chi-square p and a permutation p that permutes within blocks (exact
  enumeration when (k!)^(b-1) <= ``FRIEDMAN_EXACT_MAX``, fixing block 0 because relabelling the
  groups leaves the statistic unchanged; else seeded Monte-Carlo), and Kendall's W.
- The smallest p each design can reach (no ties): 2 / 2^n for both paired tests,
  (k!)^(1-b) for Friedman, k! (n!)^k / (kn)! for Kruskal-Wallis with k groups of n.
"""
from __future__ import annotations

import math
import warnings
from functools import lru_cache
from itertools import permutations

import numpy as np
from scipy import stats as sps

WILCOXON_EXACT_MAX = 50  # counts stay below 2^53, so float64 holds them exactly
FRIEDMAN_EXACT_MAX = 200_000  # rank-sum vectors enumerated for an exact Friedman p


def _ties_tol(x: np.ndarray) -> float:
    """Sums that differ by less than this are the same sum (matmul order changes the last bits)."""
    return 1e-9 * max(1.0, float(np.sum(np.abs(x))))


@lru_cache(maxsize=32)
def sign_matrix(n: int) -> np.ndarray:
    """All 2^n sign vectors, (2^n, n) of +-1."""
    bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    return (1 - 2 * bits).astype(np.float64)


def sign_flip_test(d: np.ndarray, n_resamples: int, seed: int) -> tuple[float, str, int]:
    """Two-sided paired permutation test of mean(d) = 0: (p, "exact"/"monte-carlo", flips)."""
    d = np.asarray(d, np.float64)
    n = len(d)
    if n == 0 or not np.any(d):
        return 1.0, "all differences zero", 0
    obs = abs(float(d.sum()))
    tol = _ties_tol(d)
    if 2**n <= n_resamples:
        t = np.abs(sign_matrix(n) @ d)
        return float(np.mean(t >= obs - tol)), "exact", 2**n
    rng = np.random.default_rng(seed)
    signs = 1.0 - 2.0 * rng.integers(0, 2, size=(n_resamples, n))
    hits = int(np.sum(np.abs(signs @ d) >= obs - tol))
    return (1 + hits) / (1 + n_resamples), "monte-carlo", n_resamples


def sign_flip_min_p(n: int, n_resamples: int) -> float:
    """The smallest p ``sign_flip_test`` can give for n nonzero differences."""
    if n == 0:
        return 1.0
    exact = min(1.0, 2.0 / 2**n)
    return exact if 2**n <= n_resamples else max(exact, 1.0 / (1 + n_resamples))


def _midranks(x: np.ndarray) -> np.ndarray:
    return sps.rankdata(x, method="average")


def _null_counts(doubled: np.ndarray) -> np.ndarray:
    """How many of the 2^n sign assignments give each sum of the doubled ranks of the positives."""
    counts = np.zeros(int(doubled.sum()) + 1, np.float64)
    counts[0] = 1.0
    for a in doubled:
        shifted = np.zeros_like(counts)
        shifted[a:] = counts[:len(counts) - a]
        counts = counts + shifted
    return counts


def wilcoxon(d: np.ndarray) -> tuple[float, float, str, int]:
    """Two-sided Wilcoxon signed-rank test of d: (W+, p, method, zero differences dropped).

    W+ is the sum of the (mid)ranks of |d| over the positive differences."""
    d = np.asarray(d, np.float64)
    nz = d[d != 0]
    zeros = len(d) - len(nz)
    n = len(nz)
    if n == 0:
        return 0.0, 1.0, "all differences zero", zeros
    ranks = _midranks(np.abs(nz))
    w_plus = float(ranks[nz > 0].sum())
    ties = len(np.unique(np.abs(nz))) < n
    if n <= WILCOXON_EXACT_MAX:
        doubled = np.rint(2 * ranks).astype(np.int64)  # midranks are multiples of 1/2
        counts = _null_counts(doubled)
        total = float(doubled.sum())
        dev = np.abs(2 * np.arange(len(counts)) - total)  # |2 W2 - sum| in doubled units
        obs = abs(2 * round(2 * w_plus) - total)
        p = float(counts[dev >= obs].sum() / 2.0**n)
        return w_plus, min(1.0, p), "exact (midranks for ties)" if ties else "exact", zeros
    _, t = np.unique(np.abs(nz), return_counts=True)
    mean = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(t**3 - t)) / 48.0
    z = (w_plus - mean) / math.sqrt(var)
    return w_plus, float(2 * sps.norm.sf(abs(z))), "normal approximation (tie-corrected)", zeros


def wilcoxon_min_p(n: int) -> float:
    """The smallest exact two-sided signed-rank p for n nonzero, untied differences."""
    return 1.0 if n == 0 else min(1.0, 2.0 / 2**n)


def friedman(x: np.ndarray, n_resamples: int, seed: int) -> dict:
    """Friedman test of x (blocks, groups): chi2, its p, permutation p, method, count, W.

    Needs at least 2 blocks and 2 groups; a table whose every block is all ties has no
    statistic (status "all values tied within every block")."""
    x = np.asarray(x, np.float64)
    b, k = x.shape
    ranks = np.apply_along_axis(_midranks, 1, x)
    ties = sum(float(np.sum(c**3 - c)) for row in x for c in [np.unique(row, return_counts=True)[1]])
    corr = 1.0 - ties / (b * (k**3 - k))
    out = {"blocks": b, "groups": k, "chi2": math.nan, "p": math.nan, "perm_p": math.nan,
           "perm_method": "", "perm_count": 0, "kendall_w": math.nan, "status": "ok"}
    if corr <= 0:
        out["status"] = "all values tied within every block"
        return out
    sums = ranks.sum(axis=0)
    chi2 = (12.0 / (b * k * (k + 1)) * float(np.sum(sums**2)) - 3.0 * b * (k + 1)) / corr
    out.update(chi2=chi2, p=float(sps.chi2.sf(chi2, k - 1)), kendall_w=chi2 / (b * (k - 1)))
    obs = float(np.sum(sums**2))
    tol = 1e-9 * max(1.0, obs)
    count = math.factorial(k) ** (b - 1)
    if count <= FRIEDMAN_EXACT_MAX:
        acc = ranks[:1]
        for row in ranks[1:]:
            perms = np.array(list(permutations(row)))
            acc = (acc[:, None, :] + perms[None, :, :]).reshape(-1, k)
        out.update(perm_p=float(np.mean(np.sum(acc**2, axis=1) >= obs - tol)), perm_method="exact",
                   perm_count=count)
        return out
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shuffled = rng.permuted(np.broadcast_to(ranks, (n_resamples, b, k)), axis=2)
    hits = int(np.sum(np.sum(shuffled.sum(axis=1) ** 2, axis=1) >= obs - tol))
    out.update(perm_p=(1 + hits) / (1 + n_resamples), perm_method="monte-carlo", perm_count=n_resamples)
    return out


def friedman_min_p(blocks: int, groups: int, n_resamples: int = 10**9) -> float:
    """The smallest permutation p of Friedman's test without ties: the k! orderings in which
    every block ranks the groups alike, out of (k!)^b."""
    if blocks < 2 or groups < 2:
        return 1.0
    exact = float(math.factorial(groups)) ** (1 - blocks)
    if math.factorial(groups) ** (blocks - 1) <= FRIEDMAN_EXACT_MAX:
        return exact
    return max(exact, 1.0 / (1 + n_resamples))


def kruskal_min_p(per_group: int, groups: int, n_resamples: int = 10**9) -> float:
    """The smallest permutation p of Kruskal-Wallis for ``groups`` groups of ``per_group``:
    the k! fully separated assignments out of (kn)! / (n!)^k (Monte-Carlo above
    ``n_resamples`` assignments cannot go below 1 / (1 + n_resamples))."""
    if per_group < 1 or groups < 2:
        return 1.0
    total = math.factorial(per_group * groups) // math.factorial(per_group) ** groups
    exact = min(1.0, math.factorial(groups) / total)
    return exact if total <= n_resamples else max(exact, 1.0 / (1 + n_resamples))


def mann_whitney_min_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided exact Mann-Whitney p for n_a vs n_b (no ties)."""
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a)) if n_a and n_b else 1.0


