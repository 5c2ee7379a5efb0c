"""``lime eval`` and ``lime export`` end to end: a trained run's scores printed, logged to its MLflow
run (matching a hand computation on the trained model) and not computed twice; one-line errors
with exit code 2 before anything is loaded; ``lime --help`` without the harness."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.cli import main
from orchestrator.core.tracking import client
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.evaluation.loading import load_trained
from orchestrator.report.eval_items import mlflow_loader
from orchestrator.sweep.checkpoints import resolve_target
from tests.orchestrator.evaluation.helpers import TINY

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
MC = [("What is two plus two?", ["four", "five", "a banana"], 0),
      ("Which keyword defines a function in Python?", ["class", "def", "lambda x"], 1),
      ("The colour of the sky on a clear day?", ["green", "blue", "red"], 1),
      ("Which is a prime number?", ["nine", "fifteen", "seven"], 2)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store and results folder for the module (a fresh sqlite store costs a migration)."""
    d = tmp_path_factory.mktemp("cli-eval")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{d}/mlflow.db")
        mp.setenv("LIME_RESULTS", str(d / "results"))
        yield d


@pytest.fixture(scope="module")
def trained(store):
    """A 4-step trial of a tiny model, tracked: (run id, checkpoint folder)."""
    model = {k: v for k, v in TINY.items() if k != "vocab_size"}
    cfg = TrialConfig.from_dict({"preset": "tiny", "model": {**model, "router": "full"}, "data": {"source": "builtin"},
                                 "train": {"steps": 4, "batch_size": 2, "seq_len": 32, "log_interval": 2,
                                           "eval_interval": 4, "eval_batches": 1, "checkpoint_dir": str(store / "ck")}})
    res = run_trial(cfg, tracking=Tracking(experiment="eval-test"))
    return res.run_id, Path(res.checkpoint)


