"""The confidence sequence (``orchestrator.decide.sequential``) against independent expectations: its
Bayes factor by numerical integration of the model it is derived from, its limits solving
BF = 1 / a, and its time-uniform coverage by simulation (at every number of seeds at once)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy import stats as sps

from orchestrator.decide.sequential import (
    confidence_sequence,
    log_bf,
    log_bf_rows,
    max_log_bf,
    min_seeds_finite,
    sequence,
)


def _numeric_log_bf(y: np.ndarray, g: float) -> float:
    """log of  int int prod N(y; delta s, s^2) N(delta; 0, g) ds/s ddelta  /  int prod N(y; 0, s^2) ds/s,
    by the trapezoid rule on a fine (log s, delta) grid (ds/s = d log s)."""
    log_s = np.linspace(-9.0, 5.0, 1401)[:, None]
    delta = np.linspace(-12.0, 12.0, 1201)[None, :] * math.sqrt(g)
    s = np.exp(log_s)

    def logpdf(x, mu, sd):
        return -0.5 * ((x - mu) / sd) ** 2 - np.log(sd) - 0.5 * math.log(2 * math.pi)

    alt = sum(logpdf(v, delta * s, s) for v in y) + logpdf(delta, 0.0, math.sqrt(g))
    null = sum(logpdf(v, 0.0, s[:, 0]) for v in y)
    top = alt.max()
    a = integrate.trapezoid(integrate.trapezoid(np.exp(alt - top), delta[0], axis=1), log_s[:, 0])
    b = integrate.trapezoid(np.exp(null - top), log_s[:, 0])
    return math.log(a / b)


@pytest.mark.parametrize("seed,n,g", [(0, 3, 1.0), (1, 5, 1.0), (2, 6, 0.5), (3, 4, 2.0)])
def test_the_closed_form_bayes_factor_is_the_integral_it_comes_from(seed, n, g):
    y = np.random.default_rng(seed).normal(0.4, 1.3, n)
    assert log_bf(y, 0.0, g) == pytest.approx(_numeric_log_bf(y, g), abs=1e-5)


def test_the_limits_are_where_the_bayes_factor_reaches_one_over_a():
    d = np.random.default_rng(4).normal(0.5, 1.0, 12)
    for level in (0.95, 0.975, 0.99):
        cs = confidence_sequence(d, level)
        target = math.log(1 / (1 - level))
        assert log_bf(d, cs.low) == pytest.approx(target, abs=1e-9)
        assert log_bf(d, cs.high) == pytest.approx(target, abs=1e-9)
        assert log_bf(d, float(d.mean())) < target
        assert cs.contains(float(d.mean())) and cs.low < cs.high


def test_it_is_wider_than_the_fixed_n_t_interval_at_every_n():
    d = np.random.default_rng(5).normal(0.2, 1.0, 30)
    for n in range(8, 31):
        cs = confidence_sequence(d[:n], 0.95)
        t = sps.ttest_1samp(d[:n], 0.0).confidence_interval(0.95)
        assert cs.low < t.low and cs.high > t.high


def test_it_is_the_whole_line_until_the_seeds_can_reach_the_threshold():
    assert min_seeds_finite(0.95) == 5 and min_seeds_finite(0.975) == 6
    assert max_log_bf(4) < math.log(20) < max_log_bf(5)
    d = np.array([0.1, 0.2, 0.3, 0.25])
    assert not confidence_sequence(d, 0.95).finite and confidence_sequence(np.append(d, 0.2), 0.95).finite


def test_the_vectorised_form_matches():
    d = np.random.default_rng(6).normal(0.3, 1.0, size=(50, 9))
    assert np.allclose(log_bf_rows(d), [log_bf(x) for x in d])
    assert [iv.n for iv in sequence(d[0], 0.95, at=[5, 7, 9])] == [5, 7, 9]


def _time_uniform_error(draw, level: float, n_max: int, sims: int, seed: int) -> np.ndarray:
    """P(the sequence has excluded the true mean at some n <= N), for every N (the running error)."""
    d = draw(np.random.default_rng(seed), (sims, n_max))
    excluded = np.zeros(sims, bool)
    out = []
    for n in range(2, n_max + 1):
        excluded |= log_bf_rows(d[:, :n]) >= math.log(1 / (1 - level))
        out.append(excluded.mean())
    return np.array(out)


@pytest.mark.parametrize("name,draw", [
    ("normal", lambda r, s: r.normal(size=s)),
    ("t3", lambda r, s: r.standard_t(3, size=s)),
    ("gamma4", lambda r, s: r.gamma(4.0, size=s) - 4.0),
])
def test_it_covers_at_every_number_of_seeds_at_once(name, draw):
    err = _time_uniform_error(draw, 0.95, 60, 10_000, 1)
    assert np.all(err <= 0.05 + 0.006), (name, err.max())  # 3 standard errors of slack at 10,000 sweeps


def test_looking_after_every_seed_with_a_fixed_n_interval_does_not():
    # the design it replaces: stop when the 95% t interval excludes 0 -- about 4x the nominal rate by 40 looks
    d = np.random.default_rng(2).normal(size=(10_000, 40))
    excluded = np.zeros(len(d), bool)
    for n in range(3, 41):
        x = d[:, :n]
        t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
        excluded |= np.abs(t) > sps.t.ppf(0.975, n - 1)
    assert excluded.mean() > 0.15
