"""The compute multiplier's pieces (orchestrator.report.multiplier): the baseline's FLOPs to reach a
loss read off a hand-made curve, the extrapolation below it and its flag, the censored bounds, and a
simulation of whole sweeps with a known multiplier whose interval must cover it at the stated rate."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as sps

from orchestrator.decide import rule, signs
from orchestrator.decide.verdict import BETTER, WORSE
from orchestrator.report.cosched import most_at_once
from orchestrator.report.multiplier import curve
from orchestrator.report.multiplier.curve import AT_LEAST, AT_MOST, FIRST, INTERPOLATED, LINE, POWER, reach
from orchestrator.report.multiplier.render import read
from orchestrator.report.multiplier.seeds import pair

STEPS = np.array([10.0, 20.0, 40.0])
LOSS = np.array([4.0, 3.0, 2.5])
FPS = 1e6  # FLOPs per step: C = 1e7, 2e7, 4e7


def hist(steps, losses) -> dict:
    return {"val/loss": (np.asarray(steps, np.float64), np.asarray(losses, np.float64))}


def test_three_point_curve_by_hand():
    x = np.log(STEPS * FPS)
    # 2.75 lies halfway between 3.0 (2e7 FLOPs) and 2.5 (4e7) in loss: halfway in log FLOPs, 2e7 x sqrt(2)
    r = reach(x, LOSS, 2.75)
    assert r.how == INTERPOLATED and not r.extrapolated and r.censored == ""
    assert math.exp(r.log_c) == pytest.approx(2e7 * math.sqrt(2), rel=1e-12)
    # 3.5: halfway between the first two evaluations; 3.0: exactly the second evaluation
    assert math.exp(reach(x, LOSS, 3.5).log_c) == pytest.approx(1e7 * math.sqrt(2), rel=1e-12)
    assert math.exp(reach(x, LOSS, 3.0).log_c) == pytest.approx(2e7, rel=1e-12)
    # 3.8 = 4.0 - 0.2: a fifth of the way from 1e7 to 2e7 in log FLOPs
    assert math.exp(reach(x, LOSS, 3.8).log_c) == pytest.approx(1e7 * 2 ** 0.2, rel=1e-12)
    # worse than the first evaluation: the first evaluation's FLOPs, an upper bound
    first = reach(x, LOSS, 4.2)
    assert (first.how, first.censored, math.exp(first.log_c)) == (FIRST, AT_MOST, pytest.approx(1e7))


def test_the_first_crossing_of_a_curve_that_dips_and_rises():
    x = np.log(np.array([10.0, 20.0, 40.0, 80.0]) * FPS)
    r = reach(x, np.array([4.0, 2.9, 3.1, 2.5]), 3.0)  # first below 3.0 at 2e7: 10/11 of the way from 1e7
    assert math.exp(r.log_c) == pytest.approx(1e7 * 2 ** (1.0 / 1.1), rel=1e-12)


def test_a_seeds_multiplier_over_the_variants_own_flops():
    # the variant costs 1.1x per step and ends at step 20 on 2.75: the baseline needs 2e7 sqrt(2) FLOPs
    s = pair("all", "full", 0, ("v", 1.1e6), ("b", FPS), {"v": hist([10, 20], [3.2, 2.75]),
                                                          "b": hist(STEPS, LOSS)})
    assert s.target == 2.75 and s.flops == pytest.approx(2.2e7)
    assert math.exp(s.log_m) == pytest.approx(2e7 * math.sqrt(2) / 2.2e7, rel=1e-9)  # log_m: 10 decimals
    # a baseline with one evaluation, or no FLOPs: no value, and why
    one = pair("all", "full", 0, ("v", FPS), ("b", FPS), {"v": hist([20], [2.7]), "b": hist([40], [2.5])})
    assert one.reach is None and "single `val/loss` evaluation" in one.why and math.isnan(one.log_m)
    nofl = pair("all", "full", 0, ("v", math.nan), ("b", FPS), {"v": hist([20], [2.7]), "b": hist(STEPS, LOSS)})
    assert nofl.reach is None and "model/flops_per_token" in nofl.why
    step0 = pair("all", "full", 0, ("v", FPS), ("b", FPS), {"v": hist([0, 40], [9.0, 2.75]),
                                                            "b": hist([0, 10, 20, 40], [9.0, 4.0, 3.0, 2.5])})
    assert math.exp(step0.log_m) == pytest.approx(2e7 * math.sqrt(2) / 4e7, rel=1e-9)  # step 0 has no log


def law(c, a=2.0, b=2.0, e=0.5, c0=1e10):
    return a + b * (np.asarray(c, np.float64) / c0) ** -e


def test_extrapolation_below_the_curve_is_flagged():
    c = np.arange(20, 201, 20) * 1e9
    y = law(c)
    r = reach(np.log(c), y, float(law(1.5 * c[-1])))  # below every evaluation: the power law of the tail
    assert r.how == POWER and r.extrapolated and r.censored == "" and r.note == ""
    assert math.exp(r.log_c) == pytest.approx(1.5 * c[-1], rel=1e-6)  # an exact power law comes back
    s = pair("all", "v", 3, ("v", 1e9), ("b", 1e9), {"v": hist([200], [law(1.5 * c[-1])]),
                                                     "b": hist(c / 1e9, y)})
    assert read(s) == "power law (extrapolated)" and math.exp(s.log_m) == pytest.approx(1.5, rel=1e-6)
    # beyond 100x the curve's end, and below the fit's asymptote: counted as 100x, at least
    far = reach(np.log(c), y, float(law(1e3 * c[-1])))
    assert far.censored == AT_LEAST and math.exp(far.log_c) == pytest.approx(curve.CAP * c[-1])
    below = reach(np.log(c), y, 1.9)
    assert below.how == POWER and below.censored == AT_LEAST and "asymptote" in below.note
    # inside the curve: not flagged
    assert not reach(np.log(c), y, float(law(c[4]))).extrapolated


def test_an_ill_posed_power_law_falls_back_to_a_line_and_says_so():
    # 3 evaluations, exactly linear in log C: L = 3 - 0.2 log2(C / 1e7); 2.4 is reached at 8e7
    x = np.log(np.array([1e7, 2e7, 4e7]))
    r = reach(x, np.array([3.0, 2.8, 2.6]), 2.4)
    assert r.how == LINE and r.extrapolated and "3 tail evaluations for its 3 parameters" in r.note
    assert math.exp(r.log_c) == pytest.approx(8e7, rel=1e-9)
    # 8 evaluations exactly linear in log C: the power law's best exponent runs to its lower bound (c -> 0
    # is the line); the line reaches 2.2 one doubling past the end, 2.56e9
    c = 1e7 * 2.0 ** np.arange(8)
    lin = reach(np.log(c), 3 - 0.1 * np.arange(8), 2.2)
    assert lin.how == LINE and "ends at the bound 0.02" in lin.note and lin.censored == ""
    assert math.exp(lin.log_c) == pytest.approx(2.56e9, rel=1e-9)
    # a rising tail never gets lower: counted as 100x the end, at least
    up = reach(np.log(c), 2.5 + 0.01 * np.arange(8), 2.4)
    assert up.how == LINE and up.censored == AT_LEAST and "does not fall" in up.note
    assert math.exp(up.log_c) == pytest.approx(curve.CAP * c[-1])


def test_runs_side_by_side_by_hand():
    assert most_at_once((0, 10), []) == 1
    assert most_at_once((0, 10), [(10, 20), (-5, 0)]) == 1  # touching is not overlapping
    assert most_at_once((0, 10), [(1, 3), (2, 4), (5, 6)]) == 3
    assert most_at_once((0, 10), [(1, 3), (3, 4), (5, 12)]) == 2


# ------------------------------------------------------------------------------ simulation
# A baseline L_b(C) = 2 + 2 (C / 1e10)^-0.5 evaluated every 20 of 200 steps at 1e9 FLOPs per step; per
# seed a shift shared by both models (the seed's data and initial weights: pairing removes it) and
# independent noise on every evaluation; the variant is the same curve shifted by a compute factor
# k, L_v(C) = L_b(k C), at its own FLOPs per step. Its multiplier is k.
SEEDS, ALPHA = 8, 0.05
SHIFT_SD, EVAL_SD = 0.05, 0.004


def simulate(k: float, fps_v: float, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """One sweep's per-seed log-multipliers, and how many were extrapolated."""
    steps = np.arange(20, 201, 20, dtype=np.float64)
    out, ext = [], 0
    for _ in range(SEEDS):
        shift = rng.normal(0, SHIFT_SD)
        base = law(steps * 1e9) + shift + rng.normal(0, EVAL_SD, len(steps))
        final = float(law(k * 200 * fps_v)) + shift + rng.normal(0, EVAL_SD)
        s = pair("all", "v", 0, ("v", fps_v), ("b", 1e9), {"v": hist([200], [final]), "b": hist(steps, base)})
        out.append(s.log_m)
        ext += s.reach.extrapolated
    return np.array(out), ext


