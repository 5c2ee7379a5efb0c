"""The sign interval and sign confidence sequence of the median (``orchestrator.decide.signs``) and the
verdict rule's pieces (``orchestrator.decide.rule``) against independent computations: scipy's exact
binomial test inverted by brute force, the mixture martingale integrated numerically, scipy's skewness,
and Tarone's procedure worked by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as sps

from orchestrator.decide import rule, signs
from orchestrator.decide.verdict import BETTER, UNDECIDABLE, UNTESTED


def _midpoints(d: np.ndarray) -> np.ndarray:
    s = np.sort(d)
    return np.concatenate([[s[0] - 1.0], (s[1:] + s[:-1]) / 2, [s[-1] + 1.0]])


@pytest.mark.parametrize("level", [0.9, 0.95, 0.975, 1 - 0.05 / 3, 0.99])
def test_the_sign_interval_is_the_brute_force_inversion_of_scipys_binomial_test(level):
    rng = np.random.default_rng(int(level * 1e4))
    for n in range(1, 26):
        d = rng.standard_t(3, size=n)
        lo, hi = signs.sign_interval(d, level)
        for mu in _midpoints(d):  # between order statistics: no ties with mu
            s = int(np.sum(d > mu))
            kept = sps.binomtest(s, n, 0.5).pvalue > 1 - level
            assert kept == (lo <= mu <= hi), (n, mu, lo, hi, s)


def _mixture_numeric(s: int, n: int) -> float:
    """M_n = int 2^n p^s (1 - p)^(n - s) Beta(1/2, 1/2)(dp); p = sin^2(t) removes the endpoint singularities
    (the Beta(1/2, 1/2) density times dp is (2 / pi) dt)."""
    f = lambda t: (2.0 / math.pi) * (2 * math.sin(t) ** 2) ** s * (2 * math.cos(t) ** 2) ** (n - s)  # noqa: E731
    return integrate.quad(f, 0.0, math.pi / 2, epsabs=0, epsrel=1e-11, limit=200)[0]


@pytest.mark.parametrize("level", [0.95, 1 - 0.05 / 3])
def test_the_sign_sequence_is_the_set_where_the_numerically_integrated_mixture_stays_below_one_over_alpha(level):
    rng = np.random.default_rng(7)
    for n in range(1, 41, 3):
        d = rng.exponential(size=n) - math.log(2)
        lo, hi = signs.sign_sequence(d, level)
        for mu in _midpoints(d):
            kept = _mixture_numeric(int(np.sum(d > mu)), n) < 1 / (1 - level)
            assert kept == (lo <= mu <= hi), (n, mu, lo, hi)


def test_the_sign_sequence_covers_the_median_at_every_n_at_once():
    # Ville: P(some CS_n misses the median) <= a; skewed differences with median 0, 60 seeds, every look
    rng = np.random.default_rng(11)
    d = rng.exponential(size=(20000, 60)) - math.log(2)
    miss = np.zeros(len(d), bool)
    for n in range(1, 61):
        lo, hi = signs.intervals_rows(d[:, :n], 0.95, sequential=True)
        miss |= (lo > 0) | (hi < 0)
    rate, se = miss.mean(), math.sqrt(0.05 * 0.95 / len(d))
    assert rate <= 0.05 + 3 * se  # measured: 0.021


def test_ties_count_for_keeping_mu_and_finite_limits_need_enough_seeds():
    # the closed interval: a difference equal to mu keeps it (conservative for discrete metrics)
    d = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    lo, hi = signs.sign_interval(d, 0.95)
    assert lo == 0.0 and hi == 1.0
    assert signs.min_seeds(0.95) == 6 and signs.sign_interval(np.arange(5.0) + 1, 0.95) == (-math.inf, math.inf)
    assert signs.sign_interval(np.arange(6.0) + 1, 0.95) == (1.0, 6.0)  # 2 / 64 <= 0.05
    assert signs.min_seeds(1 - 0.05 / 3, sequential=True) == 9


def test_the_rule_decides_the_median_with_the_mean_beside_it():
    d = np.array([-0.05, -0.04, -0.06, -0.05, -0.03, -0.07, -0.05, 0.9])  # 7 better seeds, one far worse
    r = rule.decide(d, 0.95, "min", seeds=list(range(10, 18)))
    assert r.estimand == "median" and r.interval.method == signs.FIXED
    assert (r.interval.low, r.interval.high) == (-0.07, 0.9)  # k = 1 at n = 8: min and max
    assert r.verdict.word != BETTER and r.mean.high > 0
    assert "outlier: seed 17" in r.flag and "skew" in r.flag
    r6 = rule.decide(np.array([-0.05, -0.04, -0.06, -0.05, -0.03, -0.07]), 0.95, "min")
    assert r6.verdict.word == BETTER and r6.flag == ""
    # 3 differences: the MAD is the smaller gap (0.001 here), so z = 0.099 / (1.4826 x 0.001) = 67 says
    # nothing: no outlier below 5 differences
    assert "outlier" not in rule.flag(np.array([0.0, 0.001, 0.1]))
    assert "outlier: seed 4" in rule.flag(np.array([0.0, 0.001, -0.001, 0.002, 0.1]))


def test_skewness_and_its_standard_error_match_scipy_and_the_textbook():
    rng = np.random.default_rng(3)
    x = rng.exponential(size=12)
    assert rule.skewness(x) == pytest.approx(sps.skew(x, bias=False), rel=1e-12)
    assert rule.skew_se(8) == pytest.approx(math.sqrt(6 * 8 * 7 / (6 * 9 * 11)))


def test_zero_variance_differences_are_not_tested():
    for d in (np.zeros(8), np.full(8, 0.1), np.array([1.0])):
        r = rule.decide(d, 0.95, "min", margin=0.5)
        assert r.verdict.word == UNTESTED and r.why
    assert rule.decide(np.array([0.0] * 7 + [0.1]), 0.95, "min").verdict.word != UNTESTED


def test_tarone_by_hand():
    # alpha 0.05; 8 seeds: smallest p 2/256 = 0.0078; 5 seeds: 0.0625 (never reaches 0.05)
    k, keep = rule.tarone([8, 8, 5], 0.05)
    assert k == 2 and keep == [True, True, False]  # K = 1: 2 can reach 0.05 > 1; K = 2: 2 reach 0.025
    k, keep = rule.tarone([8] * 7, 0.05)  # K = 6: 0.0083 >= 0.0078 so all 7 reach it; K = 7: 0.0071 none do
    assert k == 0 and keep == [False] * 7  # an empty family
    assert rule.tarone([5, 4], 0.05) == (0, [False, False])
    assert rule.needed_seeds(0.05 / 7) == 9  # 2 / 2^9 = 0.0039 <= 0.0071
    fam = rule.decide(np.arange(8.0) - 20, 1 - 0.05 / 7, "min")
    assert fam.verdict.word == UNDECIDABLE


@pytest.mark.parametrize("n,level", [(8, 0.95), (12, 0.975), (20, 1 - 0.05 / 3)])
def test_the_mde_of_the_sign_interval_has_80_percent_power_in_simulation(n, level):
    dz = signs.mde_dz(n, level)
    d = np.random.default_rng(n).normal(size=(20000, n)) - dz
    power = np.mean(signs.intervals_rows(d, level)[1] < 0)
    assert abs(power - 0.8) < 3 * math.sqrt(0.16 / 20000)
    assert signs.mde_dz(5, 0.95) == math.inf


@pytest.mark.parametrize("n,level,dz", [(8, 0.95, 1.5), (12, 0.975, 0.9), (30, 1 - 0.05 / 3, 0.6)])
def test_the_planners_power_is_the_sign_intervals_power_in_simulation(n, level, dz):
    from orchestrator.report.stats.verdict_power import verdict_power

    d = np.random.default_rng(n).normal(size=(20000, n)) + dz
    lo, hi = signs.intervals_rows(d, level)
    sim = np.mean((lo > 0) | (hi < 0))
    p = verdict_power(n, level, dz)
    assert abs(sim - p) < 3 * math.sqrt(p * (1 - p) / 20000) + 1e-9
