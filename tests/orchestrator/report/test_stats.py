"""Tests of orchestrator.report.compare.across_seeds against hand-computed numbers, brute force and scipy."""
from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
import scipy.stats as sps

from lime_arch.errors import ConfigError
from orchestrator.report.compare.across_seeds import compare, compare_by
from orchestrator.report.render.comparisons import comparison_markdown
from orchestrator.report.stats.multiplicity import holm
from orchestrator.report.stats.ranks import cliffs_delta, min_reachable_p

M = "final/val_loss"


def frame(groups: dict, axis: str = "router", extra: list[dict] | None = None) -> pd.DataFrame:
    rows = [{axis: k, "seed": s, "status": "finished", M: v}
            for k, vals in groups.items() for s, v in enumerate(vals)]
    return pd.DataFrame(rows + (extra or []))


def h_from_ranks(rank_groups: list[list[float]], tie_sizes: list[int] = ()) -> float:
    """H = (12/(N(N+1)) sum R_i^2/n_i - 3(N+1)) / (1 - sum(t^3 - t)/(N^3 - N))."""
    n = sum(len(r) for r in rank_groups)
    h = 12 / (n * (n + 1)) * sum(sum(r) ** 2 / len(r) for r in rank_groups) - 3 * (n + 1)
    return h / (1 - sum(t**3 - t for t in tie_sizes) / (n**3 - n))


def midranks(values: list[float]) -> list[float]:
    order = sorted(values)
    return [order.index(v) + 1 + (order.count(v) - 1) / 2 for v in values]


# ---------------------------------------------------------------- Kruskal-Wallis

def test_kruskal_hand_example_no_ties():
    a, b, c = [1.2, 3.4, 2.2, 5.0], [4.1, 6.3, 7.7], [8.8, 2.9, 9.5, 10.1, 6.8]
    # Ranks in the pooled sample of 12, read off by hand.
    h = h_from_ranks([[1, 4, 2, 6], [5, 7, 9], [10, 3, 11, 12, 8]])
    assert h == pytest.approx(12 / 156 * (13**2 / 4 + 21**2 / 3 + 44**2 / 5) - 39)
    comp = compare(frame({"none": a, "full": b, "average": c}))
    o = comp.omnibus
    assert o.status == "ok" and o.df == 2 and o.n_total == 12
    assert o.h == pytest.approx(h, rel=1e-12)
    assert o.p == pytest.approx(math.exp(-h / 2), rel=1e-10)  # chi-square sf with 2 df
    assert o.epsilon_sq == pytest.approx(h / 11, rel=1e-12)
    ref = sps.kruskal(a, b, c)
    assert (o.h, o.p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)


def test_kruskal_hand_example_with_ties():
    a, b, c = [1, 2, 2, 3], [2, 4, 4], [3, 5, 6, 6]
    # Midranks: 2,2,2 -> 3; 3,3 -> 5.5; 4,4 -> 7.5; 6,6 -> 10.5. Tie sizes 3, 2, 2, 2.
    h = h_from_ranks([[1, 3, 3, 5.5], [3, 7.5, 7.5], [5.5, 9, 10.5, 10.5]], [3, 2, 2, 2])
    comp = compare(frame({"none": a, "full": b, "average": c}))
    assert comp.omnibus.h == pytest.approx(h, rel=1e-12)
    assert comp.omnibus.p == pytest.approx(math.exp(-h / 2), rel=1e-10)
    assert comp.omnibus.epsilon_sq == pytest.approx(h / 10, rel=1e-12)
    uncorrected = h_from_ranks([[1, 3, 3, 5.5], [3, 7.5, 7.5], [5.5, 9, 10.5, 10.5]])
    assert comp.omnibus.h != pytest.approx(uncorrected, rel=1e-6)


