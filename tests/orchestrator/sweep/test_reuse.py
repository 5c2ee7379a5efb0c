"""Worker reuse: trials run one after another in one process give the losses of fresh processes,
bit for bit, also for a trial retried from its checkpoint in the reused process; and under Ray
Tune the trials of a sweep share their worker processes, each MLflow run has its start-up
metrics and the parent run the sweep's wall time and slots.

The in-process tests run the trial side (``orchestrator.sweep.trainable.run_attempt``) with a
stand-in for Ray Tune's API in subprocesses, as a Ray worker would."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sweeps import TINY, sweep_env

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")


# Runs the trial attempts given as JSON in argv[1] one after another in this process, with a
# stand-in for ray.tune (checkpoints persisted in the trial folder, as Ray's storage does), and
# prints what each attempt reported.
WORKER = r'''
import json, os, shutil, sys, time
from pathlib import Path
job = json.loads(sys.argv[1])
from orchestrator.core.tracking import client, experiment_id
from orchestrator.engine.startup import worker_clock
from orchestrator.sweep import trainable as trial
from orchestrator.sweep.spec import load_spec

class Tune:
    def __init__(self, trial_dir):
        self.trial_dir, self.reports, self.n = trial_dir, [], 0
        outer = self
        class Checkpoint:
            @staticmethod
            def from_directory(src):
                outer.n += 1
                dst = outer.trial_dir / f"checkpoint_{outer.n:06d}"
                shutil.copytree(src, dst)
                return dst
        self.Checkpoint = Checkpoint
    def get_checkpoint(self):
        return None  # the newest one is found in the trial folder
    def report(self, metrics, checkpoint=None):
        self.reports.append({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})

out = []
for a in job["attempts"]:
    spec = load_spec(a["sweep"])
    cl = client(job["uri"])
    exp = experiment_id(spec.name, cl)
    parents = cl.search_runs([exp], filter_string="tags.sweep_role = 'parent'")
    parent = parents[0].info.run_id if parents else cl.create_run(exp, tags={"sweep_role": "parent"}).info.run_id
    ctx = {"uri": job["uri"], "parent_run_id": parent, "exp_dir": a["exp_dir"], "metric": "final/val_loss",
           "launched": time.time()}
    trial_id = spec.trial_id(a["params"])
    tune = Tune(Path(a["exp_dir"]) / trial_id)
    tune.trial_dir.mkdir(parents=True, exist_ok=True)
    tune.n = len(list(tune.trial_dir.glob("checkpoint_*")))
    clock = worker_clock(ctx["launched"], trial.IMPORT_S)
    error = None
    try:
        trial.run_attempt(spec, ctx, dict(a["params"]), trial_id, tune, clock)
    except RuntimeError as e:
        error = str(e)
    out.append({"trial_id": trial_id, "worker_trial": clock.worker_trial, "error": error, "reports": tune.reports,
                "pid": os.getpid()})
print("RESULT " + json.dumps(out))
'''


def _sweep(d: Path, name: str, base_over: dict | None = None, **over) -> str:
    base = json.loads(json.dumps(TINY))
    for k, v in (base_over or {}).items():
        base[k].update(v)
    doc = {"name": name, "description": f"test sweep {name}", "base": base, "resources": {"cpu": 1},
           "checkpoint_interval": 5, "grid": {"router": ["none", "full"], "seed": [0, 1]}, **over}
    p = d / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def _worker(d: Path, attempts: list[dict], env: dict) -> subprocess.Popen:
    job = {"uri": env["MLFLOW_TRACKING_URI"], "attempts": attempts}
    return subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(job)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _result(p: subprocess.Popen) -> list[dict]:
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]
    return json.loads(out.split("RESULT ", 1)[1])


def _losses(reports: list[dict]) -> dict:
    """step -> train/loss of the log points an attempt reported, and its final validation loss."""
    out: dict = {r["step"]: r["train/loss"] for r in reports if r.get("status") == "running"}
    for r in reports:
        if r.get("status") == "finished":
            out["final"] = r["final/val_loss"]
    return out


def _curves(db: Path, experiment: str) -> tuple[object, dict[str, list[tuple[int, float]]]]:
    """The one trial run of an experiment and its loss curves from MLflow."""
    from mlflow.tracking import MlflowClient

    cl = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for r in cl.search_runs([cl.get_experiment_by_name(experiment).experiment_id])
            if r.data.tags.get("sweep_role") == "trial"]
    assert len(runs) == 1, f"{len(runs)} runs of one trial"  # a retry continues its run: no duplicate
    curves = {k: sorted((m.step, m.value) for m in cl.get_metric_history(runs[0].info.run_id, k))
              for k in ("train/loss", "val/loss", "final/val_loss", "train/grad_norm", "trial/wall_s")}
    return runs[0], curves


def _env(d: Path, store: str, **extra) -> dict:
    return sweep_env(d, store, OMP_NUM_THREADS="1", **extra)


def test_a_reused_process_trains_a_trial_and_its_retry_bit_for_bit_like_a_fresh_process(tmp_path):
    d = tmp_path
    # the first trial changes what it can of the process: 2 torch threads (the others inherit the
    # process's 1), another depth, the learned router, another seed
    other = _sweep(d, "other", base_over={"model": {"n_layers": 3}, "train": {"threads": 2}})
    same = _sweep(d, "same")
    params = {"router": "full", "seed": 0}
    marker = d / "fault.marker"
    reused = _worker(d, [
        {"sweep": other, "params": {"router": "full", "seed": 1}, "exp_dir": str(d / "ray-other")},
        {"sweep": same, "params": params, "exp_dir": str(d / "ray-reused")},  # fails after its step-10 checkpoint
        {"sweep": same, "params": params, "exp_dir": str(d / "ray-reused")},  # the retry, from that checkpoint
    ], _env(d, "reused", LIME_FAULT_ONCE=f"{marker}:10:router=full,seed=0"))
    fresh = _worker(d, [{"sweep": same, "params": params, "exp_dir": str(d / "ray-fresh")}], _env(d, "fresh"))
    a, failed, retry = _result(reused)
    (alone,) = _result(fresh)

    assert [a["worker_trial"], failed["worker_trial"], retry["worker_trial"]] == [1, 2, 3]
    assert a["pid"] == failed["pid"] == retry["pid"] != alone["pid"]
    assert a["error"] is None and "injected fault at step 10" in failed["error"] and retry["error"] is None
    assert retry["reports"][0]["start_step"] == 10  # resumed from the checkpoint, not from scratch
    ref = _losses(alone["reports"])
    assert sorted(k for k in ref if k != "final") == [5, 10, 15, 20]
    # bit for bit: the failed attempt up to its fault, the retry from its checkpoint to the end
    assert _losses(failed["reports"]) == {s: ref[s] for s in (5, 10)}
    assert _losses(retry["reports"]) == {s: ref[s] for s in (15, 20, "final")}
    assert _losses(a["reports"])[5] != ref[5]  # the first trial really was another one

    run, curves = _curves(d / "reused.db", "same")
    _, fresh_curves = _curves(d / "fresh.db", "same")
    for key in ("train/loss", "val/loss", "final/val_loss", "train/grad_norm"):
        assert curves[key] == fresh_curves[key], key  # exactly, one value per step
    assert [s for s, _ in curves["train/loss"]] == [5, 10, 15, 20]
    m = run.data.metrics
    for phase in ("process", "import", "prepare", "data", "model", "resume", "mlflow", "to_first_step"):
        assert m[f"startup/{phase}_s"] >= 0, phase
    assert m["startup/worker_trial"] == 3  # the retry's, logged after the failed attempt's (2)
    assert m["startup/resume_s"] > 0 and m["startup/process_s"] == 0
    walls = [v for _, v in curves["trial/wall_s"]]
    assert len(walls) == 2 and 0 < walls[0] < walls[1]  # each attempt adds its time


@pytest.mark.cluster  # a Ray sweep: make test-cluster
def test_a_ray_sweep_reuses_its_workers_and_records_its_start_up_and_wall_time(tmp_path):
    """One trial at a time, three trials: they share one worker process, every trial's curve equals
    the same trial trained alone in this process, one MLflow run per trial with its start-up
    metrics, and the parent run has the sweep's wall time and slots. (A retry under Ray:
    test_tune.py; a retry in a reused process: the test above.)"""
    from mlflow.tracking import MlflowClient

    from orchestrator.engine.trial import Tracking, run_trial
    from orchestrator.sweep.spec import load_spec

    d = tmp_path
    name = "reuse"
    path = _sweep(d, name, base_over={"train": {"threads": 1}}, grid={"router": ["full"], "seed": [0, 1, 2]},
                  max_concurrent=1)
    env = _env(d, "mlflow", LIME_RESULTS=str(d / "results"))
    r = subprocess.run([LIME, "sweep", "run", path], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    spec = load_spec(path)
    ids = [t.trial_id for t in spec.trials()]
    firsts = [(d / "results" / "ray" / name / t / "trial.log").read_text().splitlines()[0] for t in ids]
    assert len({line.split("(pid ")[1].split(",")[0] for line in firsts}) == 1  # one process
    assert [line.rsplit("; ", 1)[1] for line in firsts] == [f"trial {k} of this worker process)" for k in (1, 2, 3)]

    cl = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = cl.search_runs([cl.get_experiment_by_name(name).experiment_id])
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    trials = {x.data.tags["trial_id"]: x for x in runs if x.data.tags.get("sweep_role") == "trial"}
    assert sorted(trials) == sorted(ids)
    pm = {k: float(v) for k, v in parent.data.tags.items() if k.startswith("sweep/")}
    assert pm["sweep/slots"] == 1 and pm["sweep/wall_s"] > 0 and pm["sweep/launches"] == 1
    assert not any(k.startswith("sweep/") for k in parent.data.metrics)  # tags: no chart beside the trials'
    for t in spec.trials():
        run = trials[t.trial_id]
        assert run.data.tags["status"] == "finished"
        curve = sorted((m.step, m.value) for m in cl.get_metric_history(run.info.run_id, "train/loss"))
        cfg = t.config
        cfg.train.checkpoint_dir = str(d / "ref" / t.trial_id)
        ref = run_trial(cfg, tracking=Tracking(enabled=False))
        assert curve == [(h["step"], h["train/loss"]) for h in ref.history if "train/loss" in h], t.trial_id
        m = run.data.metrics
        assert m["final/val_loss"] == ref.final_val_loss
        assert m["startup/to_first_step_s"] > 0 and m["trial/wall_s"] > 0 and "startup/mlflow_s" in m
        assert m["startup/worker_trial"] == ids.index(t.trial_id) + 1
        assert (m["startup/process_s"] > 0) == (t.trial_id == ids[0])  # only the fresh worker's first trial
