"""Wall-clock speedups (``orchestrator.report.wallclock``): the interval arithmetic against hand
computations (order statistics picked with scipy's binomial, not the code's own depth functions), the
rounds a level needs, a trial's shape and its hash written out by hand, and ``throughput.json``
matched, or refused as stale or foreign."""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest
import scipy.special as spc
import scipy.stats as sps

from orchestrator.cli.report import MAX_ROUNDS as CLI_MAX_ROUNDS
from orchestrator.decide import signs
from orchestrator.report.compare.results import PairedRow
from orchestrator.report.multiplier import Multipliers
from orchestrator.report.wallclock import MAX_ROUNDS, auto_rounds, speedup, store
from orchestrator.report.wallclock.shapes import Need, shape_hash, shape_of

M = np.array([1.8, 2.0, 2.3, 1.6, 2.1, 1.9, 0.9, 2.4])  # docs/REPORTS.md's worked example
# step-time ratios variant / baseline over 12 rounds;
# sorted: 1.07 1.08 1.09 1.09 1.10 1.10 1.11 1.11 1.12 1.12 1.13 1.30
RATIOS = [1.10, 1.12, 1.08, 1.11, 1.09, 1.13, 1.10, 1.07, 1.11, 1.12, 1.09, 1.30]


def mrow(log_m, confidence: float, verdict: str = "not decided", note: str = "", seq_ci=None) -> PairedRow:
    nan = math.nan
    lo, hi = (min(log_m), max(log_m)) if seq_ci is None else seq_ci
    return PairedRow(variant="full", n=len(log_m), seeds=tuple(range(len(log_m))), base_mean=nan, diff_mean=nan,
                     diff_pct=nan, diff_sd=nan, d_z=nan, ci_low=lo, ci_high=hi, confidence=confidence, p_perm=nan,
                     p_perm_holm=nan, perm_method="", w_plus=nan, p_wilcoxon=nan, p_wilcoxon_holm=nan,
                     wilcoxon_method="", zeros=0, min_p_holm=nan, mde=nan, mde_pct=nan, verdict=verdict,
                     diffs=tuple(log_m), note=note)