def brute_force_perm_p(groups: list[list[float]]) -> float:
    pooled = [v for g in groups for v in g]
    ranks = midranks(pooled)
    _, counts = np.unique(pooled, return_counts=True)
    ties = [int(t) for t in counts if t > 1]
    sizes = [len(g) for g in groups]
    obs = h_from_ranks([ranks[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(sizes))], ties)
    idx = set(range(len(pooled)))
    hits = total = 0
    for first in combinations(sorted(idx), sizes[0]):
        rest = sorted(idx - set(first))
        for second in combinations(rest, sizes[1]):
            third = sorted(set(rest) - set(second))
            h = h_from_ranks([[ranks[i] for i in g] for g in (first, second, third)], ties)
            hits += h >= obs - 1e-9
            total += 1
    assert total == math.factorial(len(pooled)) // math.prod(math.factorial(s) for s in sizes)
    return hits / total


def test_permutation_p_exact_separated():
    groups = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    comp = compare(frame(dict(zip(["none", "full", "average"], groups))))
    o = comp.omnibus
    assert o.perm_method == "exact" and o.perm_count == 1680
    # Only the 3! relabellings of the separated split reach the maximal H.
    assert brute_force_perm_p(groups) == pytest.approx(6 / 1680)
    assert o.perm_p == pytest.approx(6 / 1680, rel=1e-12)
    assert o.p > o.perm_p  # the chi-square approximation is conservative here


def test_permutation_p_exact_with_ties():
    groups = [[1.0, 2.0, 2.0], [2.0, 3.0, 5.0], [4.0, 6.0, 6.0]]
    comp = compare(frame(dict(zip(["none", "full", "average"], groups))))
    assert comp.omnibus.perm_method == "exact"
    assert comp.omnibus.perm_p == pytest.approx(brute_force_perm_p(groups), rel=1e-12)


def test_permutation_monte_carlo_is_seeded():
    df = frame({k: [i + 0.1 * s for s in range(3)] for i, k in enumerate("abcd")}, axis="router")
    a = compare(df, baseline="a", seed=3, n_resamples=2000).omnibus
    b = compare(df, baseline="a", seed=3, n_resamples=2000).omnibus
    assert a.perm_method == "monte-carlo" and a.perm_count == 2000
    assert a.perm_p == b.perm_p and 1 / 2001 <= a.perm_p <= 5 / 2001


def test_no_permutation_with_five_or_more_per_group():
    rng = np.random.default_rng(1)
    comp = compare(frame({"none": rng.normal(size=5), "full": rng.normal(size=6)}))
    assert comp.omnibus.perm_method == "" and math.isnan(comp.omnibus.perm_p)


# ---------------------------------------------------------------- post-hoc

def test_holm_hand_example():
    adjusted, reject = holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06])
    assert reject == [True, False, False]
    assert holm([]) == ([], [])


def test_posthoc_uses_holm_not_holm_sidak():
    sep = {"none": [10, 11, 12, 13, 14], "a": [1, 2, 3, 4, 5], "b": [20, 21, 22, 23, 24],
           "c": [30, 31, 32, 33, 34]}
    comp = compare(frame(sep))
    base = [r for r in comp.posthoc if r.family == "baseline"]
    assert [(r.a, r.b) for r in base] == [("a", "none"), ("b", "none"), ("c", "none")]
    for r in base:
        assert r.method == "exact" and r.p == pytest.approx(2 / 252)
        assert r.p_holm == pytest.approx(3 * 2 / 252, rel=1e-12)  # Holm-Sidak: 1-(1-p)^3
        assert r.reject and r.min_p == pytest.approx(2 / 252)
    assert [r.cliffs_delta for r in base] == [-1.0, 1.0, 1.0]
    pairs = [r for r in comp.posthoc if r.family == "all-pairs"]
    assert len(pairs) == 6
    assert all(r.p_holm == pytest.approx(6 * 2 / 252, rel=1e-12) for r in pairs)


