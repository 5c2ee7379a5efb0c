"""The report's comparisons paired per document: a runs frame and per-document files built here with
known differences (the differences, averages and Holm's p computed by hand), "not tested" for a task
every model scores the same on, files of another key left unpaired, runs without files noted."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.decide.verdict import table_contradictions
from orchestrator.report import eval_items, evaluation

SEEDS = list(range(8))
N = 100
PRIMARY = json.dumps({"lime_kv": ["acc", True], "lime_kv_bpb": ["bpb", False],
                      "lime_induction": ["exact_match", True]})
KEY = "1-shot,limit=None,abc"


def files(seed: int, variant: str) -> dict[str, dict]:
    """The three tasks' per-document tables of one trial: ``full`` is right on 20 documents the
    baseline misses and wrong on 5 it gets (+15 points a seed); ``half`` +2 and -1 (+1 point);
    nobody gets any induction document right."""
    rng = np.random.default_rng(seed)
    base = (rng.random(N) < 0.3).astype(int)
    wrong, right = np.flatnonzero(base == 0), np.flatnonzero(base == 1)
    kv = base.copy()
    ups, downs = {"none": (0, 0), "full": (20, 5), "half": (2, 1)}[variant]
    kv[rng.choice(wrong, ups, replace=False)] = 1
    kv[rng.choice(right, downs, replace=False)] = 0
    bpb = 3.0 + rng.normal(0, 0.2, N) - (0.1 + rng.normal(0, 0.05, N) if variant != "none" else 0)
    hashes = [f"h{i:03d}" for i in range(N)]

    def table(task, metric, values):
        return {"task": task, "key": KEY, "doc_id": list(range(N)), "doc_hash": hashes,
                "metrics": {metric: [float(v) for v in values]}}

    return {"lime_kv": table("lime_kv", "acc", kv), "lime_induction": table("lime_induction", "exact_match",
                                                                            np.zeros(N)),
            "lime_kv_bpb": table("lime_kv_bpb", "bpb", bpb)}


FILES = {f"{v}{s}": files(s, v) for v in ("none", "full", "half") for s in SEEDS}


def frame() -> pd.DataFrame:
    rows = []
    for v in ("none", "full", "half"):
        for s in SEEDS:
            f = FILES[f"{v}{s}"]
            rows.append({"trial_id": f"router={v},seed={s}", "run_id": f"{v}{s}", "status": "finished", "router": v,
                         "seed": s, "eval/lime_kv/acc": np.mean(f["lime_kv"]["metrics"]["acc"]),
                         "eval/lime_induction/exact_match": 0.0,
                         "eval/lime_kv_bpb/bpb": np.mean(f["lime_kv_bpb"]["metrics"]["bpb"]),
                         "tags.eval/primary": PRIMARY})
    return pd.DataFrame(rows)


def diffs(variant: str, task: str, metric: str, scale: float) -> np.ndarray:
    return np.array([[scale * (a - b) for a, b in zip(FILES[f"{variant}{s}"][task]["metrics"][metric],
                                                     FILES[f"none{s}"][task]["metrics"][metric])] for s in SEEDS])


def test_per_document_verdicts_differences_and_holm_match_a_hand_computation(tmp_path):
    lines = evaluation.section(frame(), "router", "none", ["seed"], 0.05, 0, tmp_path, items=FILES.get)
    text = "\n".join(lines)
    assert "### Paired per document (pooled over seeds)" in text
    assert "Verdicts against `none`" in text  # the per-seed verdicts stay beside them
    csv = pd.read_csv(tmp_path / eval_items.CSV)
    assert table_contradictions(csv.to_dict("records")) == []
    kv = csv[(csv.task == "lime_kv")].set_index("variant")
    assert kv.loc["full", "diff"] == pytest.approx(15.0) and kv.loc["half", "diff"] == pytest.approx(1.0)
    assert kv.loc["full", "seeds"] == 8 and kv.loc["full", "documents"] == N
    assert (kv["family_size"] == 2).all() and np.allclose(kv["confidence"], 0.975)  # Bonferroni over 2
    assert kv.loc["full", "verdict"] == "better" and kv.loc["full", "diff_ci_low"] > 0
    p = sorted(kv["p"])  # Holm by hand: 2 p_(1), then max(that, p_(2))
    assert sorted(kv["p_holm"]) == pytest.approx([min(1, 2 * p[0]), min(1, max(2 * p[0], p[1]))])
    assert kv.loc["full", "base_mean"] == pytest.approx(100 * np.mean([FILES[f"none{s}"]["lime_kv"]["metrics"]["acc"]
                                                                       for s in SEEDS]))
    # induction: every model scores 0 on every document: not tested, out of the family
    ind = csv[csv.task == "lime_induction"]
    assert (ind["verdict"] == "not tested").all() and (ind["family_size"] == 0).all()
    assert "- lime_induction (every variant): not tested: the two score the same on every document in every " \
           "seed (8 x 100)." in text
    # the average weighs each task 1/2: (15 + 0) / 2 for full
    avg = csv[(csv.task == "average") & (csv.table == "Scores")].set_index("variant")
    assert avg.loc["full", "diff"] == pytest.approx(7.5) and avg.loc["full", "documents"] == 2 * N
    # the gold answer's loss: lower is better, 0.1 bits lower a document
    bpb = csv[csv.task == "lime_kv_bpb"].set_index("variant")
    assert bpb.loc["full", "diff"] == pytest.approx(diffs("full", "lime_kv_bpb", "bpb", 1.0).mean())
    assert bpb.loc["full", "verdict"] == "better" and bpb.loc["full", "better"] == "lower"
    assert "| full | better (+15 [" in text


def test_files_of_another_key_are_not_paired_and_runs_without_files_are_noted(tmp_path):
    changed = {k: dict(v) for k, v in FILES.items()}
    changed["full3"] = {t: {**tab, "key": "3-shot,limit=None,zzz"} for t, tab in FILES["full3"].items()}
    del changed["half5"]
    lines = evaluation.section(frame(), "router", "none", ["seed"], 0.05, 0, tmp_path, items=changed.get)
    csv = pd.read_csv(tmp_path / eval_items.CSV)
    kv = csv[csv.task == "lime_kv"].set_index("variant")
    assert kv.loc["full", "seeds"] == 7 and kv.loc["half", "seeds"] == 7
    assert kv.loc["full", "unpaired_seeds"] == 1 and kv.loc["half", "unpaired_seeds"] == 1
    full = diffs("full", "lime_kv", "acc", 100.0)
    assert kv.loc["full", "diff"] == pytest.approx(np.delete(full, 3, axis=0).mean())
    assert any("1 of 24 finished trials have no per-document results" in line for line in lines)


def test_no_per_document_results_is_one_note_and_no_file(tmp_path):
    lines = evaluation.section(frame(), "router", "none", ["seed"], 0.05, 0, tmp_path, items=lambda rid: {})
    assert "- none of the 24 finished trials has per-document results (evaluated before they were logged); " \
           "evaluating them again (`lime eval`, the sweep's `eval:` block) adds them" in lines
    assert not (tmp_path / eval_items.CSV).exists()
    # without a loader (a caller that reads no artifacts) the section is the per-seed one alone
    assert not any("Paired per document" in line for line in evaluation.section(frame(), "router", "none", ["seed"],
                                                                                 0.05, 0))


COMMITTED = sorted((Path(__file__).resolve().parents[3] / "results").glob("*/" + eval_items.CSV))


def test_the_committed_downstream_report_has_per_document_verdicts():
    assert "eval-cpu" in [p.parent.name for p in COMMITTED]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_committed_per_document_verdicts_agree_with_their_intervals(path):
    rows = pd.read_csv(path).to_dict("records")
    assert rows and table_contradictions(rows) == []
    for r in rows:
        if r["verdict"] == "not tested":
            assert str(r["note"]).startswith("not tested"), r
            continue
        # every tested cell: its difference inside its own interval, Holm's p never below the raw p,
        # and the interval at the family's Bonferroni level
        assert r["diff_ci_low"] <= r["diff"] <= r["diff_ci_high"], r
        assert r["p_holm"] >= r["p"] - 1e-12, r
        assert r["confidence"] == pytest.approx(1 - 0.05 / r["family_size"]), r
