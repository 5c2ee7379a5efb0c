"""An outage of the tracking server while a sweep's trials start (issue 39): a real `mlflow server`
is stopped as soon as the driver has opened the sweep's record, before its trials look up their runs,
and started again (same port and store) only once both trials, one at a time, have trained to
their end. The trials must train anyway (their runs are created when the server returns, with
everything sent in order), say so truthfully in their logs, free their slot at their end (the
second trial starts during the outage), and the console must name the outage within 30 s.

Loopback only; a tiny model; the client's retry window is 2 s (``LIME_TRACKING_RETRY_S``)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.orchestrator.cluster.conftest import clean_env
from tests.orchestrator.cluster.test_outage import _client, _server
from tests.sweeps import tiny
from tools.procs import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
STEPS, LOG = 200, 10
TRIALS = ("seed=1", "seed=2")


def _log(root: Path, name: str, trial: str) -> str:
    p = root / "results" / "ray" / name / trial / "trial.log"
    return p.read_text() if p.is_file() else ""


def test_trials_that_start_during_an_outage_train_free_their_slots_and_are_recorded_when_it_ends(tmp_path):
    root, name = tmp_path, "outage-start"
    (root / "home").mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _server(root, port, 1)
    base = tiny(train={"steps": STEPS, "log_interval": LOG, "eval_interval": 100, "eval_batches": 2})
    sweep = root / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({"name": name, "description": "outage at the start", "base": base,
                                     "grid": {"seed": [1, 2]}, "max_concurrent": 1, "resources": {"cpu": 1},
                                     "checkpoint_interval": 100}, sort_keys=False))
    env = clean_env(root / "home", MLFLOW_TRACKING_URI=uri, LIME_RESULTS=str(root / "results"),
                    LIME_CACHE=str(root / "cache"), LIME_TRACKING_RETRY_S="2", LIME_TRACKING_WAIT_S="300",
                    MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1")
    console_path = root / "console.log"
    console = open(console_path, "w")
    driver = subprocess.Popen([LIME, "sweep", "run", str(sweep)], stdout=console, stderr=subprocess.STDOUT,
                              cwd=ROOT, env=env, start_new_session=True)
    said_after = None
    try:
        deadline = time.time() + 180
        # the driver has opened the sweep's record (its first line) and starts Tune: the trials' workers
        # are still starting (the trainable's imports take seconds), so their lookups meet the outage
        while time.time() < deadline and driver.poll() is None and f"sweep {name}: 2 trials" not in \
                console_path.read_text():
            time.sleep(0.05)
        assert driver.poll() is None, console_path.read_text()[-3000:]
        server.stop()
        stopped = time.monotonic()
        ended = "the trial ends and frees its slot"
        deadline = time.time() + 240
        while time.time() < deadline and driver.poll() is None:
            if said_after is None and f"MLflow at {uri} unreachable from the driver (" in console_path.read_text():
                said_after = time.monotonic() - stopped
            if all(ended in _log(root, name, t) for t in TRIALS):
                break
            time.sleep(0.2)
        outage = time.monotonic() - stopped
        server = _server(root, port, 2)
        rc = driver.wait(300)
    finally:
        if driver.poll() is None:
            driver.kill()
        console.close()
    try:
        out = console_path.read_text()
        assert rc == 0, out[-3000:]
        assert said_after is not None and said_after <= 30, (said_after, out[-3000:])
        for t in TRIALS:
            log = _log(root, name, t)
            # the truth at the start: the trial trains without its server, and says so
            assert re.search(rf"MLflow at {re.escape(uri)} unreachable \(finding the trial's run: .+\); the trial "
                             "starts training without it: its run is created when the server answers, and "
                             "everything is sent then, in order\n", log), log[-3000:]
            assert "waits for it" not in log and f"finished at step {STEPS}" in log
            # and at its end: what is left goes to a background sender, the slot is freed
            m = re.search(rf"MLflow at {re.escape(uri)} unreachable: the trial ends and frees its slot; (\d+) metrics "
                          r"and calls \(its run's end included\) go to a background sender \((\S+\.pkl)\.log\), which "
                          r"sends them in order when the server answers \(at most 300 s: \$LIME_TRACKING_WAIT_S\)\n",
                          log)
            assert m and int(m.group(1)) > 0, log[-3000:]
            sender = Path(m.group(2) + ".log")
            end = time.time() + 30  # the driver saw the run end: the sender's last line follows it
            while time.time() < end and "everything sent; MLflow run " not in sender.read_text():
                time.sleep(0.2)
            assert "everything sent; MLflow run " in sender.read_text() and not Path(m.group(2)).exists(), \
                sender.read_text()
        # the first trial ended and freed its slot during the outage, and the second started in it
        # (its log's first line above: its lookup met the outage); the console says where the runs are
        assert out.index(f"done   {TRIALS[0]}: finished, final/val_loss ") < out.index(f"start  {TRIALS[1]}"), out
        assert out.count("MLflow run not created yet: a background sender creates it when the server answers") == 2
        assert "Retrying (Retry(" not in out  # urllib3's line per retried call: the outage is said once
        assert "waiting for the background senders of 2 trial(s) that ended during an MLflow outage" in out
        assert "retry" not in out and "FAILED" not in out
        cl = _client(uri)
        exp = cl.get_experiment_by_name(name)
        runs = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get("sweep_role") == "trial"]
        assert sorted(r.data.tags["trial_id"] for r in runs) == list(TRIALS)
        for r in runs:  # everything, once, in a run created after the outage
            assert r.info.status == "FINISHED" and r.data.tags["status"] == "finished"
            assert r.data.params["lr"] and "checkpoint_dir" in r.data.tags
            assert sorted(m.step for m in cl.get_metric_history(r.info.run_id, "train/loss")) == \
                list(range(LOG, STEPS + 1, LOG))
            assert [m.step for m in cl.get_metric_history(r.info.run_id, "final/val_loss")] == [0]
            assert {a.path for a in cl.list_artifacts(r.info.run_id)} >= {"config.yaml", "router_weights.npz"}
        print({"outage_s": round(outage, 1), "console_named_it_after_s": round(said_after, 1)})
    finally:
        server.stop()
