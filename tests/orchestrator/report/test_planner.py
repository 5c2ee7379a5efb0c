"""The planner (orchestrator.report.planner) and ``lime plan``: reachable p-values by hand, the
effects it plans for, and the command line."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.report.paper.refs import REFS
from orchestrator.report.planner import Design, effects, plan_block, plan_text, reachability
from orchestrator.report.stats import power

SWEEPS = Path(__file__).resolve().parents[3] / "sweeps"


def test_reachability_by_hand():
    d = Design("x", "final/val_loss", "router", "none", ("none", "full", "first-4"), 4)
    text = "\n".join(reachability(d))
    # paired: 2/2^4 = 0.125, Holm x2 = 0.25; Mann-Whitney 4 vs 4: 2/70 = 0.0286, x2 = 0.0571;
    # Friedman: (3!)^(1-4) = 1/216 = 0.00463; Kruskal-Wallis 3 x 4: 3! (4!)^3 / 12! = 0.000173
    assert "paired permutation (the verdicts)         0.125      0.25       NO" in text
    assert "Mann-Whitney (unpaired)                   0.0286     0.0571     NO" in text
    assert "Friedman (paired omnibus, 3 variants)     0.00463    -          yes" in text
    assert "Kruskal-Wallis (omnibus, 3 variants)      0.000173" in text
    assert ("WARNING: no verdict can be 'better' or 'worse' at 4 seeds: the smallest Holm-adjusted paired p is "
            "0.25 >= 0.05; 2 comparison(s) need at least 7 seeds per arm") in text
    ok = "\n".join(reachability(Design("x", "final/val_loss", "router", "none", ("none", "full"), 6)))
    assert "WARNING: no verdict" not in ok and "0.0312" in ok  # 2/64, one comparison
    assert plan_block("x", "final/accuracy", "router", "none", ["none", "full"], 6).startswith(
        "plan: 2 values of router x 6 seed(s), baseline none, 1 comparison(s) with the baseline (Holm), "
        "alpha 0.05, final/accuracy (higher is better)")


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
    text = plan_text(d, sigma=0.02, level=2.0, delta=0.03)
    dz = 0.03 / 0.02
    n_perm = power.seeds_needed(2, 0.05, dz)
    n_wil = power.seeds_needed(2, 0.05, dz, test="wilcoxon")
    assert "+1.50% (0.03)" in text  # 0.03 / level 2
    line = next(x for x in text.splitlines() if x.startswith("  every comparison"))
    assert line.split()[4:6] == ["1.5", str(n_perm)] and line.split()[6] == str(n_wil)
    assert "WARNING: 4 seeds per arm are too few for 1 of these effects (power every comparison 0.00" in text
    assert "level of final/val_loss: 2" in text
    no_sigma = plan_text(d)
    assert "spread: not given" in no_sigma and f"d_z = 1 (a mean difference of 1 sd): " \
        f"{power.seeds_needed(2, 0.05, 1.0)} seeds per arm" in no_sigma


def test_lime_plan_command(capsys):
    assert main(["plan", str(SWEEPS / "router-ablation-150m.yaml")]) == 0
    out = capsys.readouterr().out
    assert "9 values of router x 9 seed(s)" in out and "8 comparison(s)" in out
    # 9 seeds (the planner's count in the file) reach the paired tests' alpha after Holm over 8
    assert "paired permutation (the verdicts)         0.00391    0.0312     yes" in out
    assert "no verdict can be" not in out
    assert "level of final/val_loss: 2.801 (the paper's baseline, Table 12" in out
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
