"""The compute multiplier and the co-scheduled label in `lime report`, end to end from a local MLflow
store of synthetic trial runs (written like run_trial's).

The field: routers none (baseline), first-4 and full, seeds 0-7, 50 steps of 4 x 32 tokens, val/loss at
steps 10-50. FLOPs/token 1e6 (full: 1.1e6). Seed s's baseline falls linearly in steps to 3 + 0.1 s:
L = 3 + 0.1 s + 0.0075 (50 - step). first-4 ends 0.06 + 0.002 s above it, inside the baseline's curve
between steps 40 and 50; full ends 0.05 + 0.001 s below it, below the whole curve (extrapolated).
Even seeds ran on host node-a, odd ones on node-b, all at once: co-scheduled.
"""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import scipy.stats as sps

from orchestrator.core import tracking
from orchestrator.core.fmt import num
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.report.build import build_report

FIELD, ONE = "mult-test-field", "mult-test-one-eval"
T0 = 1_700_000_000_000
SEEDS = range(8)
FPT = {"none": 1e6, "first-4": 1e6, "full": 1.1e6}


def base_loss(seed: int, step: float) -> float:
    return 3.0 + 0.1 * seed + 0.0075 * (50 - step)


def final(router: str, seed: int) -> float:
    return base_loss(seed, 50) + {"none": 0.0, "first-4": 0.06 + 0.002 * seed, "full": -0.05 - 0.001 * seed}[router]


def add_run(cl, exp, parent, sweep, router, seed, steps, start, end, host):
    from mlflow.entities import Metric, Param

    cfg = TrialConfig.from_dict({"preset": "tiny", "model": {"router": router},
                                 "train": {"steps": 50, "batch_size": 4, "seq_len": 32, "seed": seed}})
    tid = f"router={router},seed={seed}"
    tags = {"sweep": sweep, "sweep_role": "trial", "trial_id": tid, "router": router, "preset": "tiny",
            "seed": str(seed), "status": "finished", "mlflow.parentRunId": parent, "host": host}
    rid = cl.create_run(exp, start_time=start, tags=tags, run_name=tid).info.run_id
    flat = tracking.flatten({**cfg.to_dict(), "resolved": {"model": cfg.model_config().to_dict()}})
    cl.log_batch(rid, params=[Param(k, v) for k, v in flat.items()])
    last = final(router, seed)
    ms = [Metric("model/params", 1e5, start, 0), Metric("model/flops_per_token", FPT[router], start, 0),
          Metric("final/val_loss", last, start + 100, 50)]
    for step in steps:  # the variants' curves above their final value do not matter: only the last is read
        v = base_loss(seed, step) if router == "none" else last + 0.0075 * (50 - step)
        ms += [Metric("val/loss", v, start + step, step), Metric("perf/step_time_ms", 100.0, start + step, step)]
    cl.log_batch(rid, metrics=ms)
    cl.set_terminated(rid, status="FINISHED", end_time=end)


def fill(cl, sweep, routers, steps, overlap: bool) -> str:
    from mlflow.entities import Param

    exp = tracking.experiment_id(sweep, cl)
    tags = {"sweep": sweep, "sweep_role": "parent"}
    parent = cl.create_run(exp, start_time=T0, run_name=sweep, tags=tags).info.run_id
    params = {"sweep.report.metric": "final/val_loss", "sweep.report.axis": "router",
              "sweep.report.baseline": "none", "sweep.axes": "router,seed"}
    cl.log_batch(parent, params=[Param(k, v) for k, v in params.items()])
    i = 0
    for r in routers:
        for s in SEEDS:
            start = T0 + 1000 + (1000 if overlap else 100_000) * i
            add_run(cl, exp, parent, sweep, r, s, steps, start, start + 60_000, f"node-{'ab'[s % 2]}")
            i += 1
    return parent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiplier")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.chdir(root)
        yield root, tracking.client()


@pytest.fixture(scope="module")
def field(store):
    root, cl = store
    parent = fill(cl, FIELD, ("none", "first-4", "full"), range(10, 51, 10), overlap=True)
    out = build_report(FIELD, out=root / "a").parent
    return {"out": out, "md": (out / "report.md").read_text(), "parent": parent, "cl": cl}


def part(md: str, start: str, end: str = "\n## ") -> str:
    return md.split(start)[1].split(end)[0]


def summary(out) -> dict:
    return {r["variant"]: r for r in csv.DictReader(open(out / "summary.csv")) if r["scope"] == "all"}


