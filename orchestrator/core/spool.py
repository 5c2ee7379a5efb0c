"""A finished trial's tracking, sent in the background when the MLflow server is away (issue 39).

A sweep trial that ends during an outage would hold its Ray slot until the server answers (the
final flush: its last metrics, artifacts and the run's end). Instead its ``RunLogger`` waits at
most one call's retry window, then ``write``s what it has not sent (metrics and calls, in order:
``orchestrator.core.outbox.Op``) to a spool file in the trial's folder and ``launch``es this
module on it: a process of its own, outside the Ray worker's process tree (a worker's children
end with it), that sends everything in order when the server answers, waiting at most
``$LIME_TRACKING_WAIT_S``, and removes the file once all is sent. Its lines go to
``<spool file>.log``. The sweep's driver waits for these trials' runs to end before its summary
(``orchestrator.sweep.driver``). A spool file left by a sender that gave up is sent by
``python -m orchestrator.core.spool <file>``.
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.core.outbox import TrackingUnavailable, wait_bound
from orchestrator.core.tracking import RunLogger

ROOT = Path(__file__).resolve().parents[2]


def write(folder: Path, state: dict) -> Path:
    """The spool file of ``state`` (uri, run id or None, the items left), written whole."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"outbox-{os.getpid()}-{time.time_ns()}.pkl"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(state))
    tmp.replace(path)
    return path


def launch(path: Path) -> None:
    """Start the sender of ``path``: this module, which forks once more and lets its first process
    end, so the sender is no child of this process (Ray ends a worker's children with it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    with open(f"{path}.log", "a") as log:
        p = subprocess.Popen([sys.executable, "-m", "orchestrator.core.spool", str(path)], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT, env=env,
                             start_new_session=True)
    try:
        p.wait(60)  # the first process ends once it has forked; its child sends
    except subprocess.TimeoutExpired:  # a slow machine: it ends later, on its own
        pass


def send(path: Path) -> int:
    """Send a spool file (0: everything sent, the file removed; 1: the server stayed away)."""
    state = pickle.loads(path.read_bytes())
    logger = RunLogger.of_spool(state)
    print(f"sending {len(state['items'])} metrics and calls to MLflow at {state['uri']}", flush=True)
    try:
        logger.outbox.close(wait_bound())
    except TrackingUnavailable as e:
        logger.outbox.detach()  # its thread ends; the file keeps everything
        print(f"{e}; {path} is kept: `python -m orchestrator.core.spool {path}` sends it", flush=True)
        return 1
    folders = {Path(op.args[0]).parents[1] for op in state["items"] if getattr(op, "name", "") == "artifact"}
    for f in folders:
        shutil.rmtree(f, ignore_errors=True)
    path.unlink(missing_ok=True)
    print(f"everything sent; MLflow run {logger.run_id}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if os.fork() > 0:  # the launching process's child: ends now, so the sender is nobody's child
        os._exit(0)
    return send(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
