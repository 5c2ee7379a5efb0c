"""Verdicts and the paired analysis on constructed frames (every number here is worked by hand)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.compare import verdicts
from orchestrator.report.compare.across_seeds import compare
from orchestrator.report.compare.by_seed import analyze
from orchestrator.report.render.comparisons import paired_markdown, verdict_lines

M = "final/val_loss"
# a shared per-seed offset (what pairing removes) that dwarfs the effects below
SEED_FX = [0.0, 0.3, -0.2, 0.5, -0.4, 0.1, 0.25, -0.3]


def frame(groups: dict, metric: str = M, seeds=None, extra=()) -> pd.DataFrame:
    rows = [{"router": k, "seed": s, "status": "finished", metric: v}
            for k, vals in groups.items() for s, v in zip(seeds or range(len(vals)), vals)]
    return pd.DataFrame(rows + list(extra))


def run(groups: dict, metric: str = M, mode=None, **kw):
    df = frame(groups, metric, **kw)
    comp = compare(df, metric=metric)
    return comp, analyze(df, comp, mode=mode)


def shifted(delta: float, jitter: float = 0.0, n: int = 8) -> list[float]:
    return [2.0 + SEED_FX[i] + delta + (jitter if i % 2 else -jitter) for i in range(n)]


def test_better_worse_and_same_with_eight_seeds():
    comp, pa = run({"none": shifted(0), "full": shifted(-0.05, 0.01), "first-4": shifted(0.05, 0.01),
                    "average": shifted(0.0, 0.01)})
    assert pa.design == "paired" and "same seeds" in pa.why
    full, worse, same = pa.row("full"), pa.row("first-4"), pa.row("average")
    # every difference of full is -0.05 +- 0.01: all 8 negative, p = 2/256, Holm x3
    assert full.n == 8 and full.diff_mean == pytest.approx(-0.05) and full.p_perm == pytest.approx(2 / 256)
    assert full.p_perm_holm == pytest.approx(3 * 2 / 256) and full.verdict == verdicts.BETTER
    assert full.diff_sd == pytest.approx(np.std([0.01, -0.01] * 4, ddof=1))
    assert full.d_z == pytest.approx(-0.05 / full.diff_sd)
    assert full.diff_pct == pytest.approx(100 * -0.05 / np.mean(shifted(0)))
    # the interval is at 1 - 0.05/3 (Bonferroni over 3, each 8-seed comparison can reach 2/256 <= 0.05/3):
    # all 8 differences negative, so the sign interval of the median, [min, max] (2/256 <= 0.05/3 but
    # 18/256 > it), lies below 0; the mean's interval (t ∪ sign-flip) is beside it
    assert (full.ci_low, full.ci_high) == pytest.approx((-0.06, -0.04))
    assert full.confidence == pytest.approx(1 - 0.05 / 3) and full.estimand == "median"
    assert full.family_size == 3 and full.method == "sign (median)" and full.mean_method == "t ∪ sign-flip"
    assert full.mean_ci_low <= -0.05 <= full.mean_ci_high < 0
    assert worse.verdict == verdicts.WORSE
    # differences +-0.01 alternating: mean 0, every sign pattern balanced -> p = 1, interval holds 0
    assert same.verdict == verdicts.UNDECIDED and same.p_perm == pytest.approx(1.0)
    assert same.ci_low < 0 < same.ci_high
    assert math.isfinite(same.mde) and same.mde > 0 and same.min_p_holm == pytest.approx(3 * 2 / 256)
    # the unpaired tests see nothing: the seed offsets swamp a 0.05 shift
    base_row = [r for r in comp.posthoc if r.family == "baseline" and r.a == "full"][0]
    assert base_row.p > 0.5
    lines = "\n".join(verdict_lines(pa))
    assert "**full**: better than `none` at alpha 0.05" in lines
    assert "**average**: not decided" in lines and "80% power" in lines


def test_undecidable_design_never_says_better():
    # 4 seeds, 2 comparisons: the smallest sign-test p is 2/16 > 0.05, whatever the data: both leave the
    # family (Tarone), no Holm p, and say the seeds they need (2/64 <= 0.05)
    comp, pa = run({"none": shifted(0, n=4), "full": shifted(-1.0, 0.01, n=4), "first-4": shifted(-1.0, 0.01, n=4)})
    for r in pa.rows:
        assert r.verdict == verdicts.UNDECIDABLE and math.isnan(r.min_p_holm)
        assert r.mde == math.inf and r.note == "left out of the family (Tarone): needs 6 seeds at alpha 0.05"
    text = "\n".join(verdict_lines(pa))
    assert "cannot decide" in text and "needs 6 seeds" in text and "better than" not in text
    assert all(not math.isfinite(r.ci_low) and not math.isfinite(r.ci_high) for r in pa.rows)
    assert verdicts.min_seeds_to_decide(1, 0.05) == 6 and verdicts.min_seeds_to_decide(8, 0.05) == 9


def test_direction_follows_the_metric_and_mode():
    assert verdicts.metric_mode("final/val_loss") == "min" and verdicts.metric_mode("final/accuracy") == "max"
    assert verdicts.metric_mode("val/exact_match") == "max" and verdicts.metric_mode("eval/score") == "max"
    assert verdicts.metric_mode("final/accuracy", "min") == "min"
    acc = "final/accuracy"
    higher = {"none": [0.5 + 0.01 * i for i in range(8)], "full": [0.6 + 0.01 * i + 0.001 * (i % 2) for i in range(8)]}
    _, pa = run(higher, acc)
    assert pa.mode == "max" and pa.row("full").verdict == verdicts.BETTER  # 2/256 < 0.05, one comparison
    _, pa = run(higher, acc, mode="min")
    assert pa.row("full").verdict == verdicts.WORSE
    assert "higher is better" in verdict_lines(run(higher, acc)[1])[0]


def test_missing_seeds_use_the_common_ones():
    extra = [{"router": "full", "seed": 7, "status": "failed", M: float("nan")}]
    df = pd.concat([frame({"none": shifted(0)}), frame({"full": shifted(-0.05)[:7]}), pd.DataFrame(extra)])
    comp = compare(df)
    pa = analyze(df, comp)
    row = pa.row("full")
    assert pa.design == "paired" and row.n == 7 and row.seeds == tuple(range(7))
    assert row.base_mean == pytest.approx(np.mean(shifted(0)[:7]))
    assert any("router=full has no finished sample at seed 7" in n for n in pa.notes)
    assert "Not every variant finished every seed" in pa.why


def test_repeated_seeds_are_not_paired():
    df = pd.concat([frame({"none": [1.0, 2.0], "full": [1.1, 2.1]}).assign(n_layers=4),
                    frame({"none": [1.5, 2.5], "full": [1.4, 2.4]}).assign(n_layers=8)])
    comp = compare(df)
    pa = analyze(df, comp)
    assert pa.design == "unpaired" and "seeds repeat within a variant" in pa.why and not pa.rows
    assert verdict_lines(pa)[0].startswith("- No verdicts:")
    # with the depth as part of the block, the same trials pair up (4 blocks)
    pa = analyze(df, comp, blocks=("seed", "n_layers"))
    assert pa.design == "paired" and pa.row("full").n == 4 and "seed x n_layers cells" in pa.why


def test_friedman_in_the_analysis():
    groups = {"none": [3.0, 3.1, 3.2, 3.3], "full": [2.9, 3.0, 3.1, 3.2], "first-4": [2.95, 3.05, 3.15, 3.25]}
    _, pa = run(groups)
    fr = pa.friedman
    # every seed ranks full < first-4 < none: chi2 = 12/(4*3*4) * (4^2 + 8^2 + 12^2) - 3*4*4 = 8
    assert fr.status == "ok" and fr.chi2 == pytest.approx(8.0) and fr.kendall_w == pytest.approx(1.0)
    assert fr.perm_method == "exact" and fr.perm_p == pytest.approx(6.0 ** -3) == pytest.approx(fr.min_p)
    _, pa2 = run({"none": [1.0, 2.0, 3.0], "full": [0.9, 1.9, 2.9]})
    assert pa2.friedman.status.startswith("not run: with 2 variants")
    assert "Friedman: not run" in paired_markdown(pa2)


def test_markdown_is_deterministic_and_row_order_free():
    df = frame({"none": shifted(0), "full": shifted(-0.05, 0.01), "first-4": shifted(0.01, 0.02)})
    comp = compare(df)
    a = paired_markdown(analyze(df, comp))
    shuffled = df.sample(frac=1.0, random_state=1).reset_index(drop=True)
    assert a == paired_markdown(analyze(df, comp)) == paired_markdown(analyze(shuffled, compare(shuffled)))
    assert "| full | 8 |" in a and "Design: paired." in a
