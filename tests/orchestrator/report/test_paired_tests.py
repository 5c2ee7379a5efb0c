"""The paired tests against documented values (scipy's docs, Sprent & Smeeton's textbook),
scipy itself, and brute-force enumerations written here without the code under test."""
from __future__ import annotations

import math
from itertools import permutations, product

import numpy as np
import pytest
import scipy.stats as sps

from orchestrator.report.stats.multiplicity import holm_min_p
from orchestrator.report.stats.paired import (
    friedman,
    friedman_min_p,
    kruskal_min_p,
    mann_whitney_min_p,
    sign_flip_min_p,
    sign_flip_test,
    wilcoxon,
    wilcoxon_min_p,
)

# Sprent & Smeeton, Applied Nonparametric Statistical Methods: pulse rates of 7 students before,
# immediately after and 5 minutes after exercise (scipy's friedmanchisquare example). Friedman
# statistic 10.5714286, asymptotic p 0.0050634142, exact p 0.00272205075 (the textbook's Example
# 7.6, as its companion R package ANSM5 tests it).
BEFORE = [72, 96, 88, 92, 74, 76, 82]
AFTER = [120, 120, 132, 120, 101, 96, 112]
LATER = [76, 95, 104, 96, 84, 72, 76]


def brute_signed_rank_p(d: list[float]) -> float:
    """Two-sided p of W+ by enumerating every sign assignment of the midranks (zeros dropped)."""
    nz = [x for x in d if x != 0]
    ranks = sps.rankdata(np.abs(nz))
    w = sum(r for r, x in zip(ranks, nz) if x > 0)
    mean = ranks.sum() / 2
    sums = [sum(r for r, s in zip(ranks, signs) if s) for signs in product([0, 1], repeat=len(nz))]
    return sum(abs(s - mean) >= abs(w - mean) - 1e-9 for s in sums) / len(sums)


def brute_sign_flip_p(d: list[float]) -> float:
    obs = abs(sum(d))
    sums = [abs(sum(s * x for s, x in zip(signs, d))) for signs in product([-1, 1], repeat=len(d))]
    return sum(s >= obs - 1e-9 for s in sums) / len(sums)


# ---------------------------------------------------------------- Wilcoxon signed-rank

def test_wilcoxon_scipy_documented_example():
    # scipy.stats.wilcoxon's docs: statistic (the smaller rank sum) 24, p = 0.041259765625
    d = np.array([6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75], float)
    w_plus, p, method, zeros = wilcoxon(d)
    assert w_plus == 120 - 24 and zeros == 0 and method == "exact"
    assert p == pytest.approx(0.041259765625, abs=1e-15)


@pytest.mark.parametrize("n", [3, 6, 11, 20])
def test_wilcoxon_matches_scipy_exact_without_ties(n):
    d = np.random.default_rng(n).normal(0.3, 1.0, n)
    assert wilcoxon(d)[1] == pytest.approx(sps.wilcoxon(d, method="exact").pvalue, rel=1e-12)


def test_wilcoxon_ties_and_zeros_are_exact_and_said():
    d = [1.0, 1.0, 2.0, -2.0, 3.0, 0.0, 4.0, -1.0, 0.0]
    w_plus, p, method, zeros = wilcoxon(np.array(d))
    assert zeros == 2 and method == "exact (midranks for ties)"
    # midranks of |d| without zeros: 1,1,1 -> 2; 2,2 -> 4.5; 3 -> 6; 4 -> 7; positives: 2+2+4.5+6+7
    assert w_plus == pytest.approx(21.5)
    assert p == pytest.approx(brute_signed_rank_p(d), rel=1e-12)
    ref = sps.wilcoxon(d, method=sps.PermutationMethod(n_resamples=10**6))  # exact enumeration, zeros dropped
    assert p == pytest.approx(ref.pvalue, rel=1e-12)


def test_wilcoxon_degenerate_and_large():
    assert wilcoxon(np.zeros(4))[1:3] == (1.0, "all differences zero")
    d = np.random.default_rng(0).normal(0.2, 1.0, 60).round(1)  # ties, beyond the exact range
    _, p, method, zeros = wilcoxon(d)
    assert method == "normal approximation (tie-corrected)"
    assert p == pytest.approx(sps.wilcoxon(d, method="approx").pvalue, rel=1e-9)


# ---------------------------------------------------------------- the paired permutation test

@pytest.mark.parametrize("d", [[0.3, -0.1, 0.25, 0.4, 0.05, 0.2], [1.0, 1.0, -1.0, 2.0], [0.1, 0.0, 0.2, -0.3, 0.4]])
def test_sign_flip_exact_equals_brute_force(d):
    p, method, count = sign_flip_test(np.array(d), 9999, 0)
    assert method == "exact" and count == 2 ** len(d)
    assert p == pytest.approx(brute_sign_flip_p(d), rel=1e-12)


