"""A long outage of the tracking server under a running trial (issue 30): a real `mlflow server`
is stopped for ten times the client's retry window while a local sweep's trial trains, then
started again on the same port and store. The trial must keep training, lose no metric, store
no step twice, spend none of its retries, and the console must name the outage and its end.

The client's retry window is 2 s here (``LIME_TRACKING_RETRY_S``, and MLflow's own retry
settings set to the same, so that the code before the outbox meets the same window): an outage
of 20 s outlasts it tenfold."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.orchestrator.cluster.conftest import BIN, clean_env
from tests.sweeps import tiny
from tools.procs import Proc, free_port, wait_http

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
OUTAGE_S, RETRY_S, STEPS, LOG = 20.0, 2, 4000, 10


def _server(root: Path, port: int, n: int) -> Proc:
    p = Proc([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
              "--artifacts-destination", str(root / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port),
              "--workers", "1"], root / f"mlflow-server-{n}.log", clean_env(root / "home"))
    wait_http(f"http://127.0.0.1:{port}/health", 120, p)
    return p


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _trial_run(uri: str, name: str):
    cl = _client(uri)
    exp = cl.get_experiment_by_name(name)
    runs = [r for r in cl.search_runs([exp.experiment_id]) if r.data.tags.get("sweep_role") == "trial"] if exp else []
    return cl, runs


def test_a_tracking_outage_longer_than_the_retry_window_loses_nothing_and_spends_no_retry(tmp_path):
    root, name = tmp_path, "outage"
    (root / "home").mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _server(root, port, 1)
    base = tiny(train={"steps": STEPS, "log_interval": LOG, "eval_interval": 500, "eval_batches": 2})
    sweep = root / f"{name}.yaml"
    sweep.write_text(yaml.safe_dump({"name": name, "description": "outage probe", "base": base,
                                     "resources": {"cpu": 1}, "checkpoint_interval": 500}, sort_keys=False))
    env = clean_env(root / "home", MLFLOW_TRACKING_URI=uri, LIME_RESULTS=str(root / "results"),
                    LIME_CACHE=str(root / "cache"), LIME_TRACKING_RETRY_S=str(RETRY_S),
                    MLFLOW_HTTP_REQUEST_MAX_RETRIES="2", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1")
    console = open(root / "console.log", "w")
    driver = subprocess.Popen([LIME, "sweep", "run", str(sweep)], stdout=console, stderr=subprocess.STDOUT,
                              cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None:  # until the trial has stored a few steps
            _, runs = _trial_run(uri, name)
            if runs and len(_client(uri).get_metric_history(runs[0].info.run_id, "train/loss")) >= 5:
                break
            time.sleep(0.5)
        assert driver.poll() is None, (root / "console.log").read_text()[-3000:]
        stopped = time.monotonic()
        server.stop()
        time.sleep(OUTAGE_S)
        server = _server(root, port, 2)
        outage = time.monotonic() - stopped
        rc = driver.wait(600)
    finally:
        if driver.poll() is None:
            driver.kill()
        console.close()
        server.stop()
    server = _server(root, port, 3)
    try:
        out = (root / "console.log").read_text()
        assert rc == 0, out[-3000:]
        cl, runs = _trial_run(uri, name)
        assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].data.tags["status"] == "finished"
        rid = runs[0].info.run_id
        # no step lost, none twice: every log point of every series, once
        every = list(range(LOG, STEPS + 1, LOG))
        for key in ("train/loss", "train/lr", "perf/step_time_ms", "train/tokens_per_s"):
            assert sorted(m.step for m in cl.get_metric_history(rid, key)) == every, key
        assert sorted(m.step for m in cl.get_metric_history(rid, "val/loss")) == [*range(500, STEPS, 500), STEPS]
        for key in runs[0].data.metrics:
            steps = [m.step for m in cl.get_metric_history(rid, key)]
            assert len(steps) == len(set(steps)), key
        # no retry spent: one attempt, and the console says so
        trial_log = next((root / "results" / "ray" / name).glob("*/trial.log")).read_text()
        assert trial_log.count("=== ") == 1 and "retry" not in out and "FAILED" not in out
        assert "unreachable (sending metrics" in trial_log
        assert re.search(r"MLflow unreachable from base for \d+ s: it keeps training", out), out[-3000:]
        assert f"MLflow at {uri} unreachable from the driver (" in out, out[-3000:]  # the driver's own watch
        handed = re.search(r"the trial ends and frees its slot; \d+ metrics and calls \(its run's end included\) go "
                           r"to a background sender \((\S+\.pkl)\.log\)", trial_log)
        if handed:  # a busy machine: the trial ended before the server was back (issue 39: it frees its slot)
            assert "waiting for the background senders of 1 trial(s) that ended during an MLflow outage" in out
            sender = Path(handed.group(1) + ".log")
            end = time.time() + 30
            while time.time() < end and "everything sent; MLflow run " not in sender.read_text():
                time.sleep(0.2)
            assert "everything sent; MLflow run " in sender.read_text(), sender.read_text()
            noticed, kept = None, None
        else:  # the trial saw the server come back: its log, the console, the driver's watch say so
            assert " back after " in trial_log
            m = re.search(r"MLflow answers base again after (\d+) s: (\d+) kept metrics sent in order", out)
            assert m, out[-3000:]
            noticed, kept = int(m.group(1)), int(m.group(2))
            assert kept > 0 and OUTAGE_S - 5 <= noticed <= outage + 10
            m = re.search(rf"MLflow at {re.escape(uri)} answers again after (\d+) s", out)
            assert m and OUTAGE_S - 10 <= int(m.group(1)) <= outage + 10, out[-3000:]
        print(json.dumps({"outage_s": round(outage, 1), "outage_seen_by_trial_s": noticed, "metrics_kept_and_sent":
                          kept, "handed_off": bool(handed), "steps_lost": 0, "duplicate_steps": 0,
                          "retries_spent": 0}))
    finally:
        server.stop()


def test_a_trial_that_ends_during_an_outage_fails_with_one_line_and_its_resume_loses_nothing(tmp_path, monkeypatch):
    """The final flush waits ``LIME_TRACKING_WAIT_S`` (3 s here), then the trial fails with a clear
    line, its last checkpoint written; the resume, with the server back, stores what it lacked."""
    from orchestrator.core.outbox import TrackingUnavailable
    from orchestrator.engine.trial import Tracking, run_trial
    from orchestrator.engine.trial_config import TrialConfig

    (tmp_path / "home").mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    for k, v in {"MLFLOW_TRACKING_URI": uri, "LIME_TRACKING_RETRY_S": "1", "LIME_TRACKING_WAIT_S": "3",
                 "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}.items():
        monkeypatch.setenv(k, v)
    servers = [_server(tmp_path, port, 1)]
    ck = tmp_path / "ck"
    cfg = tiny(train={"steps": 60, "log_interval": 5, "eval_interval": 30, "checkpoint_interval": 30,
                      "checkpoint_dir": str(ck), "threads": 1})

    def stop_at_40(step, metrics, ckpt):
        if step == 40 and servers[0] is not None:
            servers[0].stop()
            servers[0] = None

    try:
        with pytest.raises(TrackingUnavailable) as e:
            run_trial(TrialConfig.from_dict(cfg), tracking=Tracking(experiment="ends-away"), on_log=stop_at_40)
        msg = str(e.value)
        assert msg.startswith(f"MLflow at {uri} unreachable")
        assert "$LIME_TRACKING_WAIT_S" in msg and "\n" not in msg
        import torch

        state = torch.load(ck / "checkpoint.pt", weights_only=True)
        assert state["step"] == 60 and state["history"][-1].get("final/val_loss") is not None  # intact, final
        servers[0] = _server(tmp_path, port, 2)
        monkeypatch.setenv("LIME_TRACKING_WAIT_S", "120")  # the resume sends everything, at a busy server's pace
        res = run_trial(TrialConfig.from_dict(cfg), tracking=Tracking(experiment="ends-away"), resume=ck)
        cl = _client(uri)
        run = cl.get_run(res.run_id)
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "finished"
        assert sorted(m.step for m in cl.get_metric_history(res.run_id, "train/loss")) == list(range(5, 61, 5))
        assert sorted(m.step for m in cl.get_metric_history(res.run_id, "val/loss")) == [30, 60]
        assert [m.step for m in cl.get_metric_history(res.run_id, "final/val_loss")] == [0]
        runs = cl.search_runs([cl.get_experiment_by_name("ends-away").experiment_id])
        assert len(runs) == 1
    finally:
        if servers[0] is not None:
            servers[0].stop()
