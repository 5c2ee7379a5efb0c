"""A trial's MLflow run through an outage at its start and at its end (issue 39): a trial that
starts while the server is away trains at once and its run is created when the server answers,
everything sent in the order the trial made it; a late opening reads the sweep's record as a
starting trial does; a sweep trial that ends during an outage hands what is left to a background
sender and frees its slot. The client is a stand-in whose "server" is switched off and on (it
records every call it stores); tests/orchestrator/cluster/test_outage_start.py stops a real one."""
from __future__ import annotations

import time
import types
from pathlib import Path

import mlflow.entities  # noqa: F401 - imported before a test times the trial's calls (the logger imports it lazily)
import pytest

from orchestrator.core import outbox, spool, tracking
from orchestrator.core.outbox import TrackingUnavailable
from orchestrator.core.record import PARENT_RUN
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import RunLogger

URI = "http://tracking:5000"
REFUSED = "ConnectionRefusedError: [Errno 111] Connection refused"


class Server:
    """A stand-in MlflowClient: refuses every call while down; stores (and lists in ``calls``)
    what it gets while up."""

    tracking_uri = URI

    def __init__(self, up: bool = True, found: list | None = None):
        self.up, self.calls, self.found, self.params = up, [], list(found or []), {}

    def _check(self) -> None:
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")

    def get_experiment_by_name(self, name):
        self._check()
        return types.SimpleNamespace(experiment_id="1")

    def search_runs(self, exps, filt, max_results=0):
        self._check()
        self.calls.append(("search",))
        return list(self.found)

    def create_run(self, exp, run_name=None, tags=None):
        self._check()
        rid = f"run{sum(c[0] == 'create' for c in self.calls) + 1}"
        self.calls.append(("create", rid, run_name, dict(tags or {})))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=rid))

    def update_run(self, rid, status):
        self._check()
        self.calls.append(("update", rid, status))

    def delete_run(self, rid):
        self._check()
        self.calls.append(("delete", rid))

    def get_run(self, rid):
        self._check()
        return types.SimpleNamespace(data=types.SimpleNamespace(params=dict(self.params.get(rid, {}))))

    def log_batch(self, rid, metrics=(), params=()):
        self._check()
        for p in params:
            self.params.setdefault(rid, {})[p.key] = p.value
            self.calls.append(("param", rid, p.key, p.value))
        for m in metrics:
            self.calls.append(("metric", rid, m.key, m.step))

    def get_metric_history(self, rid, key):
        self._check()
        return [types.SimpleNamespace(step=c[3]) for c in self.calls if c[:3] == ("metric", rid, key)]

    def set_tag(self, rid, k, v):
        self._check()
        self.calls.append(("tag", rid, k, v))

    def set_terminated(self, rid, status):
        self._check()
        self.calls.append(("terminated", rid, status))

    def log_artifact(self, rid, path, artifact_path=None):
        self._check()
        self.calls.append(("artifact", rid, Path(path).name, Path(path).read_text()))


@pytest.fixture
def server(monkeypatch):
    srv = Server()
    monkeypatch.setattr(tracking, "client", lambda uri=None: srv)
    monkeypatch.setenv("LIME_TRACKING_RETRY_S", "0.05")  # retry every 50 ms here
    return srv


@pytest.fixture
def lines():
    said: list[str] = []
    outbox.reset_health().say = said.append
    yield said
    outbox.reset_health()


def _trial(log: RunLogger) -> None:
    """What a trial logs at its start and during training (``MLflowHook``)."""
    log.log_params({"lr": 0.001})
    log.set_tags({"checkpoint_dir": "/ck"})
    for step in (5, 10, 15):
        log.log_metrics({"train/loss": 1.0 / step}, step)


def test_a_trial_that_starts_during_an_outage_trains_and_its_run_is_created_when_it_answers(server, lines):
    server.up = False
    t0 = time.monotonic()
    log = RunLogger("sweep", run_name="base", tags={"router": "full"}, uri=URI)
    _trial(log)  # nothing here waits for the server
    assert time.monotonic() - t0 < 2.0 and log.run_id is None and server.calls == []
    assert lines == [f"MLflow at {URI} unreachable (creating the run: {REFUSED}); the trial starts training without "
                     "it: its run is created when the server answers, and everything is sent then, in order"]
    server.up = True
    log.end(TrialStatus.FINISHED, wait=10)
    assert log.run_id == "run1"
    assert server.calls == [
        ("create", "run1", "base", {"router": "full"}), ("param", "run1", "lr", "0.001"),
        ("tag", "run1", "checkpoint_dir", "/ck"), ("metric", "run1", "train/loss", 5),
        ("metric", "run1", "train/loss", 10), ("metric", "run1", "train/loss", 15),
        ("tag", "run1", "status", "finished"), ("terminated", "run1", "FINISHED")]
    assert lines[1].startswith(f"MLflow at {URI} back after ") and \
        lines[1].endswith(" s; sending the 3 metrics kept meanwhile, in order")
    assert len(lines) == 2


