"""A trial whose worker process is killed mid-training (issue 39): the chaos of a cluster, not the
trial's error. The same launch retries it from its last checkpoint without spending its retry
budget: the sweep allows none (``max_failures: 0``), so a retry counted against it would leave
the trial FAILED until a relaunch. Local Ray on loopback, a tiny model."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.sweeps import sweep_env, tiny

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
STEPS, LOG, CKPT = 600, 10, 100
TRIAL = "seed=1"


def test_a_killed_worker_resumes_from_its_checkpoint_in_the_same_launch_without_spending_a_retry(tmp_path):
    name = "lost-worker"
    base = tiny(train={"steps": STEPS, "log_interval": LOG, "eval_interval": 500, "eval_batches": 2})
    sweep = tmp_path / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({"name": name, "description": "a worker killed mid-trial", "base": base,
                                     "grid": {"seed": [1]}, "resources": {"cpu": 1}, "max_failures": 0,
                                     "checkpoint_interval": CKPT}, sort_keys=False))
    env = sweep_env(tmp_path)
    trial_dir = tmp_path / "results" / "ray" / name / TRIAL
    console_path = tmp_path / "console.log"
    console = open(console_path, "w")
    driver = subprocess.Popen([LIME, "sweep", "run", str(sweep)], stdout=console, stderr=subprocess.STDOUT,
                              cwd=ROOT, env=env, start_new_session=True)
    killed_at = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and driver.poll() is None:
            log = (trial_dir / "trial.log").read_text() if (trial_dir / "trial.log").is_file() else ""
            steps = [int(s) for s in re.findall(r"\nstep (\d+):", log)]
            # a checkpoint Ray has kept, and training past it: the kill costs steps after it
            if list(trial_dir.glob("checkpoint_*")) and steps and steps[-1] >= 2 * CKPT + 2 * LOG:
                pid = int(re.search(r"\(pid (\d+), Ray node", log).group(1))
                os.kill(pid, signal.SIGKILL)  # the worker process dies, as on a lost node
                killed_at = steps[-1]
                break
            time.sleep(0.05)
        assert killed_at is not None and killed_at < STEPS, console_path.read_text()[-3000:]
        rc = driver.wait(400)
    finally:
        if driver.poll() is None:
            driver.kill()
        console.close()
    out = console_path.read_text()
    log = (trial_dir / "trial.log").read_text()
    assert rc == 0, out[-3000:]
    # the console: a lost worker, no retry spent, and where the next attempt continues (the attempt's word)
    assert (f"retry  {TRIAL}: its worker was lost (a killed process or node; 1 of 10 allowed, "
            "$LIME_LOST_WORKER_RETRIES), no retry of its 0 spent: it has a checkpoint to continue from") in out, out
    m = re.search(rf"resume {re.escape(TRIAL)}: continues from its checkpoint at step (\d+)\n", out)
    assert m, out[-3000:]
    resumed = int(m.group(1))
    assert resumed >= CKPT and resumed % CKPT == 0 and killed_at - resumed < CKPT + 2 * LOG
    assert "FAILED" not in out and f"done   {TRIAL}: finished" in out
    assert log.count("=== ") == 2 and f"resuming from step {resumed};" in log and f"finished at step {STEPS}" in log
    # one MLflow run, every step once
    from mlflow.tracking import MlflowClient

    cl = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = cl.get_experiment_by_name(name)
    runs = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get("sweep_role") == "trial"]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert sorted(m.step for m in cl.get_metric_history(runs[0].info.run_id, "train/loss")) == \
        list(range(LOG, STEPS + 1, LOG))
    print({"killed_at_step": killed_at, "resumed_from_step": resumed, "steps_lost": killed_at - resumed})
