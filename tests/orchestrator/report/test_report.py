"""Sweep reports from a local MLflow store filled with synthetic runs written like run_trial's.

Known numbers (final/val_loss by router, baseline none):
  none     seeds 0-3: 3.0 3.1 3.2 3.3   mean 3.15   (+ an older failed attempt of seed 0's trial)
  full     seeds 0-2: 2.8 2.9 3.0       mean 2.9    -7.9365%   seed 3 failed
  first-4  seeds 0-2: 2.9 3.0 3.1       mean 3.0    -4.7619%   seed 3 diverged
Step time medians 100 / 110 / 102 ms, peak memory 2000 / 2010 / 2002 MB, params
100000 / 100500 / 100200.
"""
from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lime_arch.errors import ConfigError
from orchestrator.cli import main as cli_main
from orchestrator.cli.report import cmd_report
from orchestrator.core import tracking
from orchestrator.core.record import cast_param
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.report.build import build_report, load_runs, mean_router_map, router_map_from_npz

SWEEP = "report-test-routers"
DEPTH = "report-test-depth"
SWEEP_YAML = f"""name: {SWEEP}
description: "synthetic sweep of the report tests"
base:
  preset: tiny
  train: {{steps: 50, batch_size: 4, seq_len: 32}}
grid:
  router: [none, full, first-4]
  seed: [0, 1, 2, 3]
report: {{metric: final/val_loss, axis: router, baseline: none}}
"""
FINALS = {"none": [3.0, 3.1, 3.2, 3.3], "full": [2.8, 2.9, 3.0], "first-4": [2.9, 3.0, 3.1]}
STEP_MS = {"none": 100.0, "full": 110.0, "first-4": 102.0}
MEM = {"none": 2000.0, "full": 2010.0, "first-4": 2002.0}
PARAMS = {"none": 100000, "full": 100500, "first-4": 100200}
FPT = 1.0e6  # model/flops_per_token
T0 = 1_700_000_000_000  # fixed run start times (ms) so wall times are known


def router_npz(path: Path, n_layers: int, x: float | None) -> Path:
    """R = 2 KV heads. x None: identity router. Otherwise layer l puts |w| = x on source 0,
    1 on the current layer and 0 elsewhere."""
    arrays = {}
    for l in range(n_layers):
        w = np.zeros((2, 2 * (l + 1)))
        w[:, 2 * l:] = np.eye(2) if x is None else 1.0
        if x is not None and l > 0:
            w[:, :2] = x
        arrays[f"layer_{l}"] = w
    np.savez(path, **arrays)
    return path