def test_sign_flip_matches_scipy_paired_permutation():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=9), rng.normal(size=9)
    ref = sps.permutation_test((x, y), lambda a, b: np.mean(a - b), permutation_type="samples",
                               n_resamples=10**6, alternative="two-sided")
    assert sign_flip_test(x - y, 9999, 0)[0] == pytest.approx(ref.pvalue, rel=1e-9)


def test_sign_flip_monte_carlo_is_seeded_and_close():
    d = np.random.default_rng(1).normal(0.4, 1.0, 15)  # 2^15 flips > 9999: Monte-Carlo
    a, b = sign_flip_test(d, 9999, 3), sign_flip_test(d, 9999, 3)
    assert a == b and a[1] == "monte-carlo" and a[2] == 9999
    exact = sign_flip_test(d, 2**15, 0)
    assert exact[1] == "exact" and abs(a[0] - exact[0]) < 0.02
    assert sign_flip_test(np.zeros(3), 9999, 0)[:2] == (1.0, "all differences zero")


# ---------------------------------------------------------------- Friedman

def test_friedman_textbook_example():
    res = friedman(np.array([BEFORE, AFTER, LATER]).T, 9999, 0)
    assert res["chi2"] == pytest.approx(10.5714286, rel=1e-7)
    assert res["p"] == pytest.approx(0.0050634142, rel=1e-7)
    assert res["perm_method"] == "exact" and res["perm_count"] == 6**6
    assert res["perm_p"] == pytest.approx(0.00272205075, rel=1e-8)
    assert res["kendall_w"] == pytest.approx(10.5714286 / (7 * 2), rel=1e-7)
    ref = sps.friedmanchisquare(BEFORE, AFTER, LATER)
    assert (res["chi2"], res["p"]) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)


def brute_friedman_p(x: np.ndarray) -> float:
    """Permute every block (block 0 included) in every way; count sums of squared rank sums."""
    ranks = [sps.rankdata(row) for row in x]
    obs = np.sum(np.sum(ranks, axis=0) ** 2)
    hits = total = 0
    for choice in product(*[list(permutations(r)) for r in ranks]):
        hits += np.sum(np.sum(choice, axis=0) ** 2) >= obs - 1e-9
        total += 1
    return hits / total


def test_friedman_ties_against_scipy_and_brute_force():
    x = np.array([[1.0, 2.0, 2.0], [3.0, 1.0, 2.0], [2.0, 3.0, 1.0], [1.0, 1.0, 3.0], [1.0, 2.0, 3.0]])
    res = friedman(x, 9999, 0)
    ref = sps.friedmanchisquare(*x.T)
    assert (res["chi2"], res["p"]) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
    assert res["perm_method"] == "exact"
    assert res["perm_p"] == pytest.approx(brute_friedman_p(x), rel=1e-12)


def test_friedman_monte_carlo_and_degenerate():
    x = np.random.default_rng(2).normal(size=(9, 4))  # 24^8 orderings: Monte-Carlo
    a, b = friedman(x, 2000, 7), friedman(x, 2000, 7)
    assert a == b and a["perm_method"] == "monte-carlo" and a["perm_count"] == 2000
    assert abs(a["perm_p"] - a["p"]) < 0.1
    assert friedman(np.ones((3, 3)), 99, 0)["status"] == "all values tied within every block"


# ---------------------------------------------------------------- smallest reachable p

def test_smallest_reachable_p_is_reached():
    for n in (3, 5, 8):
        d = np.arange(1.0, n + 1)  # every difference positive: the most extreme data
        assert sign_flip_test(d, 9999, 0)[0] == pytest.approx(sign_flip_min_p(n, 9999)) == pytest.approx(2 / 2**n)
        assert wilcoxon(d)[1] == pytest.approx(wilcoxon_min_p(n))
    x = np.tile([1.0, 2.0, 3.0], (4, 1))  # every seed ranks the variants alike
    assert friedman(x, 9999, 0)["perm_p"] == pytest.approx(friedman_min_p(4, 3)) == pytest.approx(6.0 ** -3)
    assert sign_flip_min_p(20, 9999) == pytest.approx(1 / 10000)
    assert kruskal_min_p(3, 3) == pytest.approx(6 / 1680)  # the separated split, as in test_stats
    assert mann_whitney_min_p(3, 3) == pytest.approx(0.1) and mann_whitney_min_p(0, 3) == 1.0


def test_holm_min_p_bound():
    assert holm_min_p([0.0625] * 8) == pytest.approx([0.5] * 8)
    assert holm_min_p([0.25, 0.03125]) == pytest.approx([0.25, 0.0625])
    assert holm_min_p([0.4, 0.4, 0.4]) == [1.0, 1.0, 1.0] and holm_min_p([]) == []
    assert math.isclose(holm_min_p([2 / 2**7] * 2)[0], 2 * 2 / 2**7)
