"""Ray Tune sweeps end to end (local Ray, 2 CPUs): nested MLflow runs, a fault retried from its
checkpoint, and a driver killed mid-sweep then resumed. Each sweep runs the real `lime` CLI in a
subprocess against a private MLflow store and results folder."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.sweeps import TINY, sweep_env

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")



@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store and results folder for the module (a fresh sqlite store costs a migration)."""
    d = tmp_path_factory.mktemp("sweeps")
    return d, sweep_env(d)


def _sweep(d: Path, name: str, **over) -> Path:
    doc = {"name": name, "description": f"test sweep {name}", "base": json.loads(json.dumps(TINY)),
           "resources": {"cpu": 1}, "checkpoint_interval": 5}
    for k, v in over.items():
        if k == "train":
            doc["base"]["train"].update(v)
        else:
            doc[k] = v
    (d / "sweeps").mkdir(exist_ok=True)
    p = d / "sweeps" / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _client(env):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])


def _runs(env, name):
    cl = _client(env)
    exp = cl.get_experiment_by_name(name)
    assert exp is not None, f"no MLflow experiment {name}"
    runs = cl.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = [r for r in runs if r.data.tags.get("sweep_role") == "trial"]
    return cl, parents, children


def _steps(cl, run_id, key="train/loss"):
    return [m.step for m in sorted(cl.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]


def _trial_log(d: Path, name: str, trial_id: str) -> str:
    p = d / "results" / "ray" / name / trial_id / "trial.log"
    return p.read_text() if p.is_file() else ""


def _trainings(log: str) -> int:
    """How often a trial's log says it trained (from scratch or from a checkpoint)."""
    return log.count("\nstarting;") + log.count("\nresuming from step ")


def _ray_status(d: Path, name: str) -> dict:
    from orchestrator.sweep.view import ray_trials

    return ray_trials(d / "results" / "ray" / name)


@pytest.mark.cluster  # a Ray sweep: make test-cluster
def test_local_sweep_nested_mlflow_runs_and_a_fault_retried_from_its_checkpoint(store):
    d, env = store
    name = "e2e-fault"
    # 4 tiny trials at half a CPU each: one wave on 2 cores
    path = _sweep(d, name, grid={"router": ["none", "full"], "seed": [0, 1]}, resources={"cpu": 0.5})
    marker = d / "fault.marker"
    r = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env={**env, "LIME_FAULT_ONCE": f"{marker}:10:router=full,seed=0"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    # the compact view, not Ray's table
    assert "done   router=full,seed=0" in out and "retry  router=full,seed=0" in out
    # the console says where the retry continues, as the attempt itself reports it
    # (an error of its own: it spends one of its retries, and the console names it)
    assert ("retry  router=full,seed=0 (its error 1 of 2 allowed: RuntimeError: injected fault at step 10 "
            "(LIME_FAULT_ONCE)): it has a checkpoint to continue from") in out
    assert "resume router=full,seed=0: continues from its checkpoint at step 10" in out
    assert "resume router=none" not in out and "MLflow unreachable" not in out
    assert "╭" not in out and "Trial name" not in out and "Number of trials" not in out
    assert marker.read_text().startswith("router=full,seed=0 10")

    cl, parents, children = _runs(env, name)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep"] == name
    assert sorted(a.path for a in cl.list_artifacts(parent.info.run_id, "sweep")) == \
        [f"sweep/{name}.resolved.yaml", f"sweep/{name}.yaml"]  # as written, and with its extends applied
    assert parent.data.tags.get("best_trial_id") and parent.data.tags.get("best_run_id")
    ids = sorted(c.data.tags["trial_id"] for c in children)
    assert ids == ["router=full,seed=0", "router=full,seed=1", "router=none,seed=0", "router=none,seed=1"]
    for c in children:
        t = c.data.tags
        assert t["mlflow.parentRunId"] == parent.info.run_id and t["sweep"] == name
        assert c.info.status == "FINISHED" and t["status"] == "finished"
        for k in ("router", "preset", "n_layers", "seed", "git_sha"):
            assert k in t, k
        assert t["router"] == t["trial_id"].split(",")[0].split("=")[1]
        assert _steps(cl, c.info.run_id) == [5, 10, 15, 20], t["trial_id"]  # one continuous history
        assert "final/val_loss" in c.data.metrics
        assert c.info.run_id in out  # the summary table names every run
    log = _trial_log(d, name, "router=full,seed=0")
    assert "injected fault at step 10" in log and "resuming from step 10" in log
    assert log.count("=== ") == 2  # the first attempt and the retry, in one log
    assert "resuming" not in _trial_log(d, name, "router=none,seed=1")

    from orchestrator.sweep.view import status_text

    os.environ["MLFLOW_TRACKING_URI"], saved = env["MLFLOW_TRACKING_URI"], os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["LIME_RESULTS"], saved_res = env["LIME_RESULTS"], os.environ.get("LIME_RESULTS")
    try:
        st = status_text(name)
    finally:
        for k, v in (("MLFLOW_TRACKING_URI", saved), ("LIME_RESULTS", saved_res)):
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert "finished 4" in st and all(c.info.run_id in st for c in children)


@pytest.mark.cluster  # a Ray sweep: make test-cluster
def test_killed_driver_resumes_without_rerunning_or_duplicating(store):
    d, env = store
    name = "kill-resume"
    # the system temp dir of the sweep's processes (short: Ray puts its sockets there): no attempt leaves anything
    tmp = Path(tempfile.mkdtemp(prefix="lk-", dir="/tmp"))
    env = {**env, "TMPDIR": str(tmp)}
    # two trials side by side: a short one finishes while the long one is mid-way
    path = _sweep(d, name, grid={"steps": [40, 300]}, checkpoint_interval=20,
                  train={"log_interval": 10, "eval_interval": 50, "batch_size": 8, "seq_len": 64})
    short, long_ = "steps=40", "steps=300"
    log1 = open(d / "kill-run1.log", "w")
    p = subprocess.Popen([LIME, "sweep", "run", str(path)], stdout=log1, stderr=subprocess.STDOUT, cwd=ROOT,
                         env=env, start_new_session=True)
    caught, deadline = False, time.time() + 600
    try:
        while time.time() < deadline and p.poll() is None:
            lg = _trial_log(d, name, long_)
            if "finished at step" in lg:
                break  # too late: the long trial is done
            if "finished at step" in _trial_log(d, name, short) and "step 40:" in lg:
                # give Ray a moment to record the short one (it saves its state every 2 s), as usually happens
                end = time.time() + 8
                while time.time() < end and _ray_status(d, name).get(short) != "TERMINATED":
                    time.sleep(0.2)
                caught = "finished at step" not in _trial_log(d, name, long_)
                break
            time.sleep(0.1)
    finally:
        # the driver and its local Ray together, as a crash of the machine would; a pause in between
        # lets the long trial finish on an idle machine (300 tiny steps take ~3 s), and then there
        # is nothing left to resume
        os.kill(p.pid, signal.SIGKILL)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        log1.close()
    assert caught, "the driver was not caught mid-sweep:\n" + (d / "kill-run1.log").read_text()[-3000:]
    state1 = json.loads((d / "results" / "ray" / name / "lime_sweep.json").read_text())
    cl, parents, before = _runs(env, name)
    before = {c.data.tags["trial_id"]: c for c in before}
    wall1 = float(parents[0].data.tags.get("sweep/wall_s", 0))  # the killed launch counted up to its last beat
    assert wall1 > 0, parents[0].data.tags
    assert before[short].info.status == "FINISHED" and before[long_].info.status != "FINISHED"

    r = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resuming" in r.stdout
    resumed = int(_trial_log(d, name, long_).split("resuming from step ")[1].split(";")[0])
    assert f"resume {long_}: continues from its checkpoint at step {resumed}" in r.stdout
    state2 = json.loads((d / "results" / "ray" / name / "lime_sweep.json").read_text())
    assert state2["parent_run_id"] == state1["parent_run_id"] and state2["launches"] == 2

    cl, parents, after = _runs(env, name)
    assert len(parents) == 1 and parents[0].info.run_id == state1["parent_run_id"]
    assert parents[0].info.status == "FINISHED"
    assert float(parents[0].data.tags["sweep/wall_s"]) > wall1  # both launches
    left = [p.name for p in tmp.iterdir() if p.name.startswith("lime-")]
    shutil.rmtree(tmp, ignore_errors=True)
    assert not left  # nothing left in the temp dir
    assert not list((d / "results" / "ray" / name).glob("*/attempt"))  # each attempt's folder removed
    assert sorted(c.data.tags["trial_id"] for c in after) == [long_, short]  # one run per trial: no duplicates
    for c in after:
        assert c.info.status == "FINISHED" and c.data.tags["status"] == "finished"  # nothing stale
        n = int(c.data.tags["trial_id"].split("=")[1])
        assert _steps(cl, c.info.run_id) == list(range(10, n + 1, 10)), c.data.tags["trial_id"]
    after = {c.data.tags["trial_id"]: c for c in after}
    # the finished trial was not run again
    assert after[short].info.run_id == before[short].info.run_id
    assert after[short].info.end_time == before[short].info.end_time
    assert _trainings(_trial_log(d, name, short)) == 1
    # the interrupted one continued its run from a checkpoint
    assert after[long_].info.run_id == before[long_].info.run_id
    log = _trial_log(d, name, long_)
    assert _trainings(log) == 2 and "starting;" in log
    resumed_at = int(log.split("resuming from step ")[1].split(";")[0])
    assert 20 <= resumed_at < 300


@pytest.mark.cluster  # a Ray sweep: make test-cluster
def test_a_crash_between_checkpoints_resumes_without_duplicate_steps(store, monkeypatch):
    """The engine flushes its metrics when a trial dies; the retry recomputes those steps from the
    last checkpoint and must not log them twice (what a Ray retry or resume does, without Ray)."""
    from orchestrator.engine.trial import Tracking, run_trial
    from orchestrator.engine.trial_config import TrialConfig

    d, env = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update(checkpoint_interval=10, checkpoint_dir=str(d / "crash-ck"), threads=1)

    def crash(step, metrics, ck):
        if step == 15:
            raise RuntimeError("crash between checkpoints")

    with pytest.raises(RuntimeError):
        run_trial(TrialConfig.from_dict(cfg), tracking=Tracking(experiment="crash"), on_log=crash)
    res = run_trial(TrialConfig.from_dict(cfg), tracking=Tracking(experiment="crash"), resume=d / "crash-ck")
    cl = _client(env)
    runs = cl.search_runs([cl.get_experiment_by_name("crash").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == res.run_id and runs[0].info.status == "FINISHED"
    assert _steps(cl, res.run_id) == [5, 10, 15, 20]
    assert _steps(cl, res.run_id, "final/val_loss") == [0]  # one end-of-trial scalar, at step 0 (hooks.py)


@pytest.mark.slow
def test_optuna_search_with_repeats_and_asha(store):
    d, env = store
    name = "search-asha"
    path = _sweep(d, name, search={"metric": "final/val_loss", "mode": "min", "num_samples": 2, "seed": 0,
                                    "repeat": 2, "space": {"lr": {"loguniform": [1.0e-3, 1.0e-2]},
                                                           "router": {"choice": ["none", "full"]}},
                                    "asha": {"grace_period": 10}})
    r = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "best:" in r.stdout
    cl, parents, children = _runs(env, name)
    assert len(children) == 4 and len(parents) == 1
    seeds = sorted(int(c.data.tags["seed"]) for c in children)
    assert seeds == [0, 0, 1, 1]
    assert all(c.data.tags["trial_id"].startswith("sample=") for c in children)
    assert all(c.info.status != "RUNNING" for c in children)
    assert parents[0].data.tags["best_run_id"] in {c.info.run_id for c in children}
