"""The cost budget of sequential seeds (``orchestrator.decide.budget``) and the projection it rests on
(``orchestrator.decide.reach.seeds_needed``): the projection against a brute-force search through the
sign sequence itself, the ledger and the screen on hand-made numbers, and whole simulated sweeps
through the real stopping code (``waves.run_waves``): a budgeted run ends a comparison out of reach
"inconclusive at budget" and decides the rest, and under the null (normal and skewed differences)
the false-verdict rate stays at or below alpha, budget stopping only ever removing verdicts."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.decide import budget, costs, reach, signs
from orchestrator.decide.costs import Budget, Cost, Ledger
from orchestrator.decide.verdict import AT_BUDGET, BETTER, WORSE
from orchestrator.decide.waves import Design, decide_wave, run_waves


def _decided(n: int, sd: float, center: float, margin: float | None, level: float) -> bool:
    """n typical normal differences (their quantiles) with median ``center``: the median's sign sequence
    excludes 0 or lies inside +-margin (the sequence is checked against numeric integration in
    test_signs.py)."""
    d = center + sd * sps.norm.ppf((np.arange(n) + 0.5) / n)
    lo, hi = signs.sign_sequence(d, level)
    return lo > 0 or hi < 0 or (margin is not None and -margin < lo and hi < margin)


@pytest.mark.parametrize("sd,center,margin,level", [(1.0, -0.8, None, 0.975), (1.0, 0.3, None, 0.95),
                                                    (0.02, 0.004, 0.01, 0.975), (2.0, 0.0, 1.5, 0.99),
                                                    (0.5, 0.05, 0.2, 0.975)])
def test_seeds_needed_fits_and_is_near_the_first_n_that_fits(sd, center, margin, level):
    n = reach.seeds_needed(sd, level, margin, center)
    first = next(m for m in range(2, 20_000) if _decided(m, sd, center, margin, level))  # brute force
    assert n is not None and _decided(n, sd, center, margin, level) and first <= n <= math.ceil(1.1 * first)


def test_seeds_needed_edges():
    assert reach.seeds_needed(1.0, 0.95, None, 0.0) is None  # a median of 0 never excludes 0
    assert reach.seeds_needed(1.0, 0.95, None, 1e-4, limit=1000) is None
    assert reach.seeds_needed(math.nan, 0.95, None, 1.0) is None
    # no spread: decided as soon as the sequence is finite at all (9 seeds at 98.33%, signs.py)
    assert reach.seeds_needed(0.0, 1 - 0.05 / 3, None, 0.1) == signs.min_seeds(1 - 0.05 / 3, sequential=True) == 9
    assert reach.margin_seeds(0.3, 0.2, 0.975) == reach.seeds_needed(0.3, 0.975, 0.2, 0.0)


@pytest.mark.parametrize("level", [0.95, 0.975, 1 - 0.05 / 3, 0.99])
def test_sequence_depth_by_bisection_is_the_linear_scan(level):
    threshold = math.log(1.0 / (1.0 - level))

    def scan(n: int) -> int:  # the definition: the first k whose mixture no longer rejects
        k = 0
        while k < (n + 1) // 2 and float(signs.log_mixture(k, n)) >= threshold * (1 - 1e-12):
            k += 1
        return k

    for n in [*range(1, 200), 511, 1000, 4097, 20_000]:
        assert signs.sequence_depth(n, level) == scan(n), n


def test_budget_text_parse_and_what_is_left():
    b = Budget(trials=60, core_hours=2.0)
    assert b.units == ("trials", "core_hours") and b.text() == "60 trials, 2 core-hours"
    assert b.to_text() == "trials=60,core_hours=2.0" and Budget.parse(b.to_text()) == b and Budget.parse("") is None
    spent = Cost(50.0, 1.5, 0.0)
    assert b.left(spent) == Cost(10.0, 0.5, math.inf)
    assert b.over(Cost(10.0, 0.5, 99.0), spent) == []  # exactly what is left fits; GPU-hours are not limited
    assert b.over(Cost(11.0, 0.6, 0.0), spent) == ["trials", "core_hours"]
    assert b.over(Cost(1.0, math.nan, 0.0), spent) == []  # hours not known yet: not over
    back = Cost.from_record(Cost(3.0, math.inf, math.nan).record())
    assert back.trials == 3.0 and back.core_hours == math.inf and math.isnan(back.gpu_hours)


def test_the_ledger_by_hand():
    launched = {"none": {0, 1, 2}, "a": {0, 1, 2}, "b": {0, 1}}
    walls = {"none": {0: 3600.0, 1: 7200.0}, "a": {0: 1800.0, 1: 1800.0, 2: 1800.0}, "b": {}}
    led = costs.measure(launched, walls, cores=2.0, gpus=0.0, flops={"none": 1e15, "a": 1e15, "b": 2e15})
    # none: 1.5 h a trial (mean of 1 and 2), a: 0.5 h; b has no time: the others' 4.5 h over 5e15 FLOPs,
    # times b's 2e15 = 1.8 h; spent: none 1 + 2 + 1.5 (seed 2 not timed), a 1.5, b 2 x 1.8 = 9.6 h x 2 cores
    assert led.per_trial["none"] == Cost(1.0, 3.0, 0.0) and led.per_trial["a"] == Cost(1.0, 1.0, 0.0)
    assert led.per_trial["b"].core_hours == pytest.approx(3.6)
    assert led.spent.trials == 8 and led.spent.core_hours == pytest.approx(19.2) and led.spent.gpu_hours == 0
    plain = costs.measure(launched, walls, cores=1.0, gpus=1.0)  # no FLOPs: the mean measured trial, 0.9 h
    assert plain.per_trial["b"] == Cost(1.0, pytest.approx(0.9), pytest.approx(0.9))
    blind = costs.measure(launched, {}, cores=1.0, gpus=0.0)
    assert blind.spent.trials == 8 and math.isnan(blind.spent.core_hours) and "no trial" in blind.basis
    assert costs.count(launched).spent.trials == 8


def test_the_screen_by_hand():
    level = 1 - 0.05 / 2
    clear = np.array([-1.0, -1.1, -0.9, -1.05, -0.95, -1.0])  # median -1, sd 0.07: decided at 8 seeds
    flat = np.array([-1.5, -0.5, -0.2, 0.2, 0.5, 1.5])  # median exactly 0: no number of seeds decides it
    led = Ledger(Cost(18.0), {v: Cost(1.0) for v in ("none", "a", "b")})
    keep, ended, size, seen = budget.screen([("a", clear, 6), ("b", flat, 6)], "none", 6, 2, Budget(trials=40), led,
                                            level, None, 1)
    # a: 8 seeds (the fewest with a finite sequence at 97.5%) = 2 more for a and 2 for the baseline: 4 <= 22
    assert reach.seeds_needed(float(clear.std(ddof=1)), level, None, -1.0) == 8
    assert keep == ["a"] and size == 2 and list(ended) == ["b"] and seen["b"] is ended["b"]
    assert seen["a"].fits and seen["a"].seeds == 8 and seen["a"].cost.trials == 4
    assert seen["a"].text(("trials",)).endswith("about 8 seeds per arm: 4 trials more, within the 22 trials left")
    p = ended["b"]
    assert p.seeds is None and p.median == 0.0 and p.n == 6 and p.left.trials == 22
    assert "more than 100000 seeds per arm: more than any budget (22 trials left)" in p.text(("trials",))
    # 3 trials left: its 4 do not fit: ended by its own projection, not for want of a wave
    keep, ended, _, _ = budget.screen([("a", clear, 6)], "none", 6, 2, Budget(trials=21), led, level, None, 1)
    assert keep == [] and ended["a"].seeds == 8 and ended["a"].cost.trials == 4 and not ended["a"].spent_out
    # two such arms with 5 left: each fits (4), a wave of 2 seeds for both and the baseline (6) does not, one (3) does
    two = [("a", clear, 6), ("c", clear, 6)]
    keep, ended, size, _ = budget.screen(two, "none", 6, 2, Budget(trials=23), led, level, None, 1)
    assert keep == ["a", "c"] and size == 1 and not ended
    # four with 4 left: each fits, but one seed for the four and the baseline (5) does not: the budget is spent
    four = [(v, clear, 6) for v in "aceg"]
    keep, ended, size, _ = budget.screen(four, "none", 6, 2, Budget(trials=22), led, level, None, 1)
    assert keep == [] and all(p.spent_out for p in ended.values()) and list(ended) == list("aceg")
    said = ended["a"].text(("trials",))
    assert "the budget is spent: one more seed for it and the baseline costs 2 trials, 4 trials left" in said
    # a margin makes the flat one decidable ("equivalent"): 0.8 against its sd 1.0 needs 33 seeds,
    # 2 x 27 more trials, above 22 left: ended with that number
    keep, ended, _, _ = budget.screen([("b", flat, 6)], "none", 6, 2, Budget(trials=40), led, level, 0.8, 1)
    need = reach.seeds_needed(float(flat.std(ddof=1)), level, 0.8, 0.0)
    assert need is not None and 30 < need < 40 and ended["b"].seeds == need
    assert ended["b"].cost.trials == 2 * (need - 6)


class DetSweep:
    """A sweep whose per-seed values depend only on (simulation, variant, seed): a budgeted and an
    unbudgeted run of the same simulation see the same data. A seed's shared part plus each arm's own
    noise plus its effect (the differences have sd 1 for normal noise)."""

    def __init__(self, effects: dict, sim: int, first: int, noise=None, base_noise=None):
        self.effects, self.sim = effects, sim
        self.noise = noise or (lambda r: r.normal(0.0, math.sqrt(0.5)))
        self.base_noise = base_noise or self.noise
        self.values: dict = {v: {} for v in effects}
        self.launch(list(effects), list(range(first)))

    def value(self, v, s: int) -> float:
        shared = np.random.default_rng([self.sim, s, 999]).normal(0.0, 3.0)
        r = np.random.default_rng([self.sim, s, list(self.effects).index(v)])
        return shared + self.effects[v] + (self.base_noise(r) if v == "none" else self.noise(r))

    def launch(self, variants, seeds):
        for v in variants:
            for s in seeds:
                self.values[v][s] = self.value(v, s)

    def fetch(self):
        return {v: dict(x) for v, x in self.values.items()}, {v: set(x) for v, x in self.values.items()}

    def trials(self) -> int:
        return sum(len(x) for x in self.values.values())


def _run(effects, sim, b: Budget | None, max_seeds=32, first=6, noise=None, base_noise=None):
    design = Design(baseline="none", variants=tuple(v for v in effects if v != "none"), mode="min", alpha=0.05,
                    margin=None, max_seeds=max_seeds, wave=2, budget=b)
    sweep = DetSweep(effects, sim, first, noise, base_noise)
    return run_waves(sweep.fetch, sweep.launch, design), sweep


def test_a_budgeted_run_ends_the_comparison_out_of_reach_and_decides_the_rest():
    # a: d_z 1.5 (about first-4 on the default sweep); b: d_z 0.02, out of reach at any affordable seeds
    effects = {"none": 0.0, "a": -1.5, "b": -0.02}
    runs = [_run(effects, i, Budget(trials=120), max_seeds=200) for i in range(200)]
    last = [w[-1] for w, _ in runs]
    assert all(w.done for w in last) and max(s.trials() for _, s in runs) <= 120
    a = [w.decisions[0] for w in last]
    b = [w.decisions[1] for w in last]
    assert np.mean([d.verdict.word == BETTER for d in a]) > 0.93  # measured: 0.97
    ended = [d for d in b if d.verdict.word == AT_BUDGET]
    assert len(ended) / len(b) > 0.95  # measured: 0.995, 148 of 200 at the first look
    # its seeds stopped far below the cap of 200, each with the projection that ended it stated
    assert max(d.launched for d in ended) < 60
    for d in ended:
        p = d.projection
        assert p is not None and p.n == len(d.seeds)
        assert p.spent_out or p.seeds is None or p.cost.trials > p.left.trials


def _false(waves, effects) -> bool:
    """A verdict that contradicts the truth: a direction without an effect."""
    return any(d.verdict.word in (BETTER, WORSE) and effects[d.variant] == 0 for w in waves for d in w.decisions)


NULL = {"none": 0.0, "a": 0.0, "b": 0.0}
SKEWED = {"noise": lambda r: r.exponential() - math.log(2), "base_noise": lambda r: 0.0}  # median-0 differences


@pytest.mark.parametrize("sims,paired", [(500, 300), pytest.param(2000, 600, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["normal", "skewed"])
def test_under_the_null_budget_stopping_keeps_the_error_below_alpha_and_only_removes_verdicts(kind, sims, paired):
    """The same bounds at both sizes (alpha is the claim, not a tolerance): 500 simulated sweeps in
    make test, 2000 with the slow tests (~25 s on 2 cores). Fewer sweeps only lose power: the
    binomial sd of the rate at 5% is 1.0 point over 500 (0.5 over 2000), so a rule whose true
    error were 8% would still fail the 500 with probability above 99%."""
    kw = SKEWED if kind == "skewed" else {}
    offset = 100_000 * (kind == "skewed")
    errors, ended, unshrunk, kept, diffs = 0, 0, 0, 0, []
    for i in range(sims):
        waves, sweep = _run(NULL, offset + i, Budget(trials=400), **kw)
        errors += _false(waves, NULL)
        ended += sum(d.verdict.word == AT_BUDGET for d in waves[-1].decisions)
        assert sweep.trials() <= 400
        if i < 300:
            diffs += [sweep.values["a"][s] - sweep.values["none"][s] for s in range(6)]
        # the same data without a budget: where no wave was shrunk the looks are the same, so each verdict of
        # the budgeted run is the unbudgeted run's too (budget stopping only ever stops a sequence earlier)
        if i < paired and all(len(w.next_seeds) in (0, 2) for w in waves):
            free, _ = _run(NULL, offset + i, None, **kw)
            unshrunk += 1
            verdicts = {d.variant: d.verdict.word for d in free[-1].decisions}
            for d in waves[-1].decisions:
                if d.verdict.word in (BETTER, WORSE):
                    kept += 1
                    assert verdicts[d.variant] == d.verdict.word
    if kind == "skewed":
        assert sps.skew(diffs) > 1.5  # measured: about 2 (an exponential's skewness is 2)
    rate = errors / sims
    assert rate <= 0.05, rate  # measured: 1.9% normal, 1.6% skewed (without the budget, first 600: 2.5% and 2.0%)
    assert 0.5 < ended / (2 * sims) < 0.99  # the budget did stop comparisons (measured: 95% and 97%)
    assert unshrunk > paired / 2 and kept > 0  # measured: 600 of 600 (400 trials never shrink a wave), 12 and 11


def test_a_resumed_driver_keeps_a_comparison_ended_at_budget():
    # b would continue on its data (a clear effect), but an earlier look ended it at budget: it stays ended,
    # with the recorded projection, and gets no seeds; the record says what was spent and what ended
    rng = np.random.default_rng(1)
    values = {"none": {s: 3.0 + 0.1 * s for s in range(8)}}
    values["a"] = {s: x + rng.normal(0, 1.0) for s, x in values["none"].items()}
    values["b"] = {s: x - 1.0 + rng.normal(0, 0.01) for s, x in values["none"].items()}
    launched = {v: set(range(8)) for v in values}
    design = Design(baseline="none", variants=("a", "b"), mode="min", alpha=0.05, margin=None, max_seeds=32, wave=2,
                    budget=Budget(trials=10**9))  # a (median of 8 N(0, 1) differences) fits: it continues
    recorded = budget.Projection(1, 6, -1.0, 0.01, 8, Cost(4.0), Cost(2.0))
    w = decide_wave(values, launched, design, 2, stopped={"b": recorded})
    b = w.decisions[1]
    assert b.verdict.word == AT_BUDGET and b.projection == recorded and w.next_variants == ["none", "a"]
    rec = w.record()
    assert rec["spent"]["trials"] == 24 and rec["ended"] == {} and rec["verdict"]["b"] == AT_BUDGET
    # without it, b is decided at 8 seeds
    assert decide_wave(values, launched, design, 2).decisions[1].verdict.word == BETTER