def depth(n: int, level: float) -> int:
    """k of the sign interval [x_(k), x_(n+1-k)]: the largest k with 2 P(Bin(n, 1/2) <= k - 1) <= 1 - level."""
    return max(k for k in range(n // 2 + 1) if k == 0 or 2 * sps.binom.cdf(k - 1, n, 0.5) <= 1 - level)


NEED = Need("all", "full", "b" * 16, "v" * 16, 1.1)


def test_the_product_interval_is_the_multipliers_own_and_the_rounds_at_the_error_it_leaves_by_hand():
    s = speedup(NEED, mrow(np.log(M), 0.95), RATIOS, sequential=False)
    # one comparison at 95%: 8 seeds -> the multiplier's own interval [min, max], exact error e = 2 / 2^8;
    # the rounds get 0.05 - e = 0.0421875: 12 rounds -> the 3rd from each end (2 P(B <= 2) = 0.0386 <= it)
    e = 2 / 2 ** 8
    assert depth(8, 0.95) == 1 and 2 * sps.binom.cdf(0, 8, 0.5) == pytest.approx(e)
    assert 2 * sps.binom.cdf(2, 12, 0.5) <= 0.05 - e < 2 * sps.binom.cdf(3, 12, 0.5)
    assert depth(12, 1 - (0.05 - e)) == 3
    assert s.level == pytest.approx(1 - (0.05 - e)) and s.m_level == pytest.approx(1 - e) and s.confidence == 0.95
    assert (s.m_low, s.m_high) == (pytest.approx(0.9), pytest.approx(2.4))
    # RATIOS sorted: 1.07 1.08 1.09 1.09 ... 1.12 1.12 1.13 1.30
    assert (s.s_low, s.s_high) == (pytest.approx(1 / 1.12), pytest.approx(1 / 1.09))
    assert s.multiplier == pytest.approx(math.sqrt(1.9 * 2.0))  # exp of the median log: the middle two's geometric mean
    assert s.step_ratio == pytest.approx(1 / math.sqrt(1.10 * 1.11))
    assert s.throughput == pytest.approx(1.1 / math.sqrt(1.10 * 1.11))
    assert s.speedup == pytest.approx(math.sqrt(1.9 * 2.0) * 1.1 / math.sqrt(1.10 * 1.11))
    assert (s.low, s.high) == (pytest.approx(0.9 / 1.12 * 1.1), pytest.approx(2.4 / 1.09 * 1.1))
    assert s.verdict == "not decided" and s.rounds == 12


def test_a_decided_speedup_and_one_that_no_round_count_could_bound():
    m = np.array([2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7])
    s = speedup(NEED, mrow(np.log(m), 0.95), RATIOS, sequential=False)
    assert s.low == pytest.approx(2.0 / 1.12 * 1.1) and s.verdict == "faster"  # the rounds' 3rd from the top
    slow = speedup(Need("all", "full", "b" * 16, "v" * 16, 1.0), mrow(np.log(m / 4), 0.95), RATIOS, False)
    assert slow.high == pytest.approx(2.7 / 4 / 1.09) and slow.verdict == "slower"
    # 3 rounds: the sign interval at 1 - 0.0422 needs 2 / 2^n <= 0.0422, n >= 6: it is the whole line
    few = speedup(NEED, mrow(np.log(m), 0.95), RATIOS[:3], sequential=False)
    assert (few.s_low, few.s_high, few.low, few.high) == (0.0, math.inf, 0.0, math.inf)
    assert few.verdict == "cannot decide"


def test_after_sequential_seeds_the_multiplier_factor_is_the_sign_confidence_sequence():
    # 12 seeds at 97.5%: the mixture martingale 2^n B(1/2 + S, 1/2 + n - S) / B(1/2, 1/2) of S positives,
    # computed here with scipy, rejects while it is >= 1 / 0.025; k = the first S (from 0) where it does not
    logm = np.log(np.linspace(1.2, 2.3, 12))
    n, level = 12, 0.975

    def log_mix(s):
        return n * math.log(2) + spc.betaln(0.5 + s, 0.5 + n - s) - spc.betaln(0.5, 0.5)

    k = next(s for s in range(n) if log_mix(s) < math.log(1 / (1 - level)))
    assert k >= 1
    s = speedup(NEED, mrow(logm, 0.95), RATIOS, sequential=True)
    srt = np.sort(np.exp(logm))
    assert (s.m_low, s.m_high) == (pytest.approx(srt[k - 1]), pytest.approx(srt[n - k]))
    fixed = speedup(NEED, mrow(logm, 0.95), RATIOS, sequential=False)
    assert fixed.m_low >= s.m_low and fixed.m_high <= s.m_high  # the sequence is the wider


def test_same_model_keeps_the_multipliers_own_interval_and_untested_has_none():
    same = Need("all", "lr=0.01", "a" * 16, "a" * 16, 1.0)
    s = speedup(same, mrow(np.log(M), 0.95), None, sequential=False)
    assert (s.low, s.high, s.confidence, s.level) == (pytest.approx(0.9), pytest.approx(2.4), 0.95, 0.95)
    assert (s.step_ratio, s.rounds) == (1.0, 0)
    t = speedup(NEED, mrow(np.log(M[:1]), math.nan, verdict="not tested", note="not tested: 1 seed"), RATIOS, False)
    assert t.verdict == "not tested" and math.isnan(t.low) and t.note == "not tested: 1 seed"


def test_auto_rounds_are_enough_for_a_finite_interval_at_the_smallest_level():
    def mult(confidence):
        return Multipliers(rows={"all": [mrow(np.log(M), confidence)]})

    # 2 comparisons (97.5%): each factor at 98.75%, 2 / 2^8 <= 0.0125: 8 rounds would do; the default 12 stands
    assert auto_rounds(mult(0.975)) == 12
    # 200 comparisons: 1 - 0.05 / 400 per factor: 2 / 2^n <= 1.25e-4 first at n = 14
    assert 2 / 2 ** 13 > 0.05 / 400 >= 2 / 2 ** 14
    assert auto_rounds(mult(1 - 0.05 / 200)) == 14


def row(**over) -> pd.Series:
    base = {"params.resolved.model.d_model": 64.0, "params.resolved.model.router": "full",
            "params.resolved.model.n_kv_heads": None, "params.resolved.model.init_std": "auto",
            "params.resolved.model.router_init": "paper", "params.resolved.model.router_prune": None,
            "params.resolved.model.router_prune.top_p": 0.9, "params.resolved.model.router_prune.start": 10,
            "params.train.batch_size": 4, "params.train.seq_len": 32.0, "params.train.grad_accum": 2,
            "params.train.device": "cpu", "params.train.compile": False, "params.optim.lr": 0.003}
    return pd.Series({**base, **over}, dtype=object)


def test_a_trials_shape_and_its_hash_by_hand():
    shape = shape_of(row())
    want = {"model": {"d_model": 64, "n_kv_heads": None, "router": "full", "router_prune": {"start": 10, "top_p": 0.9}},
            "batch_size": 4, "seq_len": 32, "grad_accum": 2, "device": "cpu", "compile": False, "threads": None}
    assert shape == want  # init_std, router_init and the optimizer are not part of a step's work
    text = ('{"batch_size": 4, "compile": false, "device": "cpu", "grad_accum": 2, "model": {"d_model": 64, '
            '"n_kv_heads": null, "router": "full", "router_prune": {"start": 10, "top_p": 0.9}}, "seq_len": 32, '
            '"threads": null}')
    assert shape_hash(shape) == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert shape_hash(shape_of(row(**{"params.resolved.model.init_std": 0.02}))) == shape_hash(shape)
    assert shape_hash(shape_of(row(**{"params.train.seq_len": 64}))) != shape_hash(shape)
    # a run without pruning: the nested fields are missing (NaN) and the field is null
    plain = shape_of(row(**{"params.resolved.model.router_prune.top_p": math.nan,
                            "params.resolved.model.router_prune.start": math.nan}))
    assert plain["model"]["router_prune"] is None
    assert shape_of(row(**{"params.train.batch_size": math.nan})) is None


MEASURED = {"machine": {"device": "cpu", "cpu": "x", "dtype": "fp32", "torch": "2"}, "commit": "abc", "threads": 1,
            "clock": "thread CPU time", "rounds": 3, "load_before": [0.5], "load_after": [0.6],
            "pairs": [{"baseline": "b" * 16, "variant": "v" * 16, "ratios": [1.0, 1.1, 1.2],
                       "step_ms": {"baseline": 10.0, "variant": 11.0}}]}
SHAPES = {"b" * 16: {"model": {"router": "none"}}, "v" * 16: {"model": {"router": "full"}}}


def test_a_saved_measurement_is_read_back_where_its_hashes_match(tmp_path):
    path = tmp_path / store.FILE
    assert store.load(path, "s", [("b" * 16, "v" * 16)]) == ({}, {}, "")  # no file: not measured
    store.save(path, "s", SHAPES, MEASURED)
    doc = json.loads(path.read_text())
    assert doc["format"] == store.FORMAT and doc["shapes"] == SHAPES and doc["commit"] == "abc"
    entries, rec, why = store.load(path, "s", [("b" * 16, "v" * 16)])
    assert why == "" and entries[("b" * 16, "v" * 16)]["ratios"] == [1.0, 1.1, 1.2]
    assert rec["rounds"] == 3 and rec["machine"]["cpu"] == "x" and rec["created"] == doc["created"]


def test_a_stale_or_foreign_file_is_refused_with_one_line(tmp_path):
    path = tmp_path / store.FILE
    store.save(path, "s", SHAPES, MEASURED)
    entries, _, why = store.load(path, "s", [("b" * 16, "v" * 16), ("b" * 16, "w" * 16)])
    assert entries == {} and why.startswith(f"{store.FILE} is stale: 1 of the 2 pairs of models this report compares "
                                            f"are not in it at their model/shape hash (e.g. baseline {'b' * 16} and "
                                            f"variant {'w' * 16})")
    assert why.endswith("`lime report s --throughput` measures again") and "\n" not in why
    _, _, why = store.load(path, "other", [("b" * 16, "v" * 16)])
    assert why.startswith(f"{store.FILE} is stale: it was measured for sweep 's', not 'other'")
    path.write_text('{"format": "something-else"}')
    assert "is not a measurement this code reads (format 'something-else'" in store.load(path, "s", [])[2]
    path.write_text("{not json")
    assert store.load(path, "s", [])[2].startswith(f"{store.FILE} cannot be read (JSONDecodeError)")


def test_the_clis_round_limit_is_the_reports():
    assert CLI_MAX_ROUNDS == MAX_ROUNDS == 200


def test_the_product_interval_covers_the_true_speedup_at_least_at_its_level():
    # 8 seeds of log M ~ N(log 1.5, 0.3) (median multiplier 1.5) and 12 rounds of log ratio ~ N(log 1.2, 0.05)
    # (median throughput 1 / 1.2), FLOPs per step 1.1x: the true speedup is 1.5 x 1.1 / 1.2. Bonferroni over the
    # two factors: coverage >= 95% (independent factors give (1 - 0.025)^2 ~ 95.1% or more)
    rng = np.random.default_rng(0)
    truth, sims = 1.5 * 1.1 / 1.2, 2000
    hits = 0
    for _ in range(sims):
        s = speedup(NEED, mrow(rng.normal(math.log(1.5), 0.3, 8), 0.95),
                    list(np.exp(rng.normal(math.log(1.2), 0.05, 12))), sequential=False)
        hits += s.low <= truth <= s.high
    assert hits / sims >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / sims)


@pytest.mark.parametrize("level", [0.95, 0.975, 0.9875, 0.99375, 0.999])
def test_the_multipliers_exact_error_is_the_binomial_tail_at_its_depth(level):
    for n in range(1, 25):
        k = depth(n, level)
        want = 1.0 if k == 0 else 2 * sps.binom.cdf(k - 1, n, 0.5)
        assert signs.fixed_error(n, level) == pytest.approx(want, rel=1e-12)
        assert k == 0 or signs.fixed_error(n, level) <= (1 - level) * (1 + 1e-9)