def add_trial(cl, exp_id: str, parent: str | None, sweep: str, router: str, seed: int, *,
              n_layers: int = 3, final: float | None, status: str, start: int, steps: int = 50,
              trial_id: str | None = None, npz_x: float | None | str = "skip",
              analysis: dict[str, float] | None = None, lr: float | None = None) -> str:
    # the runs of a store, which a report reads as logged: first-4 on 3 layers (beyond the depth, refused
    # since issue 39, as full routes) was accepted when such runs were made, so the config is built with
    # full and the router written into it as the run logged it
    cfg = TrialConfig.from_dict({"preset": "tiny", "model": {"router": "full", "n_layers": n_layers},
                                 "train": {"steps": 50, "batch_size": 4, "seq_len": 32, "seed": seed},
                                 **({"optim": {"lr": lr}} if lr is not None else {})})
    resolved = {**cfg.model_config().to_dict(), "router": router}
    cfg.model["router"] = router
    tags = {"sweep": sweep, "sweep_role": "trial",
            "trial_id": trial_id or f"{router}_L{n_layers}_s{seed}", "router": router,
            "preset": "tiny", "n_layers": n_layers, "seed": seed, "git_sha": "abc123def456",
            "status": status}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = cl.create_run(exp_id, start_time=start, tags={k: str(v) for k, v in tags.items()},
                        run_name=tags["trial_id"])
    rid = run.info.run_id
    from mlflow.entities import Metric, Param

    flat = tracking.flatten({**cfg.to_dict(), "resolved": {"model": resolved}})
    cl.log_batch(rid, params=[Param(k, v) for k, v in flat.items()])
    ms = [Metric("model/params", PARAMS[router], start, 0), Metric("model/router_params", 0, start, 0),
          Metric("model/flops_per_token", FPT, start, 0)]
    for i, step in enumerate(range(10, steps + 1, 10)):
        ms += [Metric("train/loss", 5.0 - 0.02 * step - 0.1 * seed, start + step, step),
               Metric("perf/step_time_ms", STEP_MS[router] + (i % 3) - 1, start + step, step),
               Metric("perf/peak_mem_mb", MEM[router] - (0 if step == steps else 5), start + step, step)]
        if step % 20 == 0 or step == steps:
            ms.append(Metric("val/loss", 4.0 - 0.01 * step, start + step, step))
    if status == "diverged":
        ms.append(Metric("train/loss", float("nan"), start + steps + 1, steps + 1))
    if final is not None:
        ms.append(Metric("final/val_loss", final, start + 100, steps))
    for k, v in (analysis or {}).items():
        ms.append(Metric(k, v, start + 100, steps))
    cl.log_batch(rid, metrics=ms)
    if npz_x != "skip":
        with tempfile.TemporaryDirectory() as d:
            cl.log_artifact(rid, str(router_npz(Path(d) / "router_weights.npz", n_layers, npz_x)))
    cl.set_terminated(rid, status="FINISHED" if status in ("finished", "diverged") else "FAILED",
                      end_time=start + 60_000)
    return rid


def log_sweep_params(cl, parent: str, *, axes: str, axis: str, baseline: str, n_trials: int,
                     metric: str = "final/val_loss", **optional: str) -> None:
    """The params orchestrator.sweep.driver logs on a parent run (the report reads them);
    ``optional``: alpha, mode, paper, tune (sweep.report.*)."""
    from mlflow.entities import Param

    params = {"sweep.n_trials": n_trials, "sweep.axes": axes, "sweep.report.metric": metric,
              "sweep.report.axis": axis, "sweep.report.baseline": baseline,
              "sweep.fingerprint": "0123456789abcdef", **{f"sweep.report.{k}": v for k, v in optional.items()}}
    cl.log_batch(parent, params=[Param(k, str(v)) for k, v in params.items()])


