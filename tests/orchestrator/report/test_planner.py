"""The planner (orchestrator.report.planner) and ``lime plan``: reachable p-values by hand, the
effects it plans for, and the command line."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy.special import betaln

from orchestrator.cli import main
from orchestrator.decide.signs import PRIOR_C
from orchestrator.report.paper.refs import REFS
from orchestrator.report.planner import (
    Design,
    Spread,
    committed,
    effects,
    plan_block,
    plan_text,
    reachability,
    sd_upper,
)
from orchestrator.report.stats.verdict_power import verdict_seeds

SWEEPS = Path(__file__).resolve().parents[3] / "sweeps"


def test_reachability_by_hand():
    d = Design("x", "final/val_loss", "router", "none", ("none", "full", "first-4"), 4)
    text = "\n".join(reachability(d))
    # 2 comparisons: each interval at 97.5%; the sign-flip part is finite once 2/2^n < 0.025: 7 seeds.
    # paired: 2/2^4 = 0.125, Holm x2 = 0.25; Mann-Whitney 4 vs 4: 2/70 = 0.0286, x2 = 0.0571;
    # Friedman: (3!)^(1-4) = 1/216 = 0.00463; Kruskal-Wallis 3 x 4: 3! (4!)^3 / 12! = 0.000173
    assert "verdict interval (the median's sign interval) at 97.5%: finite from 7 seeds per arm: NO at 4" in text
    # the median's sign sequence is finite once n signs that all agree reject: log M_n(0) = n log 2 +
    # log B(c, c + n) - log B(c, c) >= log 40 (brute force over n, scipy's betaln): 8 seeds at 97.5%
    c, n_seq = PRIOR_C, 1
    while n_seq * math.log(2) + betaln(c, c + n_seq) - betaln(c, c) < math.log(40):
        n_seq += 1
    assert n_seq == 8
    assert ("until decided (the median's sign sequence at 97.5%): finite from 8 seeds per arm: NO at 4 (a first "
            "look at this many seeds cannot decide)") in text
    assert "paired permutation (supporting)           0.125      0.25       NO" in text
    assert "Mann-Whitney (unpaired)                   0.0286     0.0571     NO" in text
    assert "Friedman (paired omnibus, 3 variants)     0.00463    -          yes" in text
    assert "Kruskal-Wallis (omnibus, 3 variants)      0.000173" in text
    assert ("WARNING: no verdict can be 'better', 'worse' or 'equivalent' at 4 seeds: below 7 seeds per arm every "
            "interval at 97.5% (2 comparison(s)) is the whole line") in text
    ok = "\n".join(reachability(Design("x", "final/val_loss", "router", "none", ("none", "full"), 6)))
    assert "WARNING: no verdict" not in ok and "0.0312" in ok and "finite from 6 seeds per arm: yes at 6" in ok
    assert plan_block("x", "final/accuracy", "router", "none", ["none", "full"], 6).startswith(
        "plan: 2 values of router x 6 seed(s), baseline none, 1 comparison(s) with the baseline (Bonferroni: each "
        "interval at 95%), alpha 0.05, final/accuracy (higher is better)")


def test_the_sd_upper_bound_by_hand():
    # chi-square 10% quantile with 7 df is 2.8331: 0.03 * sqrt(7 / 2.8331) = 0.04716
    assert sd_upper(0.03, 8) == pytest.approx(0.04716, abs=1e-5)
    assert math.isnan(sd_upper(0.03, 1))


def test_the_committed_summary_is_the_sweeps_own_data(tmp_path):
    p = tmp_path / "summary.csv"
    p.write_text("scope,variant,baseline,mean,diff_sd,n_pairs\nall,none,True,1.66,,\nall,full,False,1.64,0.028,8\n"
                 "n_layers=4,full,False,1.7,0.5,3\n")
    s = committed(p)
    assert s.per == {"full": (0.028, 8)} and s.level == 1.66 and str(p) in s.source
    assert committed(tmp_path / "none.csv") is None


def test_effects_default_to_the_paper_then_one_percent():
    d = Design("default", "final/val_loss", "router", "none", ("none", "full", "first-4"), 4, paper=REFS["table12"])
    got = {e.label: e for e in effects(d, None, None, None)}
    base = math.log(16.4611)
    assert got["full"].relative == pytest.approx((math.log(15.9267) - base) / base)
    assert got["full"].absolute == pytest.approx(math.log(15.9267) - base)
    assert got["first-4"].source == "paper: Table 12"
    (e,) = effects(Design("x", "final/val_loss", "router", "none", ("none", "full"), 4), 2.0, None, None)
    assert (e.relative, e.absolute, e.source) == (0.01, pytest.approx(0.02), "default: 1% of the level")
    (e,) = effects(d, 1.5, 0.02, None)
    assert (e.relative, e.absolute) == (0.02, pytest.approx(0.03))
    (e,) = effects(d, 1.5, None, -0.03)
    assert e.absolute == -0.03 and e.relative == pytest.approx(-0.02)


def test_plan_sizes_with_the_simulated_power():
    d = Design("x", "final/val_loss", "router", "none", ("none", "full", "first-4"), 4)
    given = Spread({"full": (0.02, None), "first-4": (0.02, None)}, None, "--sigma 0.02")
    text = plan_text(d, given, level=2.0, delta=0.03)
    n = verdict_seeds(0.975, 0.03 / 0.02)
    assert "+1.50% (0.03)" in text  # 0.03 / level 2
    line = next(x for x in text.splitlines() if x.startswith("  full"))
    assert line.split()[1:4] == ["0.02", "(given)", "0.02"] and line.split()[6:8] == ["1.5", str(n)]
    assert "WARNING: 4 seeds per arm are too few for 2 of these comparisons (power full 0.00" in text
    assert "level of final/val_loss: 2" in text
    # an estimated sd is planned with its upper bound: 0.02 from 8 seeds -> 0.03144, d_z 0.954
    est = plan_text(d, Spread({"full": (0.02, 8)}, 2.0, "a pilot"), delta=0.03)
    line = next(x for x in est.splitlines() if x.startswith("  full"))
    assert line.split()[3] == "0.0314" and line.split()[7] == str(verdict_seeds(0.975, 0.03 / sd_upper(0.02, 8)))
    assert next(x for x in est.splitlines() if x.startswith("  first-4")).split()[1] == "0.02"  # pooled
    no_data = plan_text(d)
    assert "spread: this sweep has no data yet" in no_data and \
        f"d_z = 1 (a mean difference of 1 sd): {verdict_seeds(0.975, 1.0)} seeds per arm" in no_data


def test_lime_plan_command(capsys):
    assert main(["plan", str(SWEEPS / "router-ablation-150m.yaml")]) == 0
    out = capsys.readouterr().out
    assert "9 values of router x 9 seed(s)" in out and "8 comparison(s)" in out
    # 9 seeds: 2/2^9 = 0.0039 < 0.05/8, so the 99.375% interval can be finite
    assert "at 99.38%: finite from 9 seeds per arm: yes at 9" in out and "no verdict can be" not in out
    assert "paired permutation (supporting)           0.00391    0.0312     yes" in out
    assert "level of final/val_loss: 2.801 (NOT this sweep's: the paper's baseline, Table 12" in out
    for bad, msg in ((["--sigma", "0"], "--sigma must be > 0"), (["--effect", "1.5"], "--effect is relative"),
                     (["--power", "1"], "--power must be between 0 and 1"),
                     (["--effect", "0.01", "--delta", "0.1"], "not both")):
        assert main(["plan", str(SWEEPS / "default.yaml"), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: plan:") and msg in err and "\n" not in err
    assert main(["plan", str(SWEEPS / "no-such.yaml")]) == 2


def test_dry_run_prints_the_block(capsys):
    assert main(["sweep", "run", str(SWEEPS / "aet-cpu.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing was started" in out
    assert "plan: 2 values of router x 6 seed(s), baseline none, 1 comparison(s)" in out
    assert "final/accuracy (higher is better)" in out
