"""Sweeps on a local Ray through the real `lime` CLI: ASHA stops a clearly bad trial (its
objective is val/loss until final/val_loss exists), and diverged trials end `diverged`, are not
retried, let the sweep exit 0 and are listed by the report."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sweeps import sweep_env, tiny

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
TINY = tiny(train={"steps": 40, "log_interval": 10})


@pytest.fixture
def env(tmp_path):
    return sweep_env(tmp_path)


def _run(tmp_path: Path, env: dict, name: str, **doc) -> subprocess.CompletedProcess:
    d = {"name": name, "description": f"test {name}", "base": json.loads(json.dumps(TINY)),
         "resources": {"cpu": 1}, "checkpoint_interval": 10, **doc}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=800)


def _trials(env: dict, name: str) -> list:
    from mlflow.tracking import MlflowClient

    cl = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = cl.get_experiment_by_name(name)
    runs = cl.search_runs([exp.experiment_id], max_results=100)
    return cl, [r for r in runs if r.data.tags.get("sweep_role") == "trial"]


def test_asha_stops_a_trial_with_a_clearly_bad_lr(tmp_path, env):
    name = "asha-bad-lr"
    # six samples of two learning rates, one at a time: from the second sample of the good lr
    # on, every trial of the bad one (lr 1e-6 barely moves the loss) is below the rung's cut
    base = json.loads(json.dumps(TINY))
    base["optim"]["min_lr"] = 1.0e-7
    r = _run(tmp_path, env, name, base=base, max_concurrent=1,
             search={"metric": "final/val_loss", "num_samples": 6, "seed": 0,
                     "space": {"lr": {"choice": [3.0e-3, 1.0e-6]}},
                     "asha": {"grace_period": 10, "reduction_factor": 2}})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "All-NaN" not in r.stdout + r.stderr
    cl, trials = _trials(env, name)
    assert len(trials) == 6
    lr = {t.info.run_id: float(t.data.params["optim.lr"]) for t in trials}
    assert set(lr.values()) == {3.0e-3, 1.0e-6}
    stopped = [t for t in trials if t.data.tags["status"] == "stopped"]
    assert stopped, [(t.data.tags["trial_id"], t.data.tags["status"]) for t in trials]
    for t in stopped:
        assert lr[t.info.run_id] == 1.0e-6 and t.info.status == "KILLED"
        last = max(m.step for m in cl.get_metric_history(t.info.run_id, "train/loss"))
        assert last < 40 and "final/val_loss" not in t.data.metrics
    assert all(t.data.tags["status"] == "finished" for t in trials if lr[t.info.run_id] == 3.0e-3)


def test_diverged_trials_end_diverged_unretried_exit_0_and_are_in_the_report(tmp_path, env):
    name = "diverge-sweep"
    base = json.loads(json.dumps(TINY))
    base["optim"]["grad_clip"] = 0.0
    base["train"]["log_interval"] = 1  # the first step (before any update) is finite everywhere
    r = _run(tmp_path, env, name, base=base, resources={"cpu": 0.5},
             grid={"router": ["none", "full"], "lr": [3.0e-3, 1000.0]})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cl, trials = _trials(env, name)
    status = {t.data.tags["trial_id"]: t for t in trials}
    assert sorted(status) == ["router=full,lr=0.003", "router=full,lr=1000.0", "router=none,lr=0.003",
                              "router=none,lr=1000.0"]
    for tid, t in status.items():
        want = "diverged" if tid.endswith("lr=1000.0") else "finished"
        assert t.data.tags["status"] == want and t.info.status == "FINISHED", tid
        log = (tmp_path / "results" / "ray" / name / tid / "trial.log").read_text()
        assert log.count("=== ") == 1 and "Traceback" not in log, tid  # one attempt: not retried
        if want == "diverged":
            hist = cl.get_metric_history(t.info.run_id, "train/loss")
            assert any(math.isfinite(m.value) for m in hist) and "final/val_loss" not in t.data.metrics
    assert "retry" not in r.stdout
    rep = subprocess.run([LIME, "report", name, "--out", str(tmp_path / "rep")], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = (tmp_path / "rep" / name / "report.md").read_text()
    section = text.split("## Failed, diverged and incomplete trials", 1)[1].split("\n## ", 1)[0]
    for tid in ("router=full,lr=1000.0", "router=none,lr=1000.0"):
        assert tid in section and "diverged" in section
