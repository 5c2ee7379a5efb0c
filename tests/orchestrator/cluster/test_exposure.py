"""What a local `lime sweep run` exposes (issue 30): every port its Ray opens listens on the
loopback interface only (read from the processes' own sockets in /proc), and the Ray token it
leaves in ~/.ray is readable by its user alone."""
from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.orchestrator.cluster.conftest import clean_env
from tests.sweeps import tiny
from tools.procs import descendants, listening

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")


def _loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    return a.is_loopback or (a.version == 6 and a.ipv4_mapped is not None and a.ipv4_mapped.is_loopback)


def test_a_local_sweeps_ray_listens_on_loopback_only_and_its_token_is_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    sweep = tmp_path / "local.yaml"
    sweep.write_text(yaml.safe_dump({"name": "local", "description": "exposure probe", "resources": {"cpu": 1},
                                     "base": tiny(train={"steps": 3000, "log_interval": 10, "eval_interval": 1000})},
                                    sort_keys=False))
    env = clean_env(home, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db", LIME_RESULTS=str(tmp_path / "r"))
    log = open(tmp_path / "console.log", "w")
    p = subprocess.Popen([LIME, "sweep", "run", str(sweep)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                         start_new_session=True)
    try:
        trial_log = tmp_path / "r" / "ray" / "local" / "base" / "trial.log"
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            if trial_log.is_file() and "step 20:" in trial_log.read_text():
                break
            time.sleep(0.2)
        assert p.poll() is None, (tmp_path / "console.log").read_text()[-3000:]
        socks = listening(descendants(p.pid))
        names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid, _, _ in socks}
    finally:
        p.terminate()
        p.wait(120)
        log.close()
    assert {"gcs_server", "raylet"} <= set(names.values()), names  # Ray's servers were seen
    exposed = [(names[pid], ip, port) for pid, ip, port in socks if not _loopback(ip)]
    assert not exposed, exposed
    token = home / ".ray" / "auth_token"
    assert token.is_file() and token.stat().st_mode & 0o777 == 0o600