def test_cliffs_delta_hand_examples():
    # 1<2,1<2,1<4 | 2=2,2=2,2<4 | 3>2,3>2,3<4  -> (2 - 5) / 9
    assert cliffs_delta([1, 2, 3], [2, 2, 4]) == pytest.approx(-1 / 3)
    assert cliffs_delta([5, 6], [1, 2, 3]) == 1.0
    assert cliffs_delta([1, 2], [5, 6]) == -1.0
    assert cliffs_delta([2, 2], [2, 2, 2]) == 0.0
    u = sps.mannwhitneyu([1, 2, 3], [2, 2, 4]).statistic
    assert 2 * u / 9 - 1 == pytest.approx(-1 / 3)  # same as the rank-biserial correlation


def test_min_reachable_p():
    assert min_reachable_p(3, 3) == pytest.approx(0.1)
    assert min_reachable_p(5, 5) == pytest.approx(2 / 252)
    assert min_reachable_p(1, 1) == 1.0
    exact = sps.mannwhitneyu([1, 2, 3, 4], [5, 6, 7], method="exact").pvalue
    assert min_reachable_p(4, 3) == pytest.approx(exact)


def test_three_seeds_cannot_reach_significance_note():
    comp = compare(frame({"none": [3.0, 3.1, 3.2], "full": [2.0, 2.1, 2.2]}))
    (row,) = [r for r in comp.posthoc if r.family == "baseline"]
    assert row.p == pytest.approx(0.1) and row.min_p == pytest.approx(0.1) and not row.reject
    assert any("smallest p-value" in n and "0.1" in n for n in comp.notes)


def test_holm_makes_significance_unreachable_note():
    comp = compare(frame({"none": [1, 2, 3, 4], "a": [5, 6, 7, 8], "b": [9, 10, 11, 12]}))
    # 4 vs 4: min p = 2/70 < 0.05, but Holm over 2 comparisons doubles it.
    assert any("after Holm over 2" in n for n in comp.notes)


def test_mwu_with_ties_uses_exact_permutation():
    comp = compare(frame({"none": [3.0, 4.0, 5.0], "full": [1.0, 1.0, 2.0]}))
    (row,) = [r for r in comp.posthoc if r.family == "baseline"]
    # Only 1 of the C(6,3) = 20 splits gives U = 0: two-sided p = 2/20, not the normal 0.077.
    assert row.method == "exact permutation (ties)"
    assert row.p == pytest.approx(0.1) and row.u == 0.0


# ---------------------------------------------------------------- summaries and CIs

def test_group_summary_numbers():
    comp = compare(frame({"none": [3.0, 3.2, 3.4], "full": [2.8, 2.9, 3.0, 3.7]}))
    assert [g.value for g in comp.groups] == ["none", "full"]
    none, full = comp.group("none"), comp.group("full")
    assert (none.n, none.mean, none.std, none.median) == pytest.approx((3, 3.2, 0.2, 3.2))
    assert full.mean == pytest.approx(3.1) and full.median == pytest.approx(2.95)
    assert full.std == pytest.approx(math.sqrt((0.09 + 0.04 + 0.01 + 0.36) / 3))
    assert full.change_pct == pytest.approx(100 * (3.1 - 3.2) / 3.2)
    assert none.change_pct == 0.0
    # Student's t: 3.2 +- t(0.975, 2) 0.2 / sqrt(3) = 3.2 +- 4.3027 * 0.11547
    assert (none.ci_low, none.ci_high) == pytest.approx((3.2 - 0.496828, 3.2 + 0.496828), abs=1e-6)
    frame_ = comp.to_frame()
    assert list(frame_["value"]) == ["none", "full"] and list(frame_["n"]) == [3, 4]


def test_change_pct_uses_absolute_baseline():
    comp = compare(frame({"none": [-2.0, -2.0], "full": [-1.0, -1.0]}))
    assert comp.group("full").change_pct == pytest.approx(50.0)


def test_group_ci_is_scipys_t_interval_and_seed_free():
    full = [2.0, 2.5, 2.2, 2.1, 2.8, 2.4, 2.35, 2.05, 2.62, 2.71]
    df = frame({"none": [3.0, 3.3, 3.1, 2.9, 3.6, 3.2], "full": full})
    ga, gc = compare(df, seed=7).group("full"), compare(df, seed=8).group("full")
    assert (ga.ci_low, ga.ci_high) == (gc.ci_low, gc.ci_high)
    ref = sps.ttest_1samp(full, 0.0).confidence_interval(0.95)
    assert (ga.ci_low, ga.ci_high) == pytest.approx((ref.low, ref.high), rel=1e-12)


