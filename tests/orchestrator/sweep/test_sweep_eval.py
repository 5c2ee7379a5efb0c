"""A sweep's ``eval:`` block: validated with the file (one line naming the key), no change to the
trials, checked before anything starts, and every finished trial evaluated once (in-process here;
through Ray in the slow end-to-end test)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.core import eval_names
from orchestrator.core.tracking import client, experiment_id
from orchestrator.engine.checkpoint import CKPT_NAME
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.sweep import evaluate
from orchestrator.sweep.spec import load_spec, trial_dirname

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "tests" / "orchestrator" / "evaluation" / "tasks"
LIME = str(Path(sys.executable).parent / "lime")
BASE = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
        "data": {"source": "builtin"}, "optim": {"lr": 3.0e-3, "min_lr": 3.0e-4, "warmup_steps": 2},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 32, "log_interval": 2, "eval_interval": 4,
                  "eval_batches": 1}}


def sweep_file(d: Path, name: str, eval_block=None, **over) -> Path:
    doc = {"name": name, "description": f"test sweep {name}", "base": json.loads(json.dumps(BASE)),
           "grid": {"router": ["none", "full"], "seed": [0]}, "resources": {"cpu": 1}, **over}
    if eval_block is not None:
        doc["eval"] = eval_block
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_an_eval_block_changes_no_trial(tmp_path):
    plain = load_spec(sweep_file(tmp_path / "a", "sw"))
    with_eval = load_spec(sweep_file(tmp_path / "b", "sw", {"tasks": ["lime-local"], "num_fewshot": 1}))
    assert [(t.trial_id, t.config.to_dict()) for t in plain.trials()] == \
           [(t.trial_id, t.config.to_dict()) for t in with_eval.trials()]
    assert plain.fingerprint() == with_eval.fingerprint()
    assert plain.eval is None and with_eval.eval.tasks == ["lime-local"]


def test_the_dry_run_says_what_will_be_evaluated(tmp_path, monkeypatch, capsys):
    from orchestrator.cli import main

    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    path = sweep_file(tmp_path, "dry", {"tasks": ["lime-local"], "num_fewshot": 1})
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ("eval: after the trials, each finished trial's final checkpoint on lime_kv (1-shot), lime_induction "
            "(1-shot), lime_pydoc_cloze (1-shot), with the gold-answer bits per byte") in out
    assert out.rstrip().endswith("dry run: nothing was started")


@pytest.mark.parametrize("block, message", [
    ({"tasks": ["lime_kv", "no such"]}, r"eval.tasks\[1\]: 'no such' is not a task or suite name"),
    ({"tasks": ["lime_kv"], "limit": -3}, r"eval.limit: must be an integer >= 1"),
    ({"tasks": ["lime_kv"], "fewshot": 3}, r"eval.fewshot: unknown key; allowed: batch_size"),
    ({}, r"eval.tasks: required"),
])
def test_a_bad_eval_block_is_one_line_with_the_file(tmp_path, block, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_spec(sweep_file(tmp_path, "bad", block))
    assert str(e.value).startswith(str(tmp_path / "bad.yaml")) and "\n" not in str(e.value)


def test_lime_help_and_sweep_files_load_without_the_harness_or_transformers():
    loaded = "print(sorted(k for k in ('lm_eval', 'transformers', 'torch') if k in sys.modules))"
    code = (f"import sys; from orchestrator.cli import build_parser; build_parser(); {loaded}; "
            "from orchestrator.sweep.spec import load_spec; import orchestrator.cli.sweep; "
            f"s = load_spec('sweeps/eval-cpu.yaml'); assert s.eval is not None; {loaded}")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.splitlines() == ["[]", "[]"], out.stderr  # validating a sweep file imports none of them


def test_preflight_refuses_synthetic_trials_and_unreachable_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    evaluate.preflight(load_spec(sweep_file(tmp_path / "ok", "ok", {"tasks": ["lime-local"]})))
    kv = {"source": "kv-recall", "n_train": 8, "n_val": 8}
    spec = load_spec(sweep_file(tmp_path / "kv", "kv", {"tasks": ["lime_kv"]},
                                base={**BASE, "data": kv, "train": {**BASE["train"], "seq_len": 64}}))
    with pytest.raises(ConfigError, match=r"kv.yaml: eval: trial router=none,seed=0: data.source: .* synthetic"):
        evaluate.preflight(spec)
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    spec = load_spec(sweep_file(tmp_path / "hub", "hub", {"tasks": ["hub_task"], "include": [str(TASKS)]}))
    with pytest.raises(ConfigError, match=r"hub.yaml: eval.tasks: task 'hub_task' needs the dataset"):
        evaluate.preflight(spec)


@pytest.fixture
def finished_sweep(tmp_path, monkeypatch):
    """Two finished trials and a failed one of a sweep as the driver leaves them: MLflow child runs
    of a parent, the final checkpoints in the Ray trial folders."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    spec = load_spec(sweep_file(tmp_path, "evs", {"tasks": ["lime_kv"], "num_fewshot": 0, "limit": 8}))
    cl = client()
    exp = experiment_id("evs", cl)
    parent = cl.create_run(exp, tags={"sweep": "evs", "sweep_role": "parent"}).info.run_id
    exp_dir = tmp_path / "results" / "ray" / "evs"
    for t in spec.trials():
        cfg = t.config
        cfg.train.checkpoint_dir = str(tmp_path / "work" / t.trial_id)
        run_trial(cfg, tracking=Tracking(experiment="evs", parent_run_id=parent, run_name=t.trial_id,
                                         tags={"sweep": "evs", "trial_id": t.trial_id, "sweep_role": "trial"}))
        ray_ck = exp_dir / trial_dirname(t.trial_id) / "checkpoint_000001"
        ray_ck.mkdir(parents=True)
        shutil.copy2(Path(cfg.train.checkpoint_dir) / CKPT_NAME, ray_ck / CKPT_NAME)
    failed = cl.create_run(exp, tags={"sweep": "evs", "trial_id": "router=x,seed=0", "status": "failed",
                                      "mlflow.parentRunId": parent}).info.run_id
    return spec, cl, exp, parent, exp_dir, failed