@pytest.fixture
def trained_run(trained, store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    monkeypatch.setenv("LIME_RESULTS", str(store / "results"))
    return trained


def hand_acc(ck: Path) -> float:
    hits = hand_hits(ck)
    return sum(hits) / len(hits)


def hand_hits(ck: Path) -> list[int]:
    """Per document: 1 where the gold choice has the highest log-likelihood."""
    m = load_trained(ck).model.double()
    hits = []
    for q, choices, gold in MC:
        ctx = list(f"Q: {q}\nA:".encode())
        lls = []
        for c in choices:
            ids = ctx + list((" " + c).encode())
            with torch.no_grad():
                lp = torch.log_softmax(m(torch.tensor([ids[:-1]]))[0].double(), -1)
            lls.append(sum(float(lp[i - 1, ids[i]]) for i in range(len(ctx), len(ids))))
        hits.append(int(max(range(3), key=lambda i: lls[i]) == gold))
    return hits


def test_lime_eval_logs_scores_that_match_a_hand_computation(trained_run, task_dir, capsys, store):
    run_id, ck = trained_run
    rc = main(["eval", run_id, "--tasks", "tiny_mc", "--include", str(task_dir), "--num-fewshot", "0"])
    out = capsys.readouterr().out
    assert rc == 0
    run = client().get_run(run_id)
    acc = run.data.metrics["eval/tiny_mc/acc"]
    assert acc == pytest.approx(hand_acc(ck))
    assert "eval/tiny_mc/acc_stderr" in run.data.metrics and "eval/tiny_mc_bpb/bpb" in run.data.metrics
    assert json.loads(run.data.tags["eval/primary"]) == {"tiny_mc": ["acc", True], "tiny_mc_bpb": ["bpb", False]}
    assert run.data.tags["eval/tiny_mc/config"].startswith("0-shot,limit=None,")
    assert [m.step for m in client().get_metric_history(run_id, "eval/tiny_mc/acc")] == [0]
    arts = [a.path for a in client().list_artifacts(run_id, "eval") if not a.is_dir]
    assert len(arts) == 1 and arts[0].startswith("eval/harness_results_")
    # the per-document results, one small file a task on the run, as the report reads them
    assert sorted(a.path for a in client().list_artifacts(run_id, "eval/items")) == [
        "eval/items/tiny_mc.json", "eval/items/tiny_mc_bpb.json"]
    items = mlflow_loader(client())(run_id)
    assert items["tiny_mc"]["metrics"]["acc"] == hand_hits(ck) and items["tiny_mc"]["doc_id"] == [0, 1, 2, 3]
    assert items["tiny_mc"]["key"] == run.data.tags["eval/tiny_mc/config"]
    assert run.data.tags["eval/tiny_mc/items"] == "4"
    assert any(line.split()[:2] == ["tiny_mc", "acc*"] and float(line.split()[2]) == pytest.approx(acc, abs=1e-4)
               for line in out.splitlines())
    saved = json.loads((store / "results" / "eval" / run_id / "results.json").read_text())
    assert saved["results"]["tiny_mc"]["acc,none"] == pytest.approx(acc)
    # again: every task is scored already under the same settings: nothing runs, nothing is logged
    assert main(["eval", run_id, "--tasks", "tiny_mc", "--include", str(task_dir), "--num-fewshot", "0"]) == 0
    assert "already scored" in capsys.readouterr().out
    assert len(client().get_metric_history(run_id, "eval/tiny_mc/acc")) == 1


def test_lime_eval_of_a_checkpoint_folder_without_logging(trained_run, task_dir, capsys):
    run_id, ck = trained_run
    assert main(["eval", str(ck), "--tasks", "tiny_gen", "--include", str(task_dir), "--no-log"]) == 0
    assert "not logged to MLflow (--no-log)" in capsys.readouterr().out
    assert not any(k.startswith("eval/tiny_gen") for k in client().get_run(run_id).data.metrics)


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "tiny_mc", "--limit", "0"], "--limit: must be an integer >= 1"),
    (["--tasks", " , "], "--tasks: a non-empty list"),
    (["--tasks", "tiny_mc", "--num-fewshot", "-2"], "--num-fewshot: must be"),
])
def test_bad_flags_are_one_line_and_exit_2(trained_run, argv, message, capsys):
    assert main(["eval", str(trained_run[1]), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err


def test_no_checkpoint_and_synthetic_trials_are_one_line(tmp_path, trained_run, capsys):
    assert main(["eval", str(tmp_path / "nothing"), "--tasks", "lime_kv"]) == 2
    assert "is neither a checkpoint" in capsys.readouterr().err
    cfg = TrialConfig.from_dict({"preset": "tiny", "data": {"source": "kv-recall", "n_train": 8, "n_val": 8},
                                 "train": {"steps": 1, "batch_size": 2, "seq_len": 64,
                                           "checkpoint_dir": str(tmp_path / "kv")}})
    run_trial(cfg, tracking=Tracking(enabled=False))
    assert main(["eval", str(tmp_path / "kv"), "--tasks", "lime_kv"]) == 2
    assert "synthetic task 'kv-recall'" in capsys.readouterr().err


def test_a_hub_task_offline_is_one_line_and_exit_2_before_the_model_loads(trained_run, task_dir, monkeypatch, capsys):
    import datasets

    from orchestrator.evaluation import run

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(run, "load_trained", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["eval", str(trained_run[1]), "--tasks", "tiny_mc,hub_task", "--include", str(task_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --tasks: task 'hub_task' needs the dataset") and "HF_DATASETS_OFFLINE" in err


@pytest.mark.slow  # a fresh process, as a user runs it
def test_a_hub_task_offline_fails_fast_in_one_line_before_the_model_loads(trained_run, task_dir):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([LIME, "eval", str(trained_run[1]), "--tasks", "tiny_mc,hub_task", "--include", str(task_dir)],
                         capture_output=True, text=True, env=env, cwd=task_dir, timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: --tasks: task 'hub_task' needs the dataset")
    assert "HF_DATASETS_OFFLINE" in lines[-1]
    assert "attention:" not in out.stderr + out.stdout  # no model was built


def test_a_lime_train_run_without_a_checkpoint_folder_finds_its_checkpoint(trained_run, capsys):
    model = {k: v for k, v in TINY.items() if k != "vocab_size"}
    cfg = TrialConfig.from_dict({"preset": "tiny", "model": model, "data": {"source": "builtin"},
                                 "train": {"steps": 2, "batch_size": 2, "seq_len": 16, "eval_batches": 1}})
    res = run_trial(cfg, tracking=Tracking(experiment="eval-test"))  # the trainer picks a temporary folder
    assert resolve_target(res.run_id) == (Path(res.checkpoint), res.run_id)
    assert main(["eval", str(res.checkpoint), "--tasks", "lime_kv", "--limit", "2", "--run-id", "nope"]) == 2
    assert "run nope: not a run of the MLflow store" in capsys.readouterr().err


def test_lime_export_of_a_run_id(trained_run, tmp_path, capsys):
    run_id, ck = trained_run
    assert main(["export", run_id, "--to", str(tmp_path / "hf")]) == 0
    meta = json.loads((tmp_path / "hf" / "lime_export.json").read_text())
    assert meta["run_id"] == run_id and meta["step"] == 4 and Path(meta["checkpoint"]) == ck
    assert {"config.json", "model.safetensors", "modeling_lime.py", "configuration_lime.py", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "hf").iterdir()}