def test_row_order_does_not_change_the_report():
    df = frame({"none": [3.0, 3.3, 3.1, 2.9], "full": [2.0, 2.5, 2.2, 2.1],
                "average": [2.5, 2.7, 2.4, 2.9]},
               extra=[{"router": "full", "seed": 9, "status": "diverged", M: np.nan}])
    shuffled = df.sample(frac=1.0, random_state=0).reset_index(drop=True)
    one, two = comparison_markdown(compare(df)), comparison_markdown(compare(df))
    assert one == two == comparison_markdown(compare(shuffled))
    assert "| full | 4 | 2.2 |" in one


def test_markdown_of_a_small_case_by_hand():
    # none 3.0 3.2 3.1, full 2.0 2.2 2.1 (+ a diverged full trial). Means 3.1 / 2.1, std 0.1 each,
    # change (2.1 - 3.1) / 3.1 = -32.26%. Student's t CI: mean +- 4.3027 * 0.1 / sqrt(3) = +- 0.2484.
    # Ranks: full 1 2 3, none 4 5 6 -> H = 12/42 (15^2/3 + 6^2/3) - 21 = 27/7 = 3.857, df 1,
    # p = erfc(sqrt(H/2)) = 0.0495, epsilon^2 = H/5 = 0.771; exact permutation p: 2 of the
    # C(6,3) = 20 splits are as extreme -> 0.1. Mann-Whitney: U(full) = 0, U(none) = 9, exact
    # p = 2/20 = 0.1 = the smallest reachable p, Cliff's delta -1 / +1.
    df = frame({"none": [3.0, 3.2, 3.1], "full": [2.0, 2.2, 2.1]},
               extra=[{"router": "full", "seed": 3, "status": "diverged", M: np.nan}])
    expected = """\
**final/val_loss** by `router` (baseline: `none`; samples are seeds; seed 0, 9999 resamples)

| value | n | mean | std | median | 95% CI (mean) | change vs baseline |
|---|---|---|---|---|---|---|
| none | 3 | 3.1 | 0.1 | 3.1 | [2.85, 3.35] | 0.00% |
| full | 3 | 2.1 | 0.1 | 2.1 | [1.85, 2.35] | -32.26% |

Kruskal-Wallis (tie-corrected): H = 3.86, df = 1, p = 0.0495 (chi-square), epsilon^2 = 0.771, \
N = 6; permutation p = 0.1 (exact, 20 permutations).

Post-hoc: two-sided Mann-Whitney U, Holm-corrected within each family; delta is Cliff's delta \
(positive: a has the larger metric); min p is the smallest p the sample sizes allow.

| family | a | b | n_a | n_b | U | p | p (Holm) | Holm p <= 0.05 | delta | min p | test |
|---|---|---|---|---|---|---|---|---|---|---|---|
| baseline | full | none | 3 | 3 | 0 | 0.1 | 0.1 | no | -1 | 0.1 | exact |
| all-pairs | none | full | 3 | 3 | 9 | 0.1 | 0.1 | no | 1 | 0.1 | exact |

Excluded trials:

| value | seed | status | reason |
|---|---|---|---|
| full | 3 | diverged | status is 'diverged', not 'finished' |

Notes:

- some tested group has fewer than 5 samples: the chi-square p of Kruskal-Wallis is unreliable, \
use the exact permutation p
- baseline: the smallest p-value these sample sizes can reach is 0.1, so no pair can reach p < 0.05
- all-pairs: the smallest p-value these sample sizes can reach is 0.1, so no pair can reach p < 0.05
"""
    assert comparison_markdown(compare(df), digits=3) == expected


# ---------------------------------------------------------------- degenerate cases

