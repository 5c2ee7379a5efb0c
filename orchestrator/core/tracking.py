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
import importlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lime_arch.errors import ConfigError
from orchestrator.core import exposure, outbox
from orchestrator.core.dashboard import EXPERIMENT_TAGS
from orchestrator.core.record import PARENT_RUN, child_runs, end_run, run_status
from orchestrator.core.status import TrialStatus

for _name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent"):
    logging.getLogger(_name).setLevel(logging.WARNING)
# urllib3 warns of every retried connection ("Retrying (Retry(total=0, ...))"), a line per call
# while the server is away; the outbox says the outage once, and its end (orchestrator.core.outbox)
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
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

    Metrics and the calls that must reach the server (params, tags, artifacts, the end) go
    through an ``Outbox`` (``orchestrator.core.outbox``) as one ordered queue, sent in the
    background and kept while the server is away. The run is opened at once when the server
    answers; when it does not (one call's retry window, or an outage seen already), opening is the
    queue's first entry and the trial trains meanwhile (``run_id`` is None until then). ``trial``
    (a sweep trial's id, with ``parent_run_id``): such a late opening looks the trial up in the
    sweep's record first, as the sweep's trial does when its server answers
    (``orchestrator.sweep.trainable``): a finished run, or with ``resumed`` any run of the
    trial, is continued; runs of attempts that left no checkpoint are deleted. ``spool``: a
    folder; ``end`` then waits for the server at most one call's retry window and hands what is
    left to a background sender (``orchestrator.core.spool``), so a finished sweep trial frees
    its slot. No step of a key is stored twice: a continued run skips the steps its server has,
    and every run skips a step it sent already."""

    def __init__(self, experiment: str, *, run_id: str | None = None, run_name: str | None = None,
                 tags: dict[str, Any] | None = None, parent_run_id: str | None = None, uri: str | None = None,
                 trial: str | None = None, resumed: bool = False, spool: str | Path | None = None):
        outbox.apply_retry_window()
        self.uri = uri or tracking_uri()
        self.health = outbox.health()
        self.health.uri = self.uri
        self.client = client(self.uri)
        self.spool = Path(spool) if spool else None
        self.run_id: str | None = None
        self._resumed = False
        self._logged: dict[str, int] = {}  # the last step stored, per key
        self._files: Path | None = None  # copies of the queued artifacts
        t = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            t[PARENT_RUN] = parent_run_id
        what = "reopening the run" if run_id else "creating the run"
        op = outbox.Op("open", experiment, run_name, t, parent_run_id, run_id, trial, resumed, what=what)
        opened = False
        if self.health.since is None:  # else the server is known to be away: no call's retry window spent
            opened, _ = outbox.try_once(lambda: self._do_open(*op.args), what, self.health)
        self.outbox = outbox.Outbox(self._send, self.health)
        if not opened:
            self.outbox.put([op])

    @classmethod
    def of_spool(cls, state: dict) -> RunLogger:
        """A logger that sends what a finished trial handed over (``orchestrator.core.spool``)."""
        self = cls.__new__(cls)
        self.uri, self.health = state["uri"], outbox.health()
        self.health.uri = self.uri
        self.client, self.spool, self._files = client(self.uri), None, None
        # a batch in flight when the trial handed over may have been stored: read what the server has
        self.run_id, self._resumed, self._logged = state["run_id"], True, {}
        self.outbox = outbox.Outbox(self._send, self.health)
        self.outbox.put(list(state["items"]))
        return self

    # -- the calls, in the outbox's thread ----------------------------------------------------------
    def _do_open(self, experiment, run_name, tags, parent, run_id, trial, resumed) -> None:
        if run_id is None and trial and parent:
            runs = child_runs(self.client, experiment_id(experiment, self.client), parent, trial)
            done = [r for r in runs if run_status(r) is TrialStatus.FINISHED]
            keep = done or (runs if resumed else [])
            if keep:
                run_id = max(keep, key=lambda r: (r.info.start_time or 0, r.info.run_id)).info.run_id
                print(f"MLflow: continuing the trial's run {run_id} of the sweep's record", flush=True)
            for r in [] if keep else runs:
                print(f"deleting MLflow run {r.info.run_id} of an attempt without a checkpoint", flush=True)
                self.client.delete_run(r.info.run_id)
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id, self._resumed = run_id, True
        else:
            run = self.client.create_run(experiment_id(experiment, self.client), run_name=run_name, tags=tags)
            self.run_id = run.info.run_id

    def _do_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        items = [Param(k, v) for k, v in params.items() if k not in existing]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _do_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, v)

    def _do_artifact(self, path: str, artifact_path: str | None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path)
        Path(path).unlink(missing_ok=True)

    def _do_end(self, status: str) -> None:
        end_run(self.client, self.run_id, TrialStatus(status))

    def _send(self, batch: list) -> None:
        """The outbox's sender (its thread): one call, or metrics less the steps already stored."""
        if getattr(batch[0], "is_op", False):
            getattr(self, "_do_" + batch[0].name)(*batch[0].args)
            return
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

    # -- the trial's side: nothing here waits for the server ----------------------------------------
    def set_tags(self, tags: dict[str, Any]) -> None:
        self.outbox.put([outbox.Op("tags", {k: str(v) for k, v in tags.items()}, what="setting tags")])

    def log_params(self, params: dict[str, Any]) -> None:
        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        self.outbox.put([outbox.Op("params", flat, what="logging params")])

    def log_metrics(self, metrics: dict[str, float], step: int, flush: bool = False) -> None:
        """Queue the metrics of ``step`` (never waits for the server; ``flush`` is kept for callers:
        the outbox sends continuously)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.outbox.put([Metric(k, float(v), ts, step) for k, v in metrics.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Queue a copy of the file (the caller may remove it), under its own name."""
        if self._files is None:  # a sweep trial's copies in its own folder: a killed worker leaves none in /tmp
            if self.spool is not None:
                self.spool.mkdir(parents=True, exist_ok=True)
            self._files = Path(tempfile.mkdtemp(prefix="lime-artifacts-", dir=self.spool))
        dst = self._files / str(len(list(self._files.iterdir()))) / Path(path).name
        dst.parent.mkdir()
        shutil.copy2(path, dst)
        self.outbox.put([outbox.Op("artifact", str(dst), artifact_path, what="logging an artifact")])

    def flush(self, wait: float | None = None) -> None:
        """Until everything queued is stored (``TrackingUnavailable`` after ``wait`` seconds)."""
        self.outbox.flush(wait)

    def pause(self) -> None:
        """Everything sent and the sender's thread ended; the run stays RUNNING (a stopped trial
        resumes in a later attempt, with a logger of its own)."""
        self.outbox.close()
        self._drop_files()

    def _drop_files(self) -> None:
        """The queued artifacts' copies, once everything is sent (a hand-off keeps them: its sender
        still reads them)."""
        if self._files is not None:
            shutil.rmtree(self._files, ignore_errors=True)
            self._files = None

    def end(self, status: TrialStatus | str, wait: float | None = None) -> None:
        """Close the run: everything sent, the trial's state as the ``status`` tag, its MLflow
        status from it, waiting at most ``wait`` seconds for the server (``$LIME_TRACKING_WAIT_S``),
        then ``TrackingUnavailable``; with a ``spool`` folder at most one call's retry window, then
        what is left goes to a background sender (``hand_off``)."""
        self.outbox.put([outbox.Op("end", TrialStatus(status).value, what="closing the run")])
        wait = outbox.wait_bound() if wait is None else wait
        if self.spool is None:
            self.outbox.close(wait)
            self._drop_files()
            return
        try:
            self.outbox.close(0.0 if self.health.since is not None else min(wait, outbox.retry_window()))
        except outbox.TrackingUnavailable:
            self.hand_off()
        else:
            self._drop_files()

    def hand_off(self) -> Path:
        """What is not sent yet, to a background sender that outlives this process (the spool
        folder holds it; ``orchestrator.core.spool``); said in one line."""
        spool = importlib.import_module("orchestrator.core.spool")  # by name: the spool's sender uses this module

        items = self.outbox.detach()
        path = spool.write(self.spool, {"uri": self.uri, "run_id": self.run_id, "items": items})
        spool.launch(path)
        self.health.handed_off = str(path)
        self.health.say(f"MLflow at {self.uri} unreachable: the trial ends and frees its slot; {len(items)} "
                        f"metrics and calls (its run's end included) go to a background sender ({path}.log), which "
                        f"sends them in order when the server answers (at most {outbox.wait_bound():g} s: "
                        f"${outbox.WAIT_ENV})")
        return path
