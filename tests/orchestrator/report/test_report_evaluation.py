"""The report's downstream-evaluation section: a hand-built runs frame with known per-seed scores
(the Table 1 layout's means in points, the average per trial, the paired verdicts with exact
permutation p-values computed here), and the section in a report built from MLflow runs."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.core import eval_items, tracking
from orchestrator.report import evaluation
from orchestrator.report.build import build_report
from tests.orchestrator.report.test_eval_items import files as item_files
from tests.orchestrator.report.test_report import T0, add_trial, log_sweep_params

SEEDS = list(range(8))
RNG = np.random.default_rng(0)
BASE_KV = 0.30 + 0.02 * RNG.standard_normal(8)
NOISE = 0.01 * RNG.standard_normal(8)
BASE_IND = 0.10 + 0.01 * RNG.standard_normal(8)
BASE_BPB = 3.0 + 0.05 * RNG.standard_normal(8)
KV_CELL = "| full | better (+2, median 2, 95% interval of the median [1.9, 2.1]; interval of the mean"
PRIMARY = json.dumps({"lime_kv": ["acc", True], "lime_kv_bpb": ["bpb", False], "lime_induction": ["exact_match", True]})


def values(router: str, seed: int) -> dict[str, float]:
    lime = router == "full"
    # +-0.1 point and +-0.002 bits alternate over the 8 seeds (mean 0): a constant difference would have
    # zero variance, "not tested" (issue 33)
    return {"eval/lime_kv/acc": BASE_KV[seed] + (0.02 + 0.001 * (-1) ** seed if lime else 0.0),  # +2 points a seed
            "eval/lime_induction/exact_match": BASE_IND[seed] + (NOISE[seed] if lime else 0.0),  # noise only
            "eval/lime_kv_bpb/bpb": BASE_BPB[seed] - (0.1 + 0.002 * (-1) ** seed if lime else 0.0)}  # 0.1 bits lower


def frame() -> pd.DataFrame:
    rows = []
    for router in ("none", "full"):
        for s in SEEDS:
            rows.append({"trial_id": f"router={router},seed={s}", "run_id": f"{router}{s}", "status": "finished",
                         "router": router, "seed": s, **values(router, s), "tags.eval/primary": PRIMARY,
                         "tags.eval/lime_kv/config": "3-shot,limit=None,abc",
                         "tags.eval/lime_induction/config": "3-shot,limit=None,def"})
    rows.append({"trial_id": "router=full,seed=8", "run_id": "x", "status": "failed", "router": "full", "seed": 8})
    return pd.DataFrame(rows)


def test_table_means_averages_and_paired_verdicts_match_a_hand_computation(tmp_path):
    df, tables = evaluation.analyze(frame(), "router", "none", ["seed"], 0.05, 0)
    scores, losses = tables
    assert [c.task for c in scores.columns] == ["lime_kv", "lime_induction", "average"]
    assert [c.task for c in losses.columns] == ["lime_kv_bpb"]  # one loss task: no average column
    kv, ind, avg = scores.columns
    assert kv.comp.group("none").mean == pytest.approx(100 * BASE_KV.mean())
    assert kv.comp.group("full").mean == pytest.approx(100 * (BASE_KV.mean() + 0.02))
    alt = 0.001 * (-1.0) ** np.arange(8)
    per_trial = 100 * (BASE_KV + 0.02 + alt + BASE_IND + NOISE) / 2
    assert avg.comp.group("full").mean == pytest.approx(per_trial.mean())
    assert avg.comp.group("full").n == 8  # the failed trial is no sample
    # +2 points on all 8 seeds: the exact sign-flip test's smallest p, 2 / 2^8, better
    r = kv.pa.row("full")
    assert r.diff_mean == pytest.approx(2.0) and r.p_perm == pytest.approx(2 / 256)
    assert r.verdict == "better"
    # noise of sd 1 point: the exact sign-flip p over the 256 sign patterns, computed here
    d = 100 * NOISE
    flips = np.array([[1 if (k >> i) & 1 else -1 for i in range(8)] for k in range(256)])
    p = np.mean(np.abs(flips @ d) >= abs(d.sum()) - 1e-9)
    assert ind.pa.row("full").p_perm == pytest.approx(p)
    # the verdict is read off the median's sign interval ([min, max] at 8 seeds and 95%), so it can only
    # be better or worse where every sign agrees (2 / 256 < 0.05: then the sign-flip test rejects too)
    row = ind.pa.row("full")
    expect = "better" if row.ci_low > 0 else "worse" if row.ci_high < 0 else "not decided"
    assert row.verdict == expect and (expect == "not decided" or p < 0.05)
    # lower bpb is better
    assert losses.columns[0].pa.row("full").verdict == "better"
    assert losses.columns[0].pa.mode == "min"


def test_section_markdown_and_csv(tmp_path):
    lines = evaluation.section(frame(), "router", "none", ["seed"], 0.05, 0, tmp_path)
    text = "\n".join(lines)
    assert "## Downstream evaluation" in text and "16 of 17 finished" not in text
    assert "16 of 16 finished trials carry scores" in text
    assert "Shots: lime_kv 3, lime_induction 3." in text
    assert "| router | n | lime_kv (acc) | lime_induction (exact_match) | average |" in text
    base = f"{100 * BASE_KV.mean():.4g}"
    assert f"| none (baseline) | 8 | {base} ± " in text
    assert KV_CELL in text
    assert "### Gold-answer loss (bits per byte of the gold answer, lower is better)" in text
    assert "### Paper vs this run (Table 1, the average score)" in text and "none (LLaMA)" in text
    csv = pd.read_csv(tmp_path / "evaluation.csv")
    assert set(csv["task"]) == {"lime_kv", "lime_induction", "average", "lime_kv_bpb"}
    row = csv[(csv.task == "lime_kv") & (csv.variant == "full")].iloc[0]
    assert row["verdict"] == "better" and row["mean"] == pytest.approx(100 * (BASE_KV.mean() + 0.02))


def test_no_eval_metrics_no_section():
    df = frame().drop(columns=[c for c in frame().columns if c.startswith(("eval/", "tags.eval"))])
    assert evaluation.section(df, "router", "none", ["seed"], 0.05, 0) == []


@pytest.mark.slow  # a whole report from an MLflow store (plots and all): the frame-level tests above are the fast check
def test_a_report_from_mlflow_runs_has_the_section(tmp_path, monkeypatch):
    from mlflow.entities import Metric, RunTag

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    cl = tracking.client()
    exp = tracking.experiment_id("evrep", cl)
    parent = cl.create_run(exp, start_time=T0, run_name="evrep", tags={"sweep": "evrep", "sweep_role": "parent"})
    parent = parent.info.run_id
    log_sweep_params(cl, parent, axes="router,seed", axis="router", baseline="none", n_trials=16)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "evrep.yaml").write_text("name: evrep\n")
        cl.log_artifact(parent, str(Path(d) / "evrep.yaml"), "sweep")
    start = T0 + 1000
    for router in ("none", "full"):
        for s in SEEDS:
            rid = add_trial(cl, exp, parent, "evrep", router, s, final=3.0 - 0.01 * s, status="finished", start=start)
            cl.log_batch(rid, metrics=[Metric(k, v, start, 0) for k, v in values(router, s).items()],
                         tags=[RunTag("eval/primary", PRIMARY), RunTag("eval/lime_kv/config", "3-shot,limit=None,a")])
            with tempfile.TemporaryDirectory() as d:  # per-document results, as the evaluation logs them
                (Path(d) / "lime_kv.json").write_text(eval_items.dumps(item_files(s, router)["lime_kv"]))
                cl.log_artifacts(rid, d, "eval/items")
            start += 1000
    md = build_report("evrep", out=tmp_path / "out", log_to_mlflow=False).read_text()
    assert "## Downstream evaluation" in md and KV_CELL in md
    assert (tmp_path / "out" / "evrep" / "evaluation.csv").is_file()
    # the runs' eval/items files read back from the store: lime_kv paired per document (+15 points a seed)
    assert "### Paired per document (pooled over seeds)" in md and "| full | better (+15 [" in md
    rows = pd.read_csv(tmp_path / "out" / "evrep" / "evaluation_items.csv")
    assert rows[rows.task == "lime_kv"]["seeds"].tolist() == [8]