def test_excluded_rows_are_listed():
    extra = [{"router": "full", "seed": 3, "status": "diverged", M: np.nan},
             {"router": "full", "seed": 4, "status": "failed", M: 2.0},
             {"router": "none", "seed": 5, "status": "finished", M: np.nan},
             {"router": "none", "seed": 6, "status": "finished", M: np.inf},
             {"router": "per-dim", "seed": 0, "status": "failed", M: np.nan}]
    comp = compare(frame({"none": [3.0, 3.1, 3.2], "full": [2.0, 2.1, 2.2]}, extra=extra))
    got = [(e["value"], e["seed"], e["status"]) for e in comp.excluded]
    assert got == [("none", 5, "finished"), ("none", 6, "finished"), ("full", 3, "diverged"),
                   ("full", 4, "failed"), ("per-dim", 0, "failed")]
    assert "nan" in comp.excluded[0]["reason"] and "inf" in comp.excluded[1]["reason"]
    assert "diverged" in comp.excluded[2]["reason"]
    assert comp.group("full").n == 3 and comp.group("full").n_excluded == 2
    empty = comp.group("per-dim")
    assert empty.n == 0 and math.isnan(empty.mean) and math.isnan(empty.change_pct)
    assert any("per-dim" in n and "no usable samples" in n for n in comp.notes)
    md = comparison_markdown(comp)
    assert "Excluded trials" in md and "| per-dim | 0 | failed |" in md
    assert comp.omnibus.groups == ("none", "full")


def test_all_values_identical():
    comp = compare(frame({"none": [2.0, 2.0, 2.0], "full": [2.0, 2.0, 2.0]}))
    o = comp.omnibus
    assert o.status == "all values identical" and math.isnan(o.h) and math.isnan(o.p)
    assert any("all values identical" in n for n in comp.notes)
    g = comp.group("full")
    assert (g.ci_low, g.ci_high) == (2.0, 2.0) and g.std == 0.0
    row = [r for r in comp.posthoc if r.family == "baseline"][0]
    assert row.p == 1.0 and row.cliffs_delta == 0.0
    assert "all values identical" in comparison_markdown(comp)


def test_one_sample_group_left_out_of_tests():
    comp = compare(frame({"none": [3.0, 3.1, 3.2], "full": [2.0, 2.1, 2.2], "average": [2.5]}))
    g = comp.group("average")
    assert g.n == 1 and g.mean == 2.5 and math.isnan(g.std) and math.isnan(g.ci_low)
    assert comp.omnibus.groups == ("none", "full") and comp.omnibus.n_total == 6
    assert all("average" not in (r.a, r.b) for r in comp.posthoc)
    assert any("average" in n and "one sample" in n for n in comp.notes)
    assert any("left out" in n and "average" in n for n in comp.notes)


def test_fewer_than_two_usable_groups():
    comp = compare(frame({"none": [3.0, 3.1], "full": [2.0]}))
    assert comp.omnibus.status.startswith("not run") and comp.posthoc == []
    assert any("not run" in n for n in comp.notes)
    comparison_markdown(comp)


def test_baseline_without_samples():
    extra = [{"router": "none", "seed": 0, "status": "failed", M: np.nan}]
    comp = compare(frame({"full": [2.0, 2.1], "average": [2.5, 2.6]}, extra=extra))
    assert [g.value for g in comp.groups] == ["none", "average", "full"]
    assert all(math.isnan(g.change_pct) for g in comp.groups)
    assert {r.family for r in comp.posthoc} == {"all-pairs"}
    assert any("baseline" in n and "no usable samples" in n for n in comp.notes)


def test_duplicate_seeds_noted():
    df = frame({"none": [3.0, 3.1], "full": [2.0, 2.1]},
               extra=[{"router": "full", "seed": 0, "status": "finished", M: 2.05}])
    assert any("more than once" in n for n in compare(df).notes)


# ---------------------------------------------------------------- axes, errors, compare_by

