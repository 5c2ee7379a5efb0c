"""Intervals that cover: the coverage of the report's paired interval, measured by simulation.

The interval of a paired mean difference (``orchestrator.decide.intervals.paired_interval``, the
hull of Student's t interval and the inverted exact sign-flip test) must cover the true mean in at
least 94% of simulated sweeps at 3, 5 and 8 seeds, for normal and for skewed per-seed differences
(gamma(4): skewness 1; a one-sided contamination: 10% of seeds shifted by 3 sd). The percentile
bootstrap that the reports used before is measured beside it (75-88%: why it was replaced), and so
is the case the hull does not fix (exponential differences, skewness 2), which docs/STATISTICS.md
states. Seeded and vectorised: a few seconds.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.decide.intervals import (
    min_seeds_finite,
    paired_interval,
    paired_intervals,
    sign_flip_interval,
    sign_flip_p,
    t_interval,
)
from orchestrator.report.stats.paired import sign_flip_test
from orchestrator.report.stats.ranks import rng_kwargs

SIMS = 20_000


def bootstrap_ci(x: np.ndarray, confidence: float, n_resamples: int, seed: int) -> tuple[float, float]:
    """The percentile-bootstrap CI of the mean of x that the reports used before the paired
    interval (scipy's, seeded), kept here as the baseline the coverage claims compare against."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples of tiny samples
        res = sps.bootstrap((x,), np.mean, confidence_level=confidence, method="percentile",
                            n_resamples=n_resamples, **rng_kwargs(sps.bootstrap, seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _normal(rng, shape):
    return rng.normal(size=shape)


def _gamma4(rng, shape):  # skewness 1, mean 0
    return rng.gamma(4.0, size=shape) - 4.0


def _contaminated(rng, shape):  # 10% of seeds 3 sd off to one side, mean 0
    return np.where(rng.random(shape) < 0.1, rng.normal(3.0, 1.0, shape), rng.normal(0.0, 1.0, shape)) - 0.3


def _exponential(rng, shape):  # skewness 2, mean 0
    return rng.exponential(size=shape) - 1.0


def coverage(draw, n: int, level: float, seed: int = 0) -> float:
    d = draw(np.random.default_rng([seed, n]), (SIMS, n))
    lo, hi = paired_intervals(d, level)
    return float(np.mean((lo <= 0) & (hi >= 0)))


@pytest.mark.parametrize("draw", [_normal, _gamma4, _contaminated], ids=["normal", "gamma4", "contaminated"])
@pytest.mark.parametrize("n", [3, 5, 8])
def test_the_paired_interval_covers_at_least_94_percent(draw, n):
    assert coverage(draw, n, 0.95) >= 0.94


@pytest.mark.parametrize("n", [6, 9, pytest.param(12, marks=pytest.mark.slow)])
def test_it_also_covers_at_the_other_shipped_seed_counts(n):
    for draw in (_normal, _gamma4, _contaminated):
        assert coverage(draw, n, 0.95) >= 0.94, draw.__name__


def test_at_a_family_level_it_covers_too():
    # two comparisons: each interval at 97.5% (Bonferroni)
    for draw in (_normal, _gamma4, _contaminated):
        assert coverage(draw, 8, 0.975) >= 0.965, draw.__name__


def test_strong_skew_is_the_stated_limit():
    # docs/STATISTICS.md: exponential differences (skewness 2) under-cover at 8 seeds (about 90.6%)
    assert 0.88 < coverage(_exponential, 8, 0.95) < 0.93


def test_the_percentile_bootstrap_it_replaces_under_covers():
    rng = np.random.default_rng(7)
    for n, at_most in ((3, 0.80), (8, 0.91)):
        d = rng.normal(size=(400, n))
        hits = [bootstrap_ci(x, 0.95, 999, i)[0] <= 0 <= bootstrap_ci(x, 0.95, 999, i)[1] for i, x in enumerate(d)]
        assert np.mean(hits) < at_most  # 75% at 3 seeds, 86-89% at 6-9 (the recomputation)


def test_below_six_seeds_no_interval_is_finite_at_95_percent():
    assert min_seeds_finite(0.95) == 6 and min_seeds_finite(0.975) == 7 and min_seeds_finite(0.99) == 8
    assert not paired_interval(np.array([0.1, 0.2, 0.15, 0.12, 0.3]), 0.95).finite
    assert paired_interval(np.array([0.1, 0.2, 0.15, 0.12, 0.3, 0.2]), 0.95).finite


def test_the_t_part_is_scipys_t_interval():
    d = np.array([-0.03, -0.05, -0.01, -0.04, -0.02, -0.06, 0.01, -0.03])
    ref = sps.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert t_interval(d, 0.95) == pytest.approx((ref.low, ref.high), rel=1e-12)


def test_the_sign_flip_limits_invert_the_reports_own_permutation_test():
    # independent: the report's sign_flip_test (orchestrator.report.stats.paired), on shifted data
    rng = np.random.default_rng(3)
    for n in (6, 8, 10):
        d = rng.normal(0.4, 1.0, n)
        lo, hi = sign_flip_interval(d, 0.95)
        eps = 1e-7
        for inside in (lo + eps, hi - eps, float(d.mean())):
            assert sign_flip_test(d - inside, 10**6, 0)[0] >= 0.05
        for outside in (lo - eps, hi + eps):
            assert sign_flip_test(d - outside, 10**6, 0)[0] < 0.05
        assert sign_flip_p(d, lo - eps) == sign_flip_test(d - (lo - eps), 10**6, 0)[0]


def test_excluding_zero_is_both_tests_rejecting():
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(6, 12))
        d = rng.normal(rng.normal(0, 0.6), 1.0, n)
        iv = paired_interval(d, 0.95)
        p_t = sps.ttest_1samp(d, 0.0).pvalue
        p_sf = sign_flip_test(d, 10**6, 0)[0]
        assert (not iv.contains(0.0)) == (p_t < 0.05 and p_sf < 0.05)


def test_above_the_exact_size_monte_carlo_flips_keep_the_level():
    d = np.random.default_rng(5).normal(size=20)
    lo, hi = sign_flip_interval(d, 0.95)
    t_lo, t_hi = t_interval(d, 0.95)
    assert math.isfinite(lo) and abs(lo - t_lo) < 0.1 and abs(hi - t_hi) < 0.1  # they converge
    assert sign_flip_interval(d, 0.95) == (lo, hi)  # seeded