def test_a_multiplier_inside_the_curve_by_hand(field):
    # first-4 on seed s ends 0.06 + 0.002 s above the baseline's end: between steps 40 (+0.075) and 50, a
    # fraction t = (0.075 - that) / 0.075 of the way in log FLOPs; the same FLOPs per step: M = 0.8 x 1.25^t
    by_hand = np.array([0.8 * 1.25 ** ((0.075 - 0.06 - 0.002 * s) / 0.075) for s in SEEDS])
    rows = [r for r in csv.DictReader(open(field["out"] / "per_seed.csv"))
            if r["scope"] == "all" and r["variant"] == "first-4"]
    assert [int(r["block"]) for r in rows] == list(SEEDS)
    assert np.exp([float(r["log_multiplier"]) for r in rows]) == pytest.approx(by_hand, rel=1e-9)
    assert {r["multiplier_read"] for r in rows} == {"interpolated"}
    s = summary(field["out"])["first-4"]
    # the median of 8: the geometric mean of the middle two; 2 comparisons: the sign interval at 97.5% is
    # [min, max] (2 / 2^8 <= 0.025 < 2 x 9 / 2^8)
    assert float(s["compute_multiplier"]) == pytest.approx(math.sqrt(by_hand[3] * by_hand[4]), rel=1e-9)
    assert float(s["compute_multiplier_ci_low"]) == pytest.approx(by_hand.min(), rel=1e-9)
    assert float(s["compute_multiplier_ci_high"]) == pytest.approx(by_hand.max(), rel=1e-9)
    assert s["compute_multiplier_verdict"] == "worse" and s["compute_multiplier_extrapolated"] == "0"
    assert float(s["compute_multiplier_level"]) == pytest.approx(0.975)


def test_a_multiplier_below_the_curve_is_extrapolated_and_flagged(field):
    rows = [r for r in csv.DictReader(open(field["out"] / "per_seed.csv"))
            if r["scope"] == "all" and r["variant"] == "full"]
    # the baseline's tail is linear in steps (concave in log FLOPs): the power law's exponent runs to its bound
    assert all(r["multiplier_read"].startswith("log-linear (extrapolated): power law ill-posed: its exponent c "
                                               "ends at the bound") for r in rows)
    lm = np.array([float(r["log_multiplier"]) for r in rows])
    s = summary(field["out"])["full"]
    assert s["compute_multiplier_verdict"] == "better" and s["compute_multiplier_extrapolated"] == "8"
    assert float(s["compute_multiplier"]) == pytest.approx(math.exp(np.median(lm)), rel=1e-9)
    lo, hi = np.sort(lm)[[0, -1]]
    assert (float(s["compute_multiplier_ci_low"]), float(s["compute_multiplier_ci_high"])) == (
        pytest.approx(math.exp(lo), rel=1e-9), pytest.approx(math.exp(hi), rel=1e-9))
    assert 2 * sps.binom.cdf(0, 8, 0.5) <= 0.025 < 2 * sps.binom.cdf(1, 8, 0.5)  # why [min, max]
    baseline = [r for r in csv.DictReader(open(field["out"] / "per_seed.csv")) if r["variant"] == "none"]
    assert all(r["log_multiplier"] == "" and r["multiplier_read"] == "" for r in baseline)


def test_the_report_shows_it_in_ranking_verdicts_and_parent_run(field):
    md, s = field["md"], summary(field["out"])
    ranking = part(md, "### Ranking", "### All numbers")
    assert "compute multiplier [interval]" in ranking
    full = s["full"]
    full = f"{num(float(full['compute_multiplier']), 3)}x [{num(float(full['compute_multiplier_ci_low']), 3)}x"
    assert full in next(x for x in ranking.splitlines() if x.startswith("| ") and "| full |" in x)
    verdicts = part(md, "\n## Verdicts\n")
    mult = verdicts.split("### Worth in compute (multiplier)")[1]
    assert "compute-multiplier family: 2 comparison(s), each interval at 97.5%" in mult
    assert "- **full**: " in mult and "better: worth more compute than it costs" in mult
    assert "Extrapolated on 8 of 8 seeds (log-linear 8)" in mult
    assert "- **first-4**: " in mult and "worse: worth less compute than it costs" in mult
    assert "| first-4 | 0 |" in mult  # the per-seed table
    m = field["cl"].get_run(field["parent"]).data.metrics
    assert m["multiplier/full/median"] == pytest.approx(float(s["full"]["compute_multiplier"]))
    assert m["multiplier/first-4/ci_high"] == pytest.approx(float(s["first-4"]["compute_multiplier_ci_high"]))
    assert m["multiplier/full/extrapolated_seeds"] == 8


def test_co_scheduled_step_times_are_labelled(field):
    md = field["md"]
    # 24 runs of 60 s started 1 s apart; even seeds on node-a, odd on node-b: 12 at once on each host
    assert ("**Step times are co-scheduled**: 24 of 24 finished trials ran while other trials of this sweep ran "
            "on the same host (up to 12 at once)") in part(md, "\n## Results\n")
    assert "| step ms (co-scheduled) | step change (co-scheduled) |" in md
    assert "**Step times are co-scheduled**" in part(md, "\n## Compute\n")
    assert {r["step_time_co_scheduled"] for r in summary(field["out"]).values()} == {"1"}


def test_one_evaluation_gives_one_line_and_runs_one_at_a_time(store):
    root, cl = store
    fill(cl, ONE, ("none", "full"), [50], overlap=False)
    out = build_report(ONE, out=root / "b", log_to_mlflow=False).parent
    md = (out / "report.md").read_text()
    mult = md.split("### Worth in compute (multiplier)")[1].split("\n## ")[0].strip().splitlines()
    assert mult[0].startswith("No compute multiplier: the baseline's run has a single `val/loss` evaluation on "
                              "every seed.") and len(mult) == 1
    assert summary(out)["full"]["compute_multiplier"] == ""
    assert "Step times were measured one trial at a time per host" in md and "(co-scheduled)" not in md
