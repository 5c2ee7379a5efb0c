"""Power of the paired verdict tests: against closed forms (exact for small n, the normal
approximation for large n) and against a brute-force simulation written here."""
from __future__ import annotations

import gc
import math
from itertools import product

import numpy as np
import pytest
from scipy.stats import norm
from statsmodels.stats.multitest import multipletests

from orchestrator.report.stats import power

SE = math.sqrt(0.25 / power.SIMS)  # the largest standard error of a simulated power


def test_holm_adjust_matches_statsmodels():
    p = np.random.default_rng(0).uniform(size=(20, 5)) ** 3
    ours = power.holm_adjust(p)
    gc.freeze()  # statsmodels' Holm runs a full gc.collect per call (slow once torch is loaded)
    try:
        for row, got in zip(p, ours):
            assert got == pytest.approx(multipletests(row, method="holm")[1], rel=1e-12)
    finally:
        gc.unfreeze()


def naive_holm_first(ps: list[float]) -> float:
    """Holm's adjusted p of ps[0], step by step: sorted ascending, p_(i) x (m - i + 1), running max."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    running = 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - step) * ps[i]))
        if i == 0:
            return running
    raise AssertionError


@pytest.mark.parametrize("test", power.TESTS)
@pytest.mark.parametrize("dz", [0.5, 1.0, 2.0])
def test_small_n_closed_form_one_comparison(test, dz):
    # 6 seeds, alpha 0.05: both tests' p are multiples of 1/32 (2/64 for all signs alike, then
    # >= 4/64 > 0.05), so a test rejects exactly when all 6 differences share a sign.
    exact = norm.cdf(dz) ** 6 + norm.cdf(-dz) ** 6
    assert power.power(6, 1, 0.05, dz, test) == pytest.approx(exact, abs=4 * SE)


def test_small_n_closed_form_with_holm():
    # 7 seeds, 2 comparisons: p-values are multiples of 1/64. The shifted comparison's Holm p is
    # below 0.05 when its p is 1/64 (all 7 signs alike; x2 = 0.031) and never at 2/64 or more when
    # its p is the smaller one (x2 >= 0.0625). The only other way: the null comparison has the
    # smallest p, 1/64 (probability 1/64 under H0), and the shifted one 2/64 or 3/64.
    dz = 1.0
    exact = norm.cdf(dz) ** 7 + norm.cdf(-dz) ** 7
    got = power.power(7, 2, 0.05, dz)
    assert exact - 4 * SE <= got <= exact + 1 / 64 + 4 * SE


def brute_power(n: int, m: int, alpha: float, dz: float, sims: int, seed: int) -> float:
    """The verdict test simulated the slow way: loops, every sign vector, Holm step by step."""
    rng = np.random.default_rng(seed)
    signs = list(product([-1, 1], repeat=n))
    hits = 0
    for _ in range(sims):
        base = rng.normal(0, math.sqrt(0.5), n)
        ps = []
        for j in range(m):
            d = rng.normal(0, math.sqrt(0.5), n) - base + (dz if j == 0 else 0.0)
            obs = abs(d.sum())
            ps.append(sum(abs(sum(s * x for s, x in zip(sg, d))) >= obs - 1e-9 for sg in signs) / len(signs))
        hits += naive_holm_first(ps) < alpha
    return hits / sims


def test_small_n_against_brute_force_simulation():
    # 5 seeds, 2 comparisons, alpha 0.2: p steps of 1/16, Holm matters; independent random numbers
    got = power.power(5, 2, 0.2, 1.0)
    brute = brute_power(5, 2, 0.2, 1.0, sims=400, seed=11)
    assert got == pytest.approx(brute, abs=4 * math.sqrt(SE**2 + 0.25 / 400))
    assert 0.2 < got < 0.9  # a case where the answer is neither trivial nor saturated


@pytest.mark.parametrize("m", [1, 3])
def test_large_n_against_the_normal_approximation(m):
    assert power.power(40, m, 0.05, 0.5) == pytest.approx(power.normal_power(40, m, 0.05, 0.5), abs=0.03)


def test_wilcoxon_large_n_efficiency():
    # the signed-rank test's asymptotic efficiency vs the t-test under normality is 3/pi:
    # its power at n seeds is the normal power at 3n/pi seeds
    got = power.power(60, 1, 0.05, 0.3, "wilcoxon")
    assert got == pytest.approx(power.normal_power(60 * 3 / math.pi, 1, 0.05, 0.3), abs=0.04)


def test_seeds_needed_and_mde():
    n = power.seeds_needed(1, 0.05, 0.5)
    assert abs(n - power.normal_seeds(1, 0.05, 0.5)) <= 3  # 32 by the normal approximation
    assert power.power(n, 1, 0.05, 0.5) >= 0.8 > power.power(n - 1, 1, 0.05, 0.5)
    assert power.seeds_needed(2, 0.05, 0.0) is None and power.seeds_needed(2, 0.05, math.inf) == 7
    assert power.mde_dz(4, 2, 0.05) == math.inf  # 2 * 2/16 >= 0.05: nothing is detectable
    dz = power.mde_dz(8, 2, 0.05)
    assert power.power(8, 2, 0.05, dz) >= 0.8 > power.power(8, 2, 0.05, dz - 0.02)
    assert power.reachable(7, 2, 0.05) and not power.reachable(6, 2, 0.05)


def test_seeded_and_deterministic():
    assert power.power(9, 3, 0.05, 1.2, sims=500, seed=4) == power.power(9, 3, 0.05, 1.2, sims=500, seed=4)
    assert power.power(9, 3, 0.05, 1.2, sims=500, seed=4) != power.power(9, 3, 0.05, 1.2, sims=500, seed=5)
