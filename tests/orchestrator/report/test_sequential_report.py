"""The "Sequential seeds" section (render/sequential.py) and the pieces it rests on, on hand-made
numbers: the margin's reach at the cap, the two fixed designs of the savings line, the planner's cap."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.decide import signs
from orchestrator.report.planner import fixed_design
from orchestrator.report.render import sequential
from orchestrator.report.stats import rule, verdict_power


def _inside(n: int, sd: float, margin: float, level: float) -> bool:
    """n typical normal differences (their quantiles, median 0): the median's sign sequence lies
    inside +-margin (the sequence itself is checked against a numeric integration in test_signs.py)."""
    d = sd * sps.norm.ppf((np.arange(n) + 0.5) / n)
    lo, hi = signs.sign_sequence(d, level)
    return -margin < lo and hi < margin


@pytest.mark.parametrize("sd,margin,level", [(1.0, 0.5, 0.975), (0.02, 0.008, 0.95), (3.0, 4.0, 0.99)])
def test_margin_seeds_fits_and_is_near_the_first_n_that_fits(sd, margin, level):
    n = rule.margin_seeds(sd, margin, level)
    first = next(m for m in range(2, 10_000) if _inside(m, sd, margin, level))  # brute force
    assert n is not None and _inside(n, sd, margin, level) and first <= n <= math.ceil(1.1 * first)


def test_margin_seeds_out_of_reach_and_bad_input():
    assert rule.margin_seeds(1.0, 1e-4, 0.95, limit=1000) is None
    assert rule.margin_seeds(1.0, 0.0, 0.95) is None


def _pa(diffs: dict, base_n: int, base_mean: float = 2.0):
    rows = [SimpleNamespace(variant=v, n=len(d), diff_sd=float(np.std(d, ddof=1)), base_mean=base_mean,
                            diffs=tuple(d), confidence=1 - 0.05 / len(diffs), verdict="not decided")
            for v, d in diffs.items()]
    values = {"base": dict.fromkeys(range(base_n), base_mean)}
    values.update({v: dict.fromkeys(range(len(d)), base_mean) for v, d in diffs.items()})
    return SimpleNamespace(paired=True, rows=rows, values=values, metric="final/val_loss")


def test_the_section_says_both_fixed_designs_and_the_margin_out_of_reach():
    rng = np.random.default_rng(3)
    diffs = {"a": rng.normal(0, 0.02, 32), "b": rng.normal(-0.02, 0.02, 8)}
    pa = _pa(diffs, 32)
    decide = SimpleNamespace(wave=2, max_seeds=32)
    waves = {1: '{"n": {"a": 4, "b": 4}}', 2: '{"n": {"a": 8, "b": 8}}'}
    text = "\n".join(sequential.lines(pa, waves, decide, None, "min", margin=0.001))
    used = 32 + 32 + 8  # trials: the baseline's, a's and b's
    assert f"Compute: {used} finished trials." in text
    # the same cap: 32 seeds x 3 arms = 96 trials, 24 saved (25%)
    assert "Against a fixed design with the same cap (32 seeds x 3 arms = 96 trials" in text
    assert "saves 24 trials (25%)" in text
    # 1% of 2.0 = 0.02 against an sd near 0.02 at 3 comparisons: the sequential power is below 80%, so
    # the 80%-power design is said as what 80% needs, not as a saving
    assert "simulated power of" in text and "not a saving against it" in text
    # margin 0.001 at sd ~0.02 from the first look (4 seeds): out of reach at 32 seeds, named per comparison
    for v, d in diffs.items():
        sd = float(np.std(d[:4], ddof=1))
        need = rule.margin_seeds(sd, 0.001, 1 - 0.05 / 2)
        assert need is not None and need > 32
        assert f"`{v}`: sd {float(f'{sd:.3g}'):g} at the first look (4 seeds) needs {need} seeds" in text
    assert "out of reach at the cap" in text and sequential.NOT_VALID in text


def test_a_reachable_margin_is_said_reachable():
    d = np.array([0.001, -0.001] * 4)
    text = "\n".join(sequential.reach(_pa({"a": d}, 8), {}, SimpleNamespace(wave=2, max_seeds=32), 0.95, 0.5))
    assert "was within reach at the cap of 32 seeds for every comparison" in text


def test_fixed_design_states_its_cap():
    d = np.random.default_rng(0).normal(0, 1.0, 8)  # 1% of 2.0 = 0.02 against sd ~1: d_z ~0.01
    plan = fixed_design(_pa({"a": d}, 8), 0.95, None)
    assert plan.capped and plan.seeds == verdict_power.MAX_SEEDS
    assert plan.seeds_text() == f"more than {verdict_power.MAX_SEEDS} (the planner's cap; counted as 200)"
    # sd ~0.0016 against 0.02: d_z above 5, decided at the fewest seeds whose interval is finite (6 at 95%:
    # the sign-flip interval needs 2 / 2^n < 0.05)
    big = fixed_design(_pa({"a": -0.5 + 0.001 * np.array([0, 1, -1, 2, -2, 1, -1, 0])}, 8), 0.95, None)
    assert not big.capped and big.seeds == 6 and big.seeds_text() == "6"


def test_the_budget_is_stated_with_what_was_spent_and_each_projection():
    diffs = {"a": np.full(8, -0.05) + 0.001 * np.arange(8), "b": np.array([0.01, -0.01] * 3)}
    pa = _pa(diffs, 8)
    looks = {1: ('{"n": {"a": 6, "b": 6}, "spent": {"trials": 18, "core_hours": 0.9, "gpu_hours": 0}, "ended": '
                 '{"b": {"look": 1, "n": 6, "median": 0.0, "sd": 0.011, "need": null, "cost": {"trials": "inf", '
                 '"core_hours": "inf", "gpu_hours": "inf"}, "left": {"trials": 12, "core_hours": null, '
                 '"gpu_hours": "inf"}, "spent": false}}}'),
             2: '{"n": {"a": 8, "b": 6}, "spent": {"trials": 22, "core_hours": 1.1, "gpu_hours": 0}, "ended": {}}'}
    decide = SimpleNamespace(wave=2, max_seeds=32, budget="trials=30")
    text = "\n".join(sequential.lines(pa, looks, decide, None, "min"))
    assert "Budget (`decide.budget`): 30 trials. Spent against it: 22 trials, 1.1 core-hours (at the last look" in text
    assert ("`b`: at look 1 (6 seeds, median 0, sd 0.011) a decision needs more than 100000 seeds per arm: more than "
            "any budget (12 trials left)") in text
    assert "| b | 6 | not decided (inconclusive at budget) |" in text
    # no budget: nothing said; a budget under which nothing ended says so
    assert "Budget" not in "\n".join(sequential.lines(pa, looks, SimpleNamespace(wave=2, max_seeds=32), None, "min"))
    quiet = sequential.budget(pa, {2: looks[2]}, decide)
    assert "No comparison ended inconclusive at budget." in quiet[1]
