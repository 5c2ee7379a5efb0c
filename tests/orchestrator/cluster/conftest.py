"""Real parts for the cluster tests: an `mlflow server` with an artifact store, and a Ray cluster
of two nodes on this machine (`ray start --head` and `ray start --address`), each with its own
temp dir, CPU count and custom resource, started as docs/CLUSTER.md says.

Every process is started in its own session and stopped by its process group id (SIGTERM, then
SIGKILL after a grace period), plus any process whose command line names the fixture's private
temp dir (Ray's workers); nothing else on the machine is touched. Ports are free ports picked
here; HOME is a private folder holding the Ray token, as after any local `lime sweep run`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tools.procs import Proc, free_port, wait_http

BIN = Path(sys.executable).parent
NODE_ID = re.compile(r"_([0-9a-f]{56})$")


def clean_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "LIME_"))}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@dataclass
class Cluster:
    root: Path
    home: Path
    address: str  # the head's GCS address, host:port
    mlflow_uri: str
    artifacts: Path
    node_ids: dict[str, str] = field(default_factory=dict)  # "head"/"worker" -> Ray node id

    def env(self, **extra: str) -> dict:
        return clean_env(self.home, MLFLOW_TRACKING_URI=self.mlflow_uri, LIME_RESULTS=str(self.root / "results"),
                         LIME_CACHE=str(self.root / "cache"), **extra)


def _node_id(temp: Path) -> str:
    for f in (temp / "session_latest").glob("*_port_*"):
        m = NODE_ID.search(f.name)
        if m:
            return m.group(1)
    raise RuntimeError(f"no node id in {temp}/session_latest")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """MLflow server + Ray head (1 CPU, resource lime_head) + Ray worker node (1 CPU, lime_worker)."""
    root = tmp_path_factory.mktemp("cluster")
    home = root / "home"
    home.mkdir()
    procs: list[Proc] = []
    temp_head = temp_worker = Path("/nonexistent")
    try:
        # the state after any local sweep: ~/.ray/auth_token exists
        subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], env=clean_env(home), check=True,
                       capture_output=True, timeout=120)
        port = free_port()
        server = Proc([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                       "--artifacts-destination", str(root / "mlartifacts"), "--host", "127.0.0.1",
                       "--port", str(port), "--workers", "1"], root / "mlflow-server.log", clean_env(home))
        procs.append(server)
        gcs = free_port()
        temp_head, temp_worker = Path(f"/tmp/lime-ct-{gcs}-h"), Path(f"/tmp/lime-ct-{gcs}-w")  # short: socket paths
        head = Proc([str(BIN / "ray"), "start", "--head", "--port", str(gcs), "--num-cpus", "1",
                     "--resources", json.dumps({"lime_head": 1}), "--temp-dir", str(temp_head),
                     "--include-dashboard", "false", "--dashboard-agent-listen-port", str(free_port()),
                     "--disable-usage-stats", "--block"], root / "ray-head.log", clean_env(home), str(temp_head))
        procs.append(head)
        head.wait_for("Ray runtime started", 120)
        worker = Proc([str(BIN / "ray"), "start", "--address", f"127.0.0.1:{gcs}", "--num-cpus", "1",
                       "--resources", json.dumps({"lime_worker": 1}), "--temp-dir", str(temp_worker),
                       "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats", "--block"],
                      root / "ray-worker.log", clean_env(home, RAY_AUTH_MODE="token"), str(temp_worker))
        procs.append(worker)
        worker.wait_for("Ray runtime started", 120)
        wait_http(f"http://127.0.0.1:{port}/health", 120, server)
        c = Cluster(root=root, home=home, address=f"127.0.0.1:{gcs}", mlflow_uri=f"http://127.0.0.1:{port}",
                    artifacts=root / "mlartifacts")
        c.node_ids = {"head": _node_id(temp_head), "worker": _node_id(temp_worker)}
        yield c
    finally:
        for p in reversed(procs):
            p.stop()
        for t in (temp_head, temp_worker):
            shutil.rmtree(t, ignore_errors=True)