def test_finished_trials_are_evaluated_once(finished_sweep, capsys):
    spec, cl, exp, parent, exp_dir, failed = finished_sweep
    uri = os.environ["MLFLOW_TRACKING_URI"]
    results = evaluate.finished_trials(spec, cl, exp, parent, exp_dir, uri, runner=evaluate.in_process)
    assert [r["ok"] for r in results] == [True, True]
    runs = {r.data.tags["trial_id"]: r for r in cl.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent}'")}
    for tid in ("router=none,seed=0", "router=full,seed=0"):
        run = runs[tid]
        assert "eval/lime_kv/acc" in run.data.metrics and eval_names.SETTINGS_TAG in run.data.tags
        assert (exp_dir / trial_dirname(tid) / "eval.log").is_file()
    assert not any(k.startswith("eval/") for k in runs["router=x,seed=0"].data.metrics)  # not finished
    assert evaluate.finished_trials(spec, cl, exp, parent, exp_dir, uri, runner=evaluate.in_process) == []
    assert "every finished trial is evaluated already" in capsys.readouterr().out
    # a new block: the trials are evaluated again, but the task already scored under the same key is skipped
    spec.eval.tasks = ["lime_kv", "lime_induction"]
    evaluate.finished_trials(spec, cl, exp, parent, exp_dir, uri, runner=evaluate.in_process)
    rid = runs["router=full,seed=0"].info.run_id
    assert len(cl.get_metric_history(rid, "eval/lime_kv/acc")) == 1
    assert "eval/lime_induction/exact_match" in cl.get_run(rid).data.metrics


@pytest.mark.slow
def test_lime_sweep_run_evaluates_then_a_new_block_only_evaluates(tmp_path):
    """Through Ray: the eval pass after the fit, then the finished sweep launched again with a new
    eval: block restores its trials (none trains again) and evaluates what is new."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "LIME_RESULTS": str(tmp_path / "results"), "LIME_CACHE": str(tmp_path / "cache"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    path = sweep_file(tmp_path / "sweeps", "evray", {"tasks": ["lime_kv"], "num_fewshot": 0, "limit": 8})
    run = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "eval: 2 finished trial(s) to evaluate" in run.stdout
    path = sweep_file(tmp_path / "sweeps", "evray", {"tasks": ["lime_kv", "lime_induction"], "num_fewshot": 0,
                                                     "limit": 8})
    again = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "eval: 2 finished trial(s) to evaluate" in again.stdout
    cl = client(env["MLFLOW_TRACKING_URI"])
    exp = cl.get_experiment_by_name("evray")
    trials = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get("sweep_role") == "trial"]
    assert len(trials) == 2
    for r in trials:
        assert {"eval/lime_kv/acc", "eval/lime_induction/exact_match"} <= set(r.data.metrics)
        assert len(cl.get_metric_history(r.info.run_id, "eval/lime_kv/acc")) == 1
        folder = tmp_path / "results" / "ray" / "evray" / trial_dirname(r.data.tags["trial_id"])
        log = (folder / "trial.log").read_text()
        assert log.count("\nstarting;") + log.count("\nresuming from step ") == 1  # trained once
