"""MLflow tracking (docs/ARCHITECTURE.md, "Tracking").

- The store is ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db`` in the working directory (the
  file store is deprecated). A new sqlite database is initialised once, under a file lock, before
  any concurrent writer: two processes migrating a fresh database race.
- Only ``MlflowClient`` is used, never the fluent ``set_experiment``/``start_run``: in an
  orchestrator process those export ``MLFLOW_EXPERIMENT_ID`` and hijack later runs.
- A ``RunLogger`` keeps one run for a trial's whole life; metrics are sent in batches in the
  background and kept while the server is away (``orchestrator.core.outbox``).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lime_arch.errors import ConfigError
from orchestrator.core import exposure, outbox
from orchestrator.core.dashboard import EXPERIMENT_TAGS
from orchestrator.core.record import PARENT_RUN, end_run
from orchestrator.core.status import TrialStatus

for _name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent"):
    logging.getLogger(_name).setLevel(logging.WARNING)
# MLflow prints "View run ... at" / "View experiment at" (with emoji) whenever a run on a server
# ends: once per trial in a sweep, and to the experiment's GenAI overview. The CLI prints its own
# links to the runs view (orchestrator.core.dashboard).
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
exposure.quiet_telemetry()  # before MLflow reads its configuration: no client telemetry

DEFAULT_URI = "sqlite:///mlflow.db"


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        # make a relative sqlite path absolute, so Ray workers in other folders share one store
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def client(uri: str | None = None):
    from mlflow.tracking import MlflowClient

    uri = uri or tracking_uri()
    init_store(uri)
    return MlflowClient(tracking_uri=uri)


def missing_store(uri: str | None = None) -> Path | None:
    """The path of a local store (sqlite database, or file store folder) that does not exist;
    None for one that does and for a server."""
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        return None if path.is_file() else path
    if uri.startswith("file:") or ":" not in uri:  # a file store (a plain path is one too)
        path = Path(urlparse(uri).path if uri.startswith("file:") else uri)
        return None if path.is_dir() else path
    return None


NO_LOG = "or --no-log"  # the way out of a command that logs to a run, unless it says another


def existing_client(what: str, uri: str | None = None, *, instead: str = NO_LOG):
    """A client of a store that must already exist because ``what`` (a run id, a sweep) is looked
    up in it: a local store that is not there is one ConfigError line, and nothing is created
    (``client()`` would create the folder and a new database). ``instead``: the line's other way
    out (a command without ``--no-log`` names its own)."""
    uri = uri or tracking_uri()
    path = missing_store(uri)
    if path is not None:
        raise ConfigError(f"{what}: no MLflow store at {path} (nothing was created); set MLFLOW_TRACKING_URI to "
                          f"the store the run was logged to, {instead}")
    return client(uri)


def existing_run(run_id: str, cl=None, *, instead: str = NO_LOG):
    """The run ``run_id`` of the store (which must exist: ``existing_client``), or one ConfigError
    line: a command that logs to a run checks it before its work."""
    cl = cl or existing_client(f"run {run_id}", instead=instead)
    try:
        return cl.get_run(run_id)
    except Exception:  # noqa: BLE001 - deleted, mistyped, or of another store
        raise ConfigError(f"run {run_id}: not a run of the MLflow store {getattr(cl, 'tracking_uri', '')} "
                          f"(set MLFLOW_TRACKING_URI, {instead})") from None


_initialised: set[str] = set()


def init_store(uri: str) -> None:
    """Create (migrate) a new sqlite store once, under an exclusive lock."""
    if uri in _initialised or not uri.startswith("sqlite:"):
        _initialised.add(uri)
        return
    path = Path(uri[len("sqlite:///"):])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # runs the migrations
        fcntl.flock(lock, fcntl.LOCK_UN)
    _initialised.add(uri)


@contextlib.contextmanager
def quiet_downloads() -> Iterator[None]:
    """MLflow draws a progress bar per downloaded artifact; not in a report's output."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    old = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def experiment_id(name: str, cl=None) -> str:
    cl = cl or client()
    exp = cl.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    art = None
    uri = cl.tracking_uri if hasattr(cl, "tracking_uri") else tracking_uri()
    if str(uri).startswith("sqlite:"):  # keep artifacts next to the database, not in ./mlruns
        art = (Path(str(uri)[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    try:
        # a model training experiment: MLflow 3's UI opens it on its runs, not the GenAI overview
        return cl.create_experiment(name, artifact_location=art, tags=EXPERIMENT_TAGS)
    except Exception:  # noqa: BLE001 - created concurrently by another process
        return cl.get_experiment_by_name(name).experiment_id


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return out


class RunLogger:
    """One MLflow run: created, or continued when ``run_id`` is given (retries, resumes).

    Metrics go through an ``Outbox`` (``orchestrator.core.outbox``): sent in the background, in
    order, kept while the server is away; the calls that must reach the server wait for it (at
    most ``$LIME_TRACKING_WAIT_S``). No step of a key is stored twice: a continued run skips the
    steps its server has (a re-attempt recomputes, or replays from its checkpoint, steps an
    earlier attempt may have sent), and every run skips a step it sent already."""

    def __init__(self, experiment: str, *, run_id: str | None = None, run_name: str | None = None,
                 tags: dict[str, Any] | None = None, parent_run_id: str | None = None, uri: str | None = None):
        outbox.apply_retry_window()
        self.uri = uri or tracking_uri()
        self.health = outbox.health()
        self.health.uri = self.uri
        self.client = client(self.uri)
        self._resumed = run_id is not None
        self._logged: dict[str, int] = {}  # the last step stored, per key
        if run_id is not None:
            self.run_id = run_id
            self._patient(lambda: self.client.update_run(run_id, status="RUNNING"), "reopening the run")
        else:
            t = {k: str(v) for k, v in (tags or {}).items()}
            if parent_run_id:
                t[PARENT_RUN] = parent_run_id
            run = self._patient(lambda: self.client.create_run(experiment_id(experiment, self.client),
                                                               run_name=run_name, tags=t), "creating the run")
            self.run_id = run.info.run_id
        self.outbox = outbox.Outbox(self._send, self.health)

    def _patient(self, fn, what: str, wait: float | None = None):
        return outbox.patient(fn, what, self.health, wait)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self._patient(lambda k=k, v=v: self.client.set_tag(self.run_id, k, str(v)), "setting a tag")

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self._patient(lambda: self.client.get_run(self.run_id), "reading the run").data.params
        items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items() if k not in existing]
        for i in range(0, len(items), 100):
            self._patient(lambda i=i: self.client.log_batch(self.run_id, params=items[i:i + 100]), "logging params")

    def log_metrics(self, metrics: dict[str, float], step: int, flush: bool = False) -> None:
        """Queue the metrics of ``step`` (never waits for the server; ``flush`` is kept for callers:
        the outbox sends continuously)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.outbox.put([Metric(k, float(v), ts, step) for k, v in metrics.items()])

    def _send(self, batch: list) -> None:
        """The outbox's sender (its thread): the batch less the steps already stored."""
        fresh, last = [], {}
        for m in batch:
            if m.step > last.get(m.key, self._last_logged_step(m.key)):
                fresh.append(m)
                last[m.key] = m.step
        if fresh:
            self.client.log_batch(self.run_id, metrics=fresh)
        self._logged.update(last)  # only once stored: a batch that failed is sent again whole

    def _last_logged_step(self, key: str) -> int:
        if key not in self._logged:
            hist = self.client.get_metric_history(self.run_id, key) if self._resumed else []
            self._logged[key] = max((m.step for m in hist), default=-1)
        return self._logged[key]

    def flush(self, wait: float | None = None) -> None:
        """Until every queued metric is stored (``TrackingUnavailable`` after ``wait`` seconds)."""
        self.outbox.flush(wait)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self._patient(lambda: self.client.log_artifact(self.run_id, str(path), artifact_path), "logging an artifact")

    def pause(self) -> None:
        """Every metric sent and the sender's thread ended; the run stays RUNNING (a stopped trial
        resumes in a later attempt, with a logger of its own)."""
        self.outbox.close()

    def end(self, status: TrialStatus | str, wait: float | None = None) -> None:
        """Close the run: every metric sent, the trial's state as the ``status`` tag, its MLflow
        status from it (waiting at most ``wait`` seconds for the server)."""
        status = TrialStatus(status)
        self.outbox.close(wait)
        self._patient(lambda: end_run(self.client, self.run_id, status), "closing the run", wait)