def fill_router_sweep(cl) -> str:
    exp = tracking.experiment_id(SWEEP, cl)
    # like orchestrator.sweep.driver: the parent carries sweep_role=parent and the launched sweep file
    parent = cl.create_run(exp, start_time=T0, run_name=SWEEP,
                           tags={"sweep": SWEEP, "sweep_role": "parent"}).info.run_id
    log_sweep_params(cl, parent, axes="router,seed", axis="router", baseline="none", n_trials=12)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"{SWEEP}.yaml").write_text(SWEEP_YAML)
        cl.log_artifact(parent, str(Path(d) / f"{SWEEP}.yaml"), "sweep")
    start = T0 + 1000
    # the older, failed attempt of none seed 0 (same trial id): must be dropped, and said so
    add_trial(cl, exp, parent, SWEEP, "none", 0, final=None, status="failed", start=start - 500,
              steps=20)
    for router, finals in FINALS.items():
        for seed, final in enumerate(finals):
            # router weights only on `full` (each heatmap costs time; the others are noted)
            x = (1.0 if seed == 0 else 3.0) if router == "full" else "skip"
            add_trial(cl, exp, parent, SWEEP, router, seed, final=final, status="finished",
                      start=start, npz_x=x,
                      analysis={"analysis/value_entropy/layer_0": 1.0 + seed,
                                "analysis/value_entropy/layer_10": 2.0})
            start += 1000
    add_trial(cl, exp, parent, SWEEP, "full", 3, final=None, status="failed", start=start, steps=20)
    add_trial(cl, exp, parent, SWEEP, "first-4", 3, final=None, status="diverged", start=start + 1,
              steps=30)
    return parent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One private sqlite store for the module (creating one runs MLflow's migrations: slow)."""
    root = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.chdir(root)
        yield root, tracking.client()


@pytest.fixture(scope="module")
def router_sweep(store):
    root, cl = store
    parent = fill_router_sweep(cl)
    # an edited local copy of the file: the report must ignore it and show the launched one
    (root / "sweeps").mkdir()
    (root / "sweeps" / f"{SWEEP}.yaml").write_text(SWEEP_YAML.replace("first-4]", "first-4, last-4]"))
    first = build_report(SWEEP, out=root / "out1")
    second = build_report(SWEEP, out=root / "out2")
    arts = sorted(a.path for a in cl.list_artifacts(parent, "report"))
    runs = load_runs(SWEEP, cl=cl)
    return {"first": first.parent, "second": second.parent, "artifacts": arts, "runs": runs,
            "parent": parent}


def summary(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path / "summary.csv")
    return df[df["scope"] == "all"].set_index("variant")


def test_table_numbers(router_sweep):
    s = summary(router_sweep["first"])
    assert list(s.index) == ["none", "first-4", "full"]  # baseline first, then by name
    assert s.loc["none", "n"] == 4 and s.loc["full", "n"] == 3 and s.loc["first-4", "n"] == 3
    assert s.loc["full", "n_excluded"] == 1 and s.loc["first-4", "n_excluded"] == 1
    assert s.loc["none", "mean"] == pytest.approx(3.15)
    assert s.loc["full", "mean"] == pytest.approx(2.9)
    assert s.loc["first-4", "mean"] == pytest.approx(3.0)
    assert s.loc["none", "std"] == pytest.approx(np.std([3.0, 3.1, 3.2, 3.3], ddof=1))
    assert s.loc["full", "change_pct"] == pytest.approx(100 * (2.9 - 3.15) / 3.15)
    assert s.loc["first-4", "change_pct"] == pytest.approx(100 * (3.0 - 3.15) / 3.15)
    assert s.loc["none", "change_pct"] == 0
    assert s.loc["full", "ci_low"] <= 2.9 <= s.loc["full", "ci_high"]
    assert s.loc["full", "step_time_ms"] == pytest.approx(110.0)
    assert s.loc["full", "step_time_change_pct"] == pytest.approx(10.0)
    assert s.loc["first-4", "step_time_change_pct"] == pytest.approx(2.0)
    assert s.loc["full", "peak_mem_change_pct"] == pytest.approx(0.5)
    assert s.loc["full", "params_change_pct"] == pytest.approx(0.5)
    assert s.loc["first-4", "params_change_pct"] == pytest.approx(0.2)
    # compute: finished runs 50 steps x 4 x 32 tokens; the failed full seed reached step 20
    assert s.loc["full", "trials"] == 4
    assert s.loc["full", "tokens"] == 3 * 50 * 128 + 20 * 128
    assert s.loc["none", "flops"] == pytest.approx(3 * FPT * 4 * 50 * 128)
    assert s.loc["none", "wall_time_s"] == pytest.approx(4 * 60.0)

    md = (router_sweep["first"] / "report.md").read_text()
    assert "| full | 3 | 2.9 ± 0.1 |" in md
    assert "| none (baseline) | 4 | 3.15 ± 0.1291 |" in md
    assert "-7.94%" in md and "-4.76%" in md and "+10.00%" in md and "+0.50%" in md
    assert "Kruskal-Wallis (tie-corrected): H = " in md
    assert "Post-hoc: two-sided Mann-Whitney U" in md


def test_bad_trials_and_duplicates_listed(router_sweep):
    md = (router_sweep["first"] / "report.md").read_text()
    section = md.split("## Failed, diverged and incomplete trials")[1].split("## Results by")[0]
    section = section.split("## Plots")[0]
    assert "| full_L3_s3 | full | 3 | failed | status failed | 20 |" in section
    assert "| first-4_L3_s3 | first-4 | 3 | diverged | status diverged | 31 |" in section
    # the duplicate attempt of none seed 0 is dropped in favour of the finished run, and said so
    assert "Duplicate MLflow runs" in section
    assert "| none_L3_s0 |" in section and "| failed |" in section
    runs = router_sweep["runs"]
    assert len(runs.frame) == 12 and len(runs.duplicates) == 1
    kept = runs.frame.set_index("trial_id").loc["none_L3_s0"]
    assert kept["status"] == "finished" and kept["final/val_loss"] == pytest.approx(3.0)
    assert runs.parent_run_id == router_sweep["parent"]
    # the diverged trial is unstable too; it is no sample, so no verdict can rest on it
    unstable = md.split("## Unstable trials")[1].split("\n## ")[0]
    assert "| first-4 | 3 | diverged |  |  |  |  |  |" in unstable
    assert ("Sensitivity: this trial is no sample of the tables (no finite final metric), so no verdict "
            "rests on it.") in unstable


def test_params_are_cast(router_sweep):
    f = router_sweep["runs"].frame
    assert set(f["n_layers"]) == {3} and all(isinstance(v, int) for v in f["n_layers"])
    assert sorted(set(f["seed"])) == [0, 1, 2, 3]
    assert set(f["params.train.batch_size"]) == {4}
    assert f["router_lr_mult"].map(lambda v: v is None).all()
    assert cast_param("3.0e-3") == pytest.approx(3e-3) and cast_param("None") is None
    assert cast_param("True") is True and cast_param("first-4") == "first-4"


def test_sections_plots_and_reproducibility(router_sweep):
    out = router_sweep["first"]
    md = (out / "report.md").read_text()
    for name in ("loss_curves.png", "final_metric.png", "router_full.png"):
        assert (out / name).is_file() and (out / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in md
    assert "Router source map of full (mean over 3 seed(s))" in md
    assert "- none: 4 finished run(s) without a readable router_weights.npz" in md
    assert not (out / "depth.png").exists() and not (out / "router_none.png").exists()
    assert "## Representation analysis" in md
    # natural layer order and the mean over seeds 0-2 (and 0-3 for none) of 1 + seed
    assert md.index("layer_0 |") < md.index("layer_10 |")
    assert "| analysis/value_entropy/layer_0 | 2.5 ± 1.29 (n=4) | 2 ± 1 (n=3) | 2 ± 1 (n=3) |" in md
    assert "## Compute" in md and "| **total** | 12 |" in md
    assert "`abc123def456`" in md and "- Seeds: 0, 1, 2, 3" in md
    assert "```yaml\n" + SWEEP_YAML.rstrip("\n") + "\n```" in md  # verbatim, from the parent
    # the edited local sweeps/<name>.yaml plays no part: the report reads MLflow only
    assert f"artifact sweep/{SWEEP}.yaml of the parent run" in md and "last-4" not in md
    assert "sweeps/" not in md and "defaults are used" not in md
    assert "torch " in md and "mlflow " in md


def test_same_runs_same_bytes(router_sweep):
    a, b = router_sweep["first"], router_sweep["second"]
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert names == ["final_metric.png", "loss_curves.png", "pairs.csv", "per_seed.csv", "report.html", "report.md",
                     "retrieval_L3.png", "router_full.png", "summary.csv"]  # retrieval: Figure 9's curves of full
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def test_report_logged_to_parent(router_sweep):
    arts = router_sweep["artifacts"]
    assert "report/report.md" in arts and "report/summary.csv" in arts
    assert "report/loss_curves.png" in arts and "report/router_full.png" in arts


def test_router_map_from_synthetic_npz(tmp_path):
    # layer 1: |w| 1 on source 0, 1 on source 1 -> [0.5, 0.5]; layer 2: [0.5, 0, 0.5] (x = 1)
    m1 = router_map_from_npz(router_npz(tmp_path / "a.npz", 3, 1.0))
    np.testing.assert_allclose(m1, [[1, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5]])
    m3 = router_map_from_npz(router_npz(tmp_path / "b.npz", 3, 3.0))
    np.testing.assert_allclose(m3, [[1, 0, 0], [0.75, 0.25, 0], [0.75, 0, 0.25]])
    np.testing.assert_allclose(mean_router_map([m1, m3, m3]),
                               [[1, 0, 0], [2 / 3, 1 / 3, 0], [2 / 3, 0, 1 / 3]])
    ident = router_map_from_npz(router_npz(tmp_path / "c.npz", 3, None))
    np.testing.assert_allclose(ident, np.eye(3))


def test_depth_sweep(store, tmp_path):
    cl = store[1]
    exp = tracking.experiment_id(DEPTH, cl)  # no parent run: the report says so, no crash
    finals = {("none", 2): [3.0, 3.1, 3.2], ("full", 2): [2.9, 3.0, 3.1],
              ("none", 4): [2.8, 2.9, 3.0], ("full", 4): [2.6, 2.7, 2.8]}
    start = T0
    for (router, depth), vals in finals.items():
        for seed, v in enumerate(vals):
            add_trial(cl, exp, None, DEPTH, router, seed, n_layers=depth, final=v,
                      status="finished", start=start)
            start += 1000
    sweep_file = tmp_path / f"{DEPTH}.yaml"
    sweep_file.write_text(f"name: {DEPTH}\ndescription: d\ngrid:\n  model.n_layers: [2, 4]\n"
                          "  router: [none, full]\n  seed: [0, 1, 2]\n")
    # a file path goes through the CLI, which loads the file with the sweep layer
    assert cli_main(["report", str(sweep_file), "--out", str(tmp_path / "out")]) == 0
    md_path = tmp_path / "out" / DEPTH / "report.md"
    out = md_path.parent
    assert out.name == DEPTH and (out / "depth.png").is_file()
    md = md_path.read_text()
    assert "## Results by depth" in md and "### n_layers = 2" in md and "### n_layers = 4" in md
    assert "](depth.png)" in md and "(none found)" in md
    s = pd.read_csv(out / "summary.csv")
    at2 = s[s["scope"] == "n_layers=2"].set_index("variant")
    at4 = s[s["scope"] == "n_layers=4"].set_index("variant")
    assert at2.loc["full", "mean"] == pytest.approx(3.0) and at2.loc["none", "mean"] == pytest.approx(3.1)
    assert at2.loc["full", "change_pct"] == pytest.approx(100 * (3.0 - 3.1) / 3.1)
    assert at4.loc["full", "change_pct"] == pytest.approx(100 * (2.7 - 2.9) / 2.9)
    assert at4.loc["full", "n"] == 3
    # the pooled table pools depths (6 samples per router) and the cells are split by depth
    assert summary(out).loc["full", "n"] == 6
    assert "full, n_layers=4 (n=3)" not in md  # labels live in plots, not the body
    assert "| full, n_layers=4 | 3 |" in md  # compute table per cell
    assert "This table pools all depths" in md

    # --axis n_layers: the file's baseline (a router) does not apply; the first depth is the baseline
    assert cli_main(["report", str(sweep_file), "--out", str(tmp_path / "by-depth"),
                     "--axis", "model.n_layers"]) == 0
    md2 = (tmp_path / "by-depth" / DEPTH / "report.md").read_text()
    assert "using the first value, 2" in md2 and "## Results by depth" not in md2
    s2 = summary(tmp_path / "by-depth" / DEPTH)
    assert list(s2.index) == [2, 4] and s2.loc[4, "n"] == 6
    assert s2.loc[4, "change_pct"] == pytest.approx(100 * (2.8 - 3.05) / 3.05)
    assert (tmp_path / "by-depth" / DEPTH / "depth.png").is_file()


def test_unknown_sweep_and_bad_metric(store, tmp_path, capsys):
    args = argparse.Namespace(sweep="no-such-sweep", out=str(tmp_path / "o"), metric=None,
                              axis=None, baseline=None)
    with pytest.raises(ConfigError, match="no-such-sweep"):
        cmd_report(args)
    assert cli_main(["report", "no-such-sweep", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: report:") and "\n" not in err
    cl = store[1]
    exp = tracking.experiment_id("tiny-sweep", cl)
    add_trial(cl, exp, None, "tiny-sweep", "none", 0, final=3.0, status="finished", start=T0)
    with pytest.raises(ConfigError, match="final/val_los"):
        build_report("tiny-sweep", out=tmp_path / "o", metric="final/val_los")
    with pytest.raises(ConfigError, match="baseline"):
        build_report("tiny-sweep", out=tmp_path / "o", baseline="full")
    assert cli_main(["report", "tiny-sweep", "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.endswith("tiny-sweep/report.md") and Path(printed).is_file()
    md = Path(printed).read_text()
    assert "- no parent run of the sweep in MLflow, so no report settings: the defaults are used" in md
    assert "(not found: no YAML artifact on the parent run)" in md
    assert math.isfinite(pd.read_csv(tmp_path / "o" / "tiny-sweep" / "summary.csv")["mean"][0])


def test_router_heatmap_is_the_mean_over_seeds_of_logged_weights(router_sweep, store):
    from orchestrator.report.render.figures import router_maps

    f = router_sweep["runs"].frame
    ids = list(f[(f["router"] == "full") & (f["status"] == "finished")]["run_id"])
    maps, notes = router_maps(store[1], {"full": ids, "none": ["no-such-run"]})
    m, n = maps["full"]
    assert n == 3 and "none" not in maps and notes and notes[0].startswith("none: 1 finished run")
    # seed 0 has x = 1, seeds 1 and 2 have x = 3 (see router_npz)
    np.testing.assert_allclose(m, [[1, 0, 0], [2 / 3, 1 / 3, 0], [2 / 3, 0, 1 / 3]])


def test_settings_come_from_the_parent_run(store, tmp_path):
    cl = store[1]
    name = "report-test-params"
    exp = tracking.experiment_id(name, cl)
    parent = cl.create_run(exp, start_time=T0, run_name=name,
                           tags={"sweep": name, "sweep_role": "parent"}).info.run_id
    log_sweep_params(cl, parent, axes="model.n_layers,router,seed", axis="model.n_layers",
                     baseline="4", n_trials=8)
    # the logged file says otherwise: it is shown verbatim, never read for settings
    text = f"name: {name}\ndescription: d\ngrid:\n  router: [none, full]\nreport: {{axis: router}}\n"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"{name}.yaml").write_text(text)
        cl.log_artifact(parent, str(Path(d) / f"{name}.yaml"), "sweep")
    finals = {("none", 2): [3.0, 3.2], ("full", 2): [2.9, 3.1], ("none", 4): [2.8, 3.0], ("full", 4): [2.6, 2.8]}
    start = T0
    for (router, depth), vals in finals.items():
        for seed, v in enumerate(vals):
            add_trial(cl, exp, parent, name, router, seed, n_layers=depth, final=v, status="finished",
                      start=start)
            start += 1000
    md = build_report(name, out=tmp_path / "a", log_to_mlflow=False).read_text()
    assert "- Metric `final/val_loss` (lower is better) compared across `n_layers`, baseline `4`" in md
    s = summary(tmp_path / "a" / name)
    assert list(s.index) == [2, 4] and bool(s.loc[4, "baseline"]) and s.loc[4, "n"] == 4
    assert s.loc[2, "change_pct"] == pytest.approx(100 * (3.05 - 2.8) / 2.8)
    assert "```yaml\n" + text.rstrip("\n") + "\n```" in md and "defaults are used" not in md
    assert "| 2, router=full | 2 |" in md  # cells split by the other axis
    # --axis router: the sweep's baseline is a depth, so the default baseline applies
    md = build_report(name, out=tmp_path / "b", axis="router", log_to_mlflow=False).read_text()
    assert "compared across `router`, baseline `none`" in md
    # --baseline overrides the sweep's; a value no run has is an error, not a fallback
    md = build_report(name, out=tmp_path / "c", baseline="2", log_to_mlflow=False).read_text()
    assert "compared across `n_layers`, baseline `2`" in md
    with pytest.raises(ConfigError, match="stats.baseline: '8' is not a value"):
        build_report(name, out=tmp_path / "d", baseline="8", log_to_mlflow=False)


def test_parent_without_settings_uses_the_defaults(store, tmp_path):
    cl = store[1]
    name = "report-test-noparams"
    exp = tracking.experiment_id(name, cl)
    parent = cl.create_run(exp, start_time=T0, run_name=name,
                           tags={"sweep": name, "sweep_role": "parent"}).info.run_id
    for seed, (router, v) in enumerate([("full", 2.9), ("full", 3.0), ("first-4", 3.1), ("first-4", 3.2)]):
        add_trial(cl, exp, parent, name, router, seed, final=v, status="finished", start=T0 + seed)
    md = build_report(name, out=tmp_path, log_to_mlflow=False).read_text()
    assert ("- the parent run has no report settings (sweep.report.* params): the defaults are used "
            "(metric final/val_loss, axis router, baseline none)") in md
    # the default baseline is not a value of the axis: the first value stands in, with a note
    assert "the default baseline 'none' is not a value of 'router'; using the first value, 'first-4'" in md


def test_report_of_a_file_that_no_longer_validates(router_sweep, store, tmp_path, capsys):
    bad = tmp_path / f"{SWEEP}.yaml"
    bad.write_text(SWEEP_YAML + "retired_key: 1\n")
    assert cli_main(["report", str(bad), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / SWEEP / "report.md").read_text()
    assert f"Sweep file ({SWEEP}.yaml):" in md and "retired_key: 1" in md
    assert f"the sweep file does not validate with this code ({SWEEP}.yaml: retired_key: unknown key" in md
    assert "- Metric `final/val_loss` (lower is better) compared across `router`, baseline `none`" in md  # the parent's
    assert cli_main(["report", str(tmp_path / "gone.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: report: sweep file") and err.endswith("gone.yaml does not exist")


def test_final_evals_reads_the_mean_of_the_last_evaluations(store, tmp_path):
    """``report.final_evals: 3``: each trial's metric is the mean of its last 3 ``val/loss`` values."""
    from mlflow.entities import Metric

    cl = store[1]
    name = "report-test-final-evals"
    exp = tracking.experiment_id(name, cl)
    parent = cl.create_run(exp, start_time=T0, run_name=name,
                           tags={"sweep": name, "sweep_role": "parent"}).info.run_id
    log_sweep_params(cl, parent, axes="router,seed", axis="router", baseline="none", n_trials=6, final_evals="3")
    start = T0
    for router, base in (("none", 3.0), ("full", 2.8)):
        for seed in range(3):
            rid = add_trial(cl, exp, parent, name, router, seed, final=9.0, status="finished", start=start)
            # later evaluations than the fixture's (steps 20, 40, 50): base + 0.1 seed + 0, 0.3, 0.6
            cl.log_batch(rid, metrics=[Metric("val/loss", base + 0.1 * seed + 0.3 * i, start + 200 + i, step)
                                       for i, step in enumerate((60, 70, 80))])
            start += 1000
    md = build_report(name, out=tmp_path, log_to_mlflow=False).read_text()
    s = summary(tmp_path / name)
    # mean over seeds of (base + 0.1 seed + 0.3): none 3.0 + 0.1 + 0.3, full 2.8 + 0.1 + 0.3 (not the 9.0 finals)
    assert s.loc["none", "mean"] == pytest.approx(3.4) and s.loc["full", "mean"] == pytest.approx(3.2)
    assert "final/val_loss is the mean of each trial's last 3 evaluations of val/loss" in md
