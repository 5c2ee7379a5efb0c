"""Reports that decide, end to end from a local MLflow store: verdicts in report.md and
summary.csv, the baseline's init and lr in the header, the report settings alpha / paper / tune
from the parent run, baseline tuning, the planner's pilot, and $LIME_RESULTS.

The tuning sweep (final/val_loss, lower is better; seeds 0-3):
  none  lr 0.001: 3.0 3.1 3.2 3.3 (mean 3.15)    lr 0.003: 2.9 3.0 3.1 3.2 (mean 3.05)  -> 0.003
  full  lr 0.001: 2.7 2.8 2.9 3.0 (mean 2.85)    lr 0.003: 2.8 2.9 3.0 3.1 (mean 2.95)  -> 0.001
So tuned: full (lr 0.001) vs none (lr 0.003): per-seed differences -0.2 on every seed.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from orchestrator.cli import main
from orchestrator.core import tracking
from orchestrator.report.build import build_report
from orchestrator.report.planner import pilot
from tests.orchestrator.report.test_report import T0, add_trial, log_sweep_params, summary

TUNE = "report-test-tune"
FINALS = {("none", 0.001): [3.0, 3.1, 3.2, 3.3], ("none", 0.003): [2.9, 3.0, 3.1, 3.2],
          ("full", 0.001): [2.71, 2.79, 2.9, 3.0], ("full", 0.003): [2.8, 2.9, 3.0, 3.1]}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("decide")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.chdir(root)
        yield root, tracking.client()


@pytest.fixture(scope="module")
def tune_sweep(store):
    root, cl = store
    exp = tracking.experiment_id(TUNE, cl)
    parent = cl.create_run(exp, start_time=T0, run_name=TUNE, tags={"sweep": TUNE, "sweep_role": "parent"}).info.run_id
    log_sweep_params(cl, parent, axes="router,lr,seed", axis="router", baseline="none", n_trials=16,
                     alpha="0.1", tune="lr", paper="table14")
    start = T0 + 1000
    for (router, lr), vals in FINALS.items():
        for seed, v in enumerate(vals):
            add_trial(cl, exp, parent, TUNE, router, seed, final=v, status="finished", start=start, lr=lr,
                      trial_id=f"router={router},lr={lr},seed={seed}")
            start += 1000
    first = build_report(TUNE, out=root / "a", log_to_mlflow=False)
    second = build_report(TUNE, out=root / "b", log_to_mlflow=False)
    return first.parent, second.parent


def test_tuned_comparison(tune_sweep):
    out, _ = tune_sweep
    s = summary(out)
    assert list(s.index) == ["none", "full"] and list(s["tuned_lr"]) == [0.003, 0.001]
    assert s.loc["none", "n"] == 4 and s.loc["none", "mean"] == pytest.approx(3.05)
    assert s.loc["full", "mean"] == pytest.approx(2.85)
    assert s.loc["full", "diff_mean"] == pytest.approx(-0.2) and s.loc["full", "n_pairs"] == 4
    # 4 seeds, one comparison: smallest p 2/16 = 0.125 >= alpha 0.1 -> the design cannot decide; it leaves
    # the family (Tarone), so no Holm p, and says the seeds it needs (2/32 <= 0.1)
    assert s.loc["full", "p_perm"] == pytest.approx(0.125) and math.isnan(s.loc["full", "min_p_holm"])
    assert s.loc["full", "note"] == "left out of the family (Tarone): needs 5 seeds at alpha 0.1"
    assert s.loc["full", "estimand"] == "median" and s.loc["full", "ci_method"] == "sign (median)"
    assert s.loc["full", "verdict"] == "cannot decide" and s.loc["none", "verdict"] == "baseline"
    assert s.loc["full", "alpha"] == pytest.approx(0.1) and s.loc["full", "better"] == "lower"
    md = (out / "report.md").read_text()
    assert "## Tuning" in md and "| full | 0.001 | **2.85 (n=4)** | 2.95 (n=4) |" in md
    assert "| none | 0.003 | 3.15 (n=4) | **3.05 (n=4)** |" in md
    assert "winner's curse" in md and "Chosen at the edge of the lr range (none, full)" in md
    assert "- Baseline `none`: init_std auto = 1/sqrt(d_model) = 0.125 (d_model 64); lr 0.003 (the best of the " \
           "tuning axis, see Tuning)" in md
    assert "design: paired; alpha 0.1" in md and "Each variant at its chosen `lr`" in md


def test_paper_section_from_the_parent_param(tune_sweep):
    md = (tune_sweep[0] / "report.md").read_text()
    assert "## Paper vs this run" in md and "Reference: Table 14 of the paper" in md
    assert "| full (full) | 2.7689 | -1.13% | 1 | 2.85 | -6.56% | 1 | cannot decide | yes |" in md
    assert "- In the paper's table but not in this run: no-head-mix, per-dim." in md


def test_same_runs_same_bytes_with_every_new_section(tune_sweep):
    a, b = tune_sweep
    for name in ("report.md", "summary.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_pilot_reads_the_spread(tune_sweep, store):
    spread = pilot(TUNE, "final/val_loss")
    # pilot blocks are (seed, lr): full - none is -0.3 (-0.29, -0.31, -0.3, -0.3) at lr 0.001 and -0.1 at
    # lr 0.003, 4 seeds each
    sd, n = spread.per["full"]
    assert sd == pytest.approx(pd.Series([-0.29, -0.31, -0.3, -0.3] + [-0.1] * 4).std()) and n == 8
    assert spread.level == pytest.approx(3.1) and TUNE in spread.source
    assert main(["plan", str(store[0] / "missing.yaml"), "--pilot", TUNE]) == 2


def test_verdicts_in_the_router_report_and_lime_results(store, tmp_path, monkeypatch, capsys):
    cl = store[1]
    name = "report-test-eight"
    exp = tracking.experiment_id(name, cl)
    fx = [0.0, 0.3, -0.2, 0.5, -0.4, 0.1, 0.25, -0.3]
    for seed, f in enumerate(fx):
        add_trial(cl, exp, None, name, "none", seed, final=3.0 + f, status="finished", start=T0 + seed)
        add_trial(cl, exp, None, name, "full", seed, final=2.95 + f + (0.01 if seed % 2 else -0.01),
                  status="finished", start=T0 + 100 + seed)
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "res"))
    assert main(["report", name]) == 0  # no --out: $LIME_RESULTS
    path = tmp_path / "res" / name / "report.md"
    assert capsys.readouterr().out.strip() == str(path)
    md = path.read_text()
    assert "## Verdicts" in md and "**full**: better than `none` at alpha 0.05" in md
    assert "paired permutation p = 0.00781" in md  # 2/256: all 8 differences negative
    s = summary(path.parent)
    assert s.loc["full", "verdict"] == "better" and s.loc["full", "p_perm"] == pytest.approx(2 / 256)
    assert math.isfinite(s.loc["full", "mde"]) and s.loc["full", "design"] == "paired"
    assert "Friedman: not run: with 2 variants" in md and "## Paper vs this run" not in md


def test_a_variant_bundle_that_sets_the_router_is_compared_on_its_seeds(store, tmp_path):
    """``variant: {llama: {}, lime: {router: full}}``: the router column changes with the variant,
    so it is part of the variant, not a block; every bundle is paired with the baseline by seed
    (6 seeds, every difference -0.05 +- 0.001: p = 2/64; a constant difference would be "not tested")."""
    cl = store[1]
    name = "report-test-bundles"
    exp = tracking.experiment_id(name, cl)
    parent = cl.create_run(exp, start_time=T0, run_name=name, tags={"sweep": name, "sweep_role": "parent"}).info.run_id
    log_sweep_params(cl, parent, axes="variant,seed", axis="variant", baseline="llama", n_trials=12)
    start = T0 + 1000
    for seed in range(6):
        lime = 2.95 + 0.1 * seed + 0.001 * (seed % 2)
        for variant, router, final in (("llama", "none", 3.0 + 0.1 * seed), ("lime", "full", lime)):
            rid = add_trial(cl, exp, parent, name, router, seed, final=final, status="finished", start=start,
                            trial_id=f"variant={variant},seed={seed}")
            cl.set_tag(rid, "variant", variant)
            start += 1000
    folder = build_report(name, out=tmp_path / "r", log_to_mlflow=False).parent
    md = (folder / "report.md").read_text()
    assert "**lime**: better than `llama` at alpha 0.05" in md, md
    assert "paired permutation p = 0.0312" in md and "Design: paired. Blocks are seeds" in md
    s = summary(folder)
    assert s.loc["lime", "verdict"] == "better" and s.loc["lime", "p_perm"] == pytest.approx(2 / 64)