def _run(rid: str, status: str, start: int):
    return types.SimpleNamespace(info=types.SimpleNamespace(run_id=rid, start_time=start),
                                 data=types.SimpleNamespace(tags={"status": status}))


def test_a_late_opening_continues_the_trials_finished_run_of_the_record(server, lines, capsys):
    server.up = False
    server.found = [_run("old", "running", 1), _run("done", "finished", 2)]
    log = RunLogger("sweep", run_name="base", parent_run_id="P", trial="base", uri=URI)
    log.log_metrics({"train/loss": 0.5}, 5)
    server.calls.append(("metric", "done", "train/loss", 5))  # the finished run has step 5 already
    server.up = True
    log.end(TrialStatus.FINISHED, wait=10)
    assert server.calls == [("metric", "done", "train/loss", 5), ("search",), ("update", "done", "RUNNING"),
                            ("tag", "done", "status", "finished"), ("terminated", "done", "FINISHED")]
    assert "MLflow: continuing the trial's run done of the sweep's record" in capsys.readouterr().out


def test_a_late_opening_deletes_the_runs_of_attempts_that_left_no_checkpoint(server, lines, capsys):
    server.up = False
    server.found = [_run("old", "running", 1)]
    log = RunLogger("sweep", run_name="base", parent_run_id="P", trial="base", uri=URI)
    server.up = True
    log.end(TrialStatus.FINISHED, wait=10)
    assert server.calls[:3] == [("search",), ("delete", "old"), ("create", "run1", "base", {PARENT_RUN: "P"})]
    assert "deleting MLflow run old of an attempt without a checkpoint" in capsys.readouterr().out
    # resumed from a checkpoint that names no run (trained while the server was away): its run is continued
    server.calls.clear()
    log = RunLogger("sweep", run_name="base", parent_run_id="P", trial="base", resumed=True, uri=URI)
    log.end(TrialStatus.FINISHED, wait=10)
    assert server.calls[:2] == [("search",), ("update", "old", "RUNNING")]


def test_a_sweep_trial_that_ends_during_an_outage_hands_off_and_its_sender_sends_everything(
        server, lines, tmp_path, monkeypatch):
    launched: list[Path] = []
    monkeypatch.setattr(spool, "launch", launched.append)  # the sender runs here, below
    log = RunLogger("sweep", run_name="base", uri=URI, spool=tmp_path / "outbox")
    _trial(log)
    log.flush(10)
    server.up = False
    log.log_metrics({"train/loss": 0.05}, 20)
    art = tmp_path / "config.yaml"
    art.write_text("lr: 0.001\n")
    log.log_artifact(art)
    art.unlink()  # the caller's temporary file: the queued copy stays
    t0 = time.monotonic()
    log.end(TrialStatus.FINISHED)  # waits one call's retry window (0.05 s), then hands off
    assert time.monotonic() - t0 < 5.0
    assert len(launched) == 1 and launched[0].parent == tmp_path / "outbox" and launched[0].is_file()
    assert lines[-1] == (f"MLflow at {URI} unreachable: the trial ends and frees its slot; 3 metrics and calls (its "
                         f"run's end included) go to a background sender ({launched[0]}.log), which sends them in "
                         "order when the server answers (at most 1800 s: $LIME_TRACKING_WAIT_S)")
    assert outbox.health().report()["mlflow_handed_off"] == 1.0
    assert not log.outbox.thread.is_alive()  # the trial's sender thread ended with the hand-off
    stored = len(server.calls)
    server.up = True
    assert spool.send(launched[0]) == 0
    assert server.calls[stored:] == [("metric", "run1", "train/loss", 20), ("artifact", "run1", "config.yaml",
                                                                              "lr: 0.001\n"),
                                     ("tag", "run1", "status", "finished"), ("terminated", "run1", "FINISHED")]
    assert not launched[0].exists() and list((tmp_path / "outbox").iterdir()) == []


def test_the_sender_of_a_server_that_stays_away_keeps_its_file(server, lines, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIME_TRACKING_WAIT_S", "0.3")
    server.up = False
    path = spool.write(tmp_path, {"uri": URI, "run_id": "run1", "items": [outbox.Op("end", "finished")]})
    assert spool.send(path) == 1 and path.is_file()
    assert f"`python -m orchestrator.core.spool {path}` sends it" in capsys.readouterr().out


def test_lime_train_without_a_spool_still_waits_a_bounded_time_at_its_end(server, lines):
    log = RunLogger("train", run_name="t", uri=URI)
    server.up = False
    log.log_metrics({"train/loss": 0.5}, 5)
    t0 = time.monotonic()
    with pytest.raises(TrackingUnavailable):
        log.end(TrialStatus.FINISHED, wait=0.5)
    assert 0.4 < time.monotonic() - t0 < 5.0
    server.up = True  # what was kept goes when it answers (and the sender's thread ends)
    log.outbox.close(10)
    assert server.calls[-3:] == [("metric", "run1", "train/loss", 5), ("tag", "run1", "status", "finished"),
                                 ("terminated", "run1", "FINISHED")]
