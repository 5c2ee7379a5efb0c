"""The scaling and iso-FLOP sections of `lime report`, end to end from a local MLflow store filled
with synthetic trial runs (written like run_trial's).

The ladder: n_layers 2/4/8/16/32 x routers none/full x seeds 0-3, 50 steps of 4 x 32 tokens.
FLOPs/token = 1e5 (L + 2), x1.1 for full, so C = 3 x FLOPs/token x 6,400. The baseline's final
loss is L_b(C) = 2 + (C / 1e10)^(-0.5); full's is L_b(2 C): worth exactly 2x the compute. Each
seed adds the same small log-noise to both routers at a rung (paired seeds). The val/loss curve of
every run falls linearly by 0.3 from step 10 to its final value at step 50.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.core import tracking
from orchestrator.decide.intervals import paired_interval
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.report.build import build_report
from orchestrator.report.scaling import fits
from orchestrator.report.scaling.depth import statements, trend_text, view
from orchestrator.report.scaling.isoflop import at_budget, iso_rows
from orchestrator.report.scaling.rungs import Line, Rung
from orchestrator.report.stats import rule

LADDER = "scaling-test-ladder"
ROUTERS = "scaling-test-routers"
SHORT = "scaling-test-short"
DEPTHS = (2, 4, 8, 16, 32)
TOKENS = 50 * 4 * 32
T0 = 1_700_000_000_000
NOISE = np.random.default_rng(11).normal(0, 0.002, (len(DEPTHS), 4))  # rung x seed


def fpt(router: str, depth: int) -> float:
    return 1e5 * (depth + 2) * (1.1 if router == "full" else 1.0)


def base_law(c: float) -> float:
    return 2.0 + (c / 1e10) ** -0.5


def final_loss(router: str, depth: int, seed: int) -> float:
    c = 3 * fpt(router, depth) * TOKENS
    return (base_law(2 * c) if router == "full" else base_law(c)) * math.exp(NOISE[DEPTHS.index(depth), seed])


def add_run(cl, exp: str, parent: str, sweep: str, router: str, depth: int, seed: int, final: float, start: int):
    from mlflow.entities import Metric, Param

    cfg = TrialConfig.from_dict({"preset": "tiny", "model": {"router": router, "n_layers": depth},
                                 "train": {"steps": 50, "batch_size": 4, "seq_len": 32, "seed": seed}})
    tid = f"n_layers={depth},router={router},seed={seed}"
    tags = {"sweep": sweep, "sweep_role": "trial", "trial_id": tid, "router": router, "preset": "tiny",
            "n_layers": str(depth), "seed": str(seed), "status": "finished", "mlflow.parentRunId": parent}
    rid = cl.create_run(exp, start_time=start, tags=tags, run_name=tid).info.run_id
    flat = tracking.flatten({**cfg.to_dict(), "resolved": {"model": cfg.model_config().to_dict()}})
    cl.log_batch(rid, params=[Param(k, v) for k, v in flat.items()])
    ms = [Metric("model/params", 1e4 * (depth + 1) * (1.01 if router == "full" else 1.0), start, 0),
          Metric("model/flops_per_token", fpt(router, depth), start, 0),
          Metric("final/val_loss", final, start + 100, 50)]
    for step in range(10, 51, 10):
        ms += [Metric("val/loss", final + 0.3 * (50 - step) / 40, start + step, step),
               Metric("train/loss", final + 0.4 * (50 - step) / 40, start + step, step)]
    cl.log_batch(rid, metrics=ms)
    cl.set_terminated(rid, status="FINISHED", end_time=start + 60_000)


def fill(cl, sweep: str, depths, routers=("none", "full"), seeds=range(4)) -> str:
    from mlflow.entities import Param

    exp = tracking.experiment_id(sweep, cl)
    parent = cl.create_run(exp, start_time=T0, run_name=sweep,
                           tags={"sweep": sweep, "sweep_role": "parent"}).info.run_id
    params = {"sweep.report.metric": "final/val_loss", "sweep.report.axis": "router",
              "sweep.report.baseline": "none", "sweep.axes": "model.n_layers,router,seed"}
    cl.log_batch(parent, params=[Param(k, v) for k, v in params.items()])
    start = T0 + 1000
    for d in depths:
        for r in routers:
            for s in seeds:
                add_run(cl, exp, parent, sweep, r, d, s, final_loss(r, d, s), start)
                start += 1000
    return parent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.chdir(root)
        mp.setattr(fits, "N_BOOT", 60)  # fewer resamples: the same code, a faster test
        yield root, tracking.client()


@pytest.fixture(scope="module")
def ladder(store):
    root, cl = store
    parent = fill(cl, LADDER, DEPTHS)
    first = build_report(LADDER, out=root / "a")
    second = build_report(LADDER, out=root / "b", log_to_mlflow=False)
    return {"a": first.parent, "b": second.parent, "md": first.read_text(), "parent": parent, "cl": cl}


def section(md: str, title: str) -> str:
    return md.split(f"\n## {title}\n")[1].split("\n## ")[0]


def test_scaling_section_fits_and_multiplier(ladder):
    md = ladder["md"]
    sc = section(md, "Scaling")
    assert "The sweep varies `n_layers` besides `router`" in sc
    assert "### Fits against training compute" in sc and "### Fits against parameters (fixed tokens)" in sc
    assert "not identifiable:" not in sc and "| not identifiable |" not in sc
    row = next(x for x in sc.splitlines() if x.startswith("| none | 5 |"))
    assert "fitted (" in row
    assert "![Scaling fits](scaling.png)" in sc and (ladder["a"] / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    mult = [x for x in sc.split("### Effective compute multiplier")[1].splitlines()
            if x.startswith("| full | n_layers=")]
    assert len(mult) == len(DEPTHS) and "(largest)" in mult[-1]
    m = float(mult[-1].split("|")[4].split("x")[0])
    assert m == pytest.approx(2.0, rel=0.05)  # full is the baseline shifted by 2x compute
    assert "the fitted curves do not cross" in sc
    assert "### Hold-out check" in sc and "| none | n_layers=32 |" in sc


def test_depth_view_matches_hand_computation(ladder):
    sc = section(ladder["md"], "Scaling")
    assert "### Depth (fixed width)" in sc
    # full at 16 layers: L_b(2 x 3 x 1.1 x 1.8e6 x 6400) = 2.3627 < none at 32 layers (2.391); at 8: 2.487
    assert "`full` reaches `none`'s 32-layer final/val_loss" in sc and "at 16 layers (2x shallower)" in sc
    # the advantage L_b(C) - L_b(2.2 C) falls as C grows: a negative slope, said as a description only
    diffs = [np.mean([final_loss("full", d, s) - final_loss("none", d, s) for s in range(4)]) for d in DEPTHS]
    slope = -np.polyfit(np.log2(DEPTHS), diffs, 1)[0]
    assert slope < 0 and f"on log2 depth is {float(f'{slope:.3g}'):g} per doubling" in sc
    assert "no trend is claimed" in sc and "grows with depth" not in sc and "shrinks with depth" not in sc
    assert "beyond noise" not in sc and "bootstrap 95% CI" not in sc.split("### Depth")[1]
    # the sentences quote the per-depth verdict tables
    assert "The report's verdicts of `full` against `none` per depth: 2 layers: " in sc


def test_isoflop_section(ladder):
    iso = section(ladder["md"], "Iso-FLOP comparison")
    row = next(x for x in iso.splitlines() if x.startswith("| n_layers=32 | full |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == "+10.00%" and cells[6] == "40-50"
    # full's budget step is 50 / 1.1; linear in log-FLOPs between steps 40 and 50
    t = math.log(50 / 1.1 / 40) / math.log(50 / 40)
    expect = np.mean([final_loss("full", 32, s) + 0.075 * (1 - t) for s in range(4)])
    assert float(cells[4].split(" ")[0]) == pytest.approx(expect, abs=1e-4)
    base_row = next(x for x in iso.splitlines() if x.startswith("| n_layers=32 | none |"))
    assert "(baseline)" in base_row


def test_numbers_reach_the_parent_run(ladder):
    cl = ladder["cl"]
    m = cl.get_run(ladder["parent"]).data.metrics
    assert m["scaling/full/multiplier_at_max"] == pytest.approx(2.0, rel=0.05)
    assert m["scaling/full/multiplier_at_max_ci_low"] <= m["scaling/full/multiplier_at_max"]
    assert m["scaling/none/alpha"] == pytest.approx(0.5, rel=0.1)
    assert m["scaling/none/E"] == pytest.approx(2.0, rel=0.03)
    assert "scaling/none/N/alpha" in m and "scaling/none/holdout_error_pct" in m
    assert m["scaling/full/depth_match_layers"] == 16
    assert "isoflop/full/n_layers_32/diff" in m
    arts = {a.path for a in cl.list_artifacts(ladder["parent"], "report")}
    assert "report/scaling.png" in arts


def test_same_runs_same_bytes(ladder):
    a, b = ladder["a"], ladder["b"]
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and "scaling.png" in names
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def test_no_size_axis_no_scaling_section(store):
    root, cl = store
    fill(cl, ROUTERS, (4,), seeds=range(3))
    md = build_report(ROUTERS, out=root / "r", log_to_mlflow=False).read_text()
    assert "## Scaling" not in md and not (root / "r" / ROUTERS / "scaling.png").exists()
    iso = section(md, "Iso-FLOP comparison")
    assert "| full | +10.00% |" in iso and "rung" not in iso.splitlines()[2]


def test_short_ladder_says_not_identifiable(store):
    root, cl = store
    fill(cl, SHORT, (2, 4, 8), seeds=range(2))
    md = build_report(SHORT, out=root / "s", log_to_mlflow=False).read_text()
    sc = section(md, "Scaling")
    assert "`none`: not identifiable: 3 rung(s) for 3 parameters (E, A, alpha); the fit needs >= 4" in sc
    assert "`none`: no hold-out check: 3 rungs; the check needs >= 4" in sc
    assert "no multiplier" in sc and "nan" not in sc.lower()
    assert "### Depth (fixed width)" in sc  # the depth view needs no fit


# ------------------------------------------------------------------------------ pieces

def test_at_budget_hand_made():
    steps, vals = [10, 20, 30], [3.0, 2.5, 2.0]
    # budget 50 FLOPs at 2 FLOPs/step = step 25: log-interpolation between steps 20 and 30
    t = (math.log(50) - math.log(40)) / (math.log(60) - math.log(40))
    v, br = at_budget(steps, vals, 2.0, 50.0)
    assert v == pytest.approx(2.5 - 0.5 * t) and br == (20.0, 30.0)
    assert at_budget(steps, vals, 2.0, 60.0)[0] == pytest.approx(2.0)  # the last point
    assert math.isnan(at_budget(steps, vals, 2.0, 61.0)[0])  # beyond the run: not extrapolated


def test_depth_view_no_match_is_said():
    def line(label, means, baseline=False):
        ln = Line(label, label, (), is_baseline=baseline)
        for d, m in zip((2, 4, 8), means):
            ln.rungs.append(Rung((str(d),), f"n_layers={d}", d * 1e9, d * 1e4, 1e6,
                                 {s: m + 0.01 * (s - 1) for s in range(3)}, {"n_layers": d}))
        return ln

    base, var = line("none", [3.0, 2.8, 2.6], True), line("full", [2.95, 2.75, 2.62])
    v = view(var, base, "min")
    assert v.match is None and v.beats is None
    words = statements(v, "final/val_loss", "min")
    assert words[0] == ("`full` does not reach `none`'s 8-layer final/val_loss (2.6) at any depth up to 8; "
                        "its best is 2.62 at 8 layers.")
    # differences -0.05, -0.05, +0.02 at log2 depth 1, 2, 3: advantage slope -0.035 per doubling
    assert v.trend == pytest.approx(-0.035)
    # no verdicts given: none quoted, and nothing said to grow or shrink
    assert words[-1].startswith("No verdict of `full` against `none` per depth is in this report.")
    assert "-0.035 per doubling" in words[-1] and "no trend is claimed" in words[-1]
    # "better at every depth" only when every depth's verdict says so
    mixed = trend_text(v, "final/val_loss", {2: "better", 4: "not decided", 8: "better"})
    assert "2 layers: better; 4 layers: not decided; 8 layers: better." in mixed and "every depth" not in mixed
    every = trend_text(v, "final/val_loss", {2: "better", 4: "better", 8: "better"})
    assert "`full` is better than `none` at every depth by the verdicts." in every
    assert "every depth" not in trend_text(v, "final/val_loss", {2: "better", 4: "better"})  # 8 has no verdict
    # the per-depth interval is the verdict rule's at 95%, under the rule's name
    d = np.array([2.95 + 0.01 * (s - 1) - (3.0 + 0.01 * (s - 1)) for s in range(3)])
    assert v.rows[0].ci == (paired_interval(d, 0.95).low, paired_interval(d, 0.95).high)  # 3 seeds: the whole line
    assert v.rows[0].ci == (-math.inf, math.inf)


def test_iso_and_depth_labels_name_the_rule():
    from orchestrator.report.scaling.isoflop import section as iso_section

    assert rule.LABEL == "sign (median)" and rule.label(0.95) == "95% sign (median)"
    # a paired change: the verdict rule's interval of the per-seed differences, not a bootstrap
    base, var = Line("none", "none", (), is_baseline=True), Line("full", "full", ())
    for ln, vals in ((base, [3.0, 3.1, 2.9, 3.05, 2.95, 3.0]), (var, [2.9, 3.05, 2.85, 2.9, 2.9, 2.96])):
        ln.rungs.append(Rung(("4",), "", 1e9, 1e4, 1e6, dict(enumerate(vals)), {}))
    steps = np.array([10.0, 20.0])
    hist = {}
    for ln in (base, var):
        ln.rungs[0].runs = {s: (f"{ln.label}{s}", 1.0) for s in ln.rungs[0].values}
        for s, v in ln.rungs[0].values.items():
            hist[f"{ln.label}{s}"] = {"val/loss": (steps, np.array([v + 1.0, v]))}
    rows = iso_rows([base, var], hist)
    r = next(x for x in rows if not x.line.is_baseline)
    d = np.array(list(var.rungs[0].values.values())) - np.array(list(base.rungs[0].values.values()))
    # hand: the sign interval of the median at 6 seeds and 95% is [d_(1), d_(6)]: P(all 6 of one sign)
    # = 2/64 = 0.031 <= 0.05, while [d_(2), d_(5)] would leave 2 x 7/64 = 0.22 outside
    assert r.ci == pytest.approx((d.min(), d.max()))
    text = "\n".join(iso_section(rows, "final/val/loss"))
    assert "change vs baseline (paired, 95% sign (median))" in text and "bootstrap" not in text


def frame(rows):
    import pandas as pd

    base = {"status": "finished", "n_layers": 16, "preset": "150m", "steps": 100, "tokens": 1e6,
            "lr": 1e-3, "flops_per_step": 1.0, "model/params": 1.0}
    return pd.DataFrame([{**base, **r, "run_id": f"r{i}", "flops": r.get("d_model", 1) * 1e9}
                         for i, r in enumerate(rows)])


def test_lines_absorb_a_width_bundle_and_split_on_other_factors():
    from orchestrator.report.scaling.rungs import build_lines, has_size_axis

    rows = [{"router": r, "variant": f"w{w}", "d_model": w, "seed": s, "lr": lr, "final/val_loss": 3.0 - w / 1000}
            for r in ("none", "full") for w in (256, 512) for s in (0, 1) for lr in (1e-3, 2e-3)]
    lines = build_lines(frame(rows), "final/val_loss", "router", "none", ["router", "d_model", "lr", "variant"])
    # the width bundle is the rung; lr splits each router into two lines; the baseline's lines first
    assert [ln.label for ln in lines] == ["none, lr=0.001", "none, lr=0.002", "full, lr=0.001", "full, lr=0.002"]
    assert [r.label for r in lines[0].rungs] == ["d_model=256, variant=w256", "d_model=512, variant=w512"]
    assert lines[0].rungs[1].values == {0: pytest.approx(2.488), 1: pytest.approx(2.488)}
    assert lines[0].is_baseline and not lines[2].is_baseline and has_size_axis(lines)
    # a failed trial and a NaN metric are no samples
    rows += [{"router": "none", "variant": "w1024", "d_model": 1024, "seed": 0, "final/val_loss": float("nan")},
             {"router": "none", "variant": "w1024", "d_model": 1024, "seed": 1, "final/val_loss": 2.0,
              "status": "failed"}]
    from orchestrator.report.render.figures import finished

    factors = ["router", "d_model", "lr", "variant"]
    lines = build_lines(finished(frame(rows)), "final/val_loss", "router", "none", factors)
    assert all(len(ln.rungs) == 2 for ln in lines)


def test_chinchilla_fit_when_parameters_and_tokens_vary():
    ln = Line("none", "none", (), is_baseline=True)
    for i, (n, d) in enumerate((n, d) for n in (1e6, 4e6, 1.6e7) for d in (1e8, 4e8, 1.6e9)):
        y = 1.7 + 400.0 / n ** 0.34 + 1000.0 / d ** 0.28
        ln.rungs.append(Rung((str(i),), f"rung{i}", 6 * n * d, n, d, {0: y, 1: y * 1.001}, {}))
    two_d = Line("x", "x", (), rungs=[r for r in ln.rungs if r.d < 1e9])
    assert fits.fit_line(two_d, "ND", [], "min").reason == (
        "D take(s) fewer than 3 distinct values; each exponent needs >= 3 to be separated from its amplitude")
    s = fits.analyze([ln], "min", n_boot=20)
    line_fits = s.lines[0].fits
    assert set(line_fits) == {"C", "ND"}
    nd = line_fits["ND"]
    assert nd.reason is None and nd.values()["a"] == pytest.approx(0.34, rel=0.05)
    assert nd.values()["b"] == pytest.approx(0.28, rel=0.05)