def test_numeric_axis_order_and_baseline():
    df = frame({12: [3.0, 3.1], 2: [3.5, 3.6], 100: [2.5, 2.6], 32: [2.8, 2.9]}, axis="n_layers")
    comp = compare(df, axis="n_layers", baseline="12")  # MLflow params come back as strings
    assert [g.value for g in comp.groups] == [2, 12, 32, 100]
    assert comp.baseline == 12 and comp.group(12).change_pct == 0.0
    lr = frame({0.5: [1.0, 1.1], 2.0: [3.0, 3.1], 1.0: [2.0, 2.1], 10.0: [4.0, 4.1]},
               axis="router_lr")
    comp = compare(lr, axis="router_lr", baseline=1.0)
    assert [g.value for g in comp.groups] == [0.5, 1.0, 2.0, 10.0]
    assert comp.group(2.0).change_pct == pytest.approx(100 * (3.05 - 2.05) / 2.05)


def test_string_axis_baseline_first_then_alphabetical():
    comp = compare(frame({"per-dim": [1, 2], "full": [1, 2], "none": [1, 2], "average": [1, 2]}))
    assert [g.value for g in comp.groups] == ["none", "average", "full", "per-dim"]
    comp = compare(frame({"b": [1, 2], "a": [1, 2]}), baseline=None)
    assert [g.value for g in comp.groups] == ["a", "b"]
    assert all(r.family == "all-pairs" for r in comp.posthoc)


def test_config_errors_name_the_column():
    df = frame({"none": [1.0, 2.0], "full": [1.0, 2.0]})
    with pytest.raises(ConfigError, match="val/ppl"):
        compare(df, metric="val/ppl")
    with pytest.raises(ConfigError, match="n_layers"):
        compare(df, axis="n_layers")
    with pytest.raises(ConfigError, match=r"dilated-8.*'router'"):
        compare(df, baseline="dilated-8")
    with pytest.raises(ConfigError, match="depth"):
        compare_by(df, by="depth")
    with pytest.raises(ConfigError, match="nonee"):
        compare_by(df.assign(n_layers=12), by="n_layers", baseline="nonee")


def test_compare_by_depth():
    rows = []
    for depth, shift in [(32, 0.0), (8, 0.5), (16, 0.2)]:
        for router, mu in [("none", 3.0), ("full", 2.8)]:
            for s in range(3):
                rows.append({"router": router, "n_layers": depth, "seed": s,
                             "status": "finished", M: mu + shift + 0.01 * s})
    rows += [{"router": "full", "n_layers": 64, "seed": s, "status": "finished", M: 2.5 + s}
             for s in range(2)]
    out = compare_by(pd.DataFrame(rows), M, axis="router", by="n_layers")
    assert list(out) == [8, 16, 32, 64]
    assert out[8].group("none").mean == pytest.approx(3.51)
    assert out[16].group("full").change_pct == pytest.approx(100 * (3.01 - 3.21) / 3.21)
    assert out[64].baseline is None and "not present" in out[64].notes[0]
    assert not any("more than once" in n for c in out.values() for n in c.notes)


def test_compare_by_missing_by_value_and_float_keys():
    df = pd.DataFrame([
        {"router": r, "n_layers": d, "seed": s, "status": "finished", M: 3.0 + s, "trial_id": t}
        for t, (r, d, s) in enumerate([("none", 12, 0), ("none", 12, 1), ("full", 12, 0),
                                       ("full", 12, 1), ("full", None, 2)])])
    assert df["n_layers"].dtype == float  # the missing entry made pandas cast 12 to 12.0
    out = compare_by(df, M, axis="router", by="n_layers")
    assert list(out) == [12, None] and type(next(iter(out))) is int
    assert out[None].group("full").n == 1 and out[None].baseline is None
    failed = df.assign(status=["finished"] * 4 + ["failed"])
    (row,) = compare(failed).excluded
    assert row == {"value": "full", "seed": 2, "status": "failed",
                   "reason": "status is 'failed', not 'finished'", "trial_id": 4}
    assert list(compare(failed).excluded_frame().columns)[-1] == "trial_id"