@pytest.mark.parametrize("repeats", [60, pytest.param(200, marks=pytest.mark.slow)])  # 200: ~30 s on 2 cores
@pytest.mark.parametrize("k, fps_v, extrapolated", [(0.7, 1e9, False), (1.5, 1e9, True), (1.2, 1.25e9, True)],
                         ids=["worse-inside-the-curve", "better-below-the-curve", "costlier-and-better"])
def test_simulated_sweeps_cover_the_known_multiplier(k, fps_v, extrapolated, repeats):
    """Coverage at least 1 - alpha less 3 binomial sd of the repeats (200: 0.904, 60: 0.866), half decided."""
    rng = np.random.default_rng(35)
    level = 1 - ALPHA
    cover = decided = ext = 0
    for _ in range(repeats):
        d, e = simulate(k, fps_v, rng)
        ext += e
        r = rule.decide(d, level, "max")  # a family of one: the report's rule at 1 - alpha
        cover += r.interval.low <= math.log(k) <= r.interval.high
        decided += r.verdict.word == (BETTER if k > 1 else WORSE)
    rate = cover / repeats
    # the sign interval's exact coverage at 8 seeds and 95%: 1 - 2 / 2^8 (its ends are the extremes)
    exact = 1 - 2 * float(sps.binom.cdf(signs.fixed_depth(SEEDS, level) - 1, SEEDS, 0.5))
    print(f"k={k} fps_v={fps_v:g}: coverage {rate:.3f} (nominal {level:.2f}, exact {exact:.4f}); "
          f"decided {decided}/{repeats}; extrapolated seeds {ext}/{repeats * SEEDS}")
    se = math.sqrt(level * (1 - level) / repeats)
    assert rate >= level - 3 * se
    assert decided >= repeats // 2  # the multiplier is far enough from 1x for the rule to see it
    # below the baseline's whole curve every seed is extrapolated (and flagged); inside it none is
    assert ext == (repeats * SEEDS if extrapolated else 0)


def test_the_worked_example_of_the_docs():
    """docs/REPORTS.md, "Compute multiplier": two seeds read by hand and the verdict over 8 seeds."""
    x = np.log(np.array([1e14, 2e14, 4e14]))
    one = reach(x, np.array([4.0, 3.0, 2.5]), 2.75)
    assert math.exp(one.log_c) / 4.4e14 == pytest.approx(0.643, abs=5e-4)
    two = reach(x, np.array([3.0, 2.8, 2.6]), 2.4)
    assert two.how == LINE and math.exp(two.log_c) / 4e14 == pytest.approx(2.0, rel=1e-9)
    m = np.array([1.8, 2.0, 2.3, 1.6, 2.1, 1.9, 0.9, 2.4])
    r = rule.decide(np.log(m), 0.95, "max")
    assert np.exp([r.interval.low, r.interval.high]) == pytest.approx([0.9, 2.4])
    assert math.exp(np.median(np.log(m))) == pytest.approx(1.95, abs=5e-3) and r.verdict.word == "not decided"
