"""The outbox that carries a trial's metrics through an outage of its tracking server
(``orchestrator.core.outbox``): in order, nothing lost, nothing twice, bounded in memory, a bounded
wait where a trial must wait, and only outages waited for. The sender here is a stand-in whose
"server" is switched off and on; tests/orchestrator/cluster/test_outage.py stops a real one."""
from __future__ import annotations

import threading
import time

import pytest

from orchestrator.core import outbox, watch
from orchestrator.core.outbox import Health, Outbox, TrackingUnavailable


class Server:
    """A stand-in for MLflow's log_batch: refuses connections while down, stores batches while up."""

    def __init__(self):
        self.up = True
        self.stored: list = []
        self.refused = 0
        self.lock = threading.Lock()

    def send(self, batch: list) -> None:
        with self.lock:
            if not self.up:
                self.refused += 1
                raise ConnectionRefusedError(111, "Connection refused")
            self.stored.extend(batch)


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("LIME_TRACKING_RETRY_S", "0.05")  # retry every 50 ms here


def _health(lines: list) -> Health:
    return Health("http://tracking:5000", say=lines.append)


def test_metrics_logged_during_an_outage_arrive_in_order_once_it_ends():
    lines: list[str] = []
    srv, h = Server(), _health(lines)
    box = Outbox(srv.send, h)
    box.put(list(range(100)))
    box.flush(5)
    srv.up = False
    for i in range(100, 3100, 100):  # the trial keeps logging: put never waits for the server
        t0 = time.monotonic()
        box.put(list(range(i, i + 100)))
        assert time.monotonic() - t0 < 0.5
    time.sleep(0.3)
    assert h.outage_s() > 0 and h.report()["mlflow_outage_s"] > 0
    assert h.buffered == 3000 and len(srv.stored) == 100 and srv.refused >= 2
    srv.up = True
    box.close(10)
    assert srv.stored == list(range(3100))  # nothing lost, nothing twice, in order
    assert h.outage_s() == 0 and len(h.outages) == 1 and h.flushed == 3000 and h.buffered == 0
    assert lines[0] == ("MLflow at http://tracking:5000 unreachable (sending metrics: ConnectionRefusedError: "
                        "[Errno 111] Connection refused); training continues, metrics are kept and sent when it "
                        "answers (waiting at most 1800 s where a trial must: $LIME_TRACKING_WAIT_S)")
    assert lines[1].startswith("MLflow at http://tracking:5000 back after ") and \
        lines[1].endswith(" s; sending the 3000 metrics kept meanwhile, in order")
    assert len(lines) == 2


def test_a_full_buffer_makes_training_wait_never_drops():
    lines: list[str] = []
    srv, h = Server(), _health(lines)
    srv.up = False
    box = Outbox(srv.send, h, limit=1000)
    box.put(list(range(1000)))
    done = threading.Event()

    def more():
        box.put(list(range(1000, 1500)))  # waits: the buffer holds 1000
        done.set()

    threading.Thread(target=more, daemon=True).start()
    time.sleep(0.5)
    assert not done.is_set()
    assert "1000 metrics kept for MLflow ($LIME_TRACKING_BUFFER=1000): training waits until it answers" in lines
    srv.up = True
    assert done.wait(5)
    box.close(10)
    assert srv.stored == list(range(1500))


def test_the_final_flush_waits_a_bounded_time_and_keeps_what_it_could_not_send(monkeypatch):
    lines: list[str] = []
    srv, h = Server(), _health(lines)
    srv.up = False
    box = Outbox(srv.send, h)
    box.put(list(range(42)))
    t0 = time.monotonic()
    with pytest.raises(TrackingUnavailable) as e:
        box.flush(0.5)
    assert 0.5 <= time.monotonic() - t0 < 3
    assert str(e.value) == ("MLflow at http://tracking:5000 unreachable: 42 metrics not sent after 0.5 s "
                            "($LIME_TRACKING_WAIT_S); they are in the trial's checkpoint and are sent when it resumes")
    assert h.buffered == 42  # kept: a later flush still sends them
    srv.up = True
    box.close(5)
    assert srv.stored == list(range(42))


def test_an_error_that_is_no_outage_reaches_the_caller():
    def reject(batch):
        raise ValueError("INVALID_PARAMETER_VALUE: metric value too large")

    box = Outbox(reject, _health([]))
    box.put([1, 2])
    with pytest.raises(ValueError, match="INVALID_PARAMETER_VALUE"):
        box.flush(5)


def test_what_counts_as_an_outage():
    from mlflow.exceptions import MlflowException, RestException

    refused = MlflowException("API request to http://h:5000/api/2.0/mlflow/runs/log-batch failed with exception "
                              "HTTPConnectionPool(host='h', port=5000): Max retries exceeded with url: /api (Caused "
                              "by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection "
                              "refused'))")
    gateway = MlflowException("API request to endpoint /api/2.0/mlflow/runs/get failed with error code 503 != 200. "
                              "Response body: 'Service Unavailable'")
    bad = RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "Invalid value for metric 'x'"})
    missing = RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Run 'abc' not found"})
    import requests

    assert outbox.is_outage(refused) and outbox.is_outage(gateway)
    assert outbox.is_outage(requests.exceptions.ConnectionError("reset")) and outbox.is_outage(TimeoutError())
    assert not outbox.is_outage(bad) and not outbox.is_outage(missing) and not outbox.is_outage(ValueError("x"))


def test_a_patient_call_waits_for_the_server_then_gives_up_with_a_line():
    lines: list[str] = []
    h = _health(lines)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError(111, "Connection refused")
        return "run-1"

    assert outbox.patient(flaky, "creating the run", h, wait=10) == "run-1" and len(calls) == 3
    # the trial waits here (it is not training): its line says so, not "training continues"
    assert lines[0] == ("MLflow at http://tracking:5000 unreachable (creating the run: ConnectionRefusedError: "
                        "[Errno 111] Connection refused); the trial waits for it, at most 10 s "
                        "($LIME_TRACKING_WAIT_S), and goes on when it answers")
    assert lines[1].startswith("MLflow at http://tracking:5000 back after ")

    def never():
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(TrackingUnavailable) as e:
        outbox.patient(never, "closing the run", h, wait=0.3)
    assert str(e.value).startswith("MLflow at http://tracking:5000 unreachable for ")
    assert str(e.value).endswith(" s (closing the run); gave up after $LIME_TRACKING_WAIT_S=0.3 s")
    with pytest.raises(KeyError):
        outbox.patient(lambda: {}["x"], "reading", h, wait=10)  # not an outage: at once


def test_an_outage_that_comes_to_block_the_trial_says_so():
    """Metrics first (the trial goes on), then a call the trial must wait for: a second line says it
    waits, since the first one said that training continues."""
    lines: list[str] = []
    srv, h = Server(), _health(lines)
    srv.up = False
    box = Outbox(srv.send, h)
    box.put([1])
    time.sleep(0.3)
    calls = []

    def tag():
        calls.append(1)
        if not srv.up:
            raise ConnectionRefusedError(111, "Connection refused")

    threading.Timer(0.5, lambda: setattr(srv, "up", True)).start()
    outbox.patient(tag, "setting a tag", h, wait=20)
    box.close(10)
    assert lines[0].endswith("training continues, metrics are kept and sent when it answers (waiting at most "
                             "1800 s where a trial must: $LIME_TRACKING_WAIT_S)")
    assert lines[1] == ("MLflow at http://tracking:5000 unreachable (setting a tag: ConnectionRefusedError: [Errno "
                        "111] Connection refused); the trial waits for it, at most 20 s ($LIME_TRACKING_WAIT_S), and "
                        "goes on when it answers")
    assert lines[2].startswith("MLflow at http://tracking:5000 back after ") and len(lines) == 3
    assert srv.stored == [1]


@pytest.mark.parametrize("window, retries", [(30, 5), (14, 4), (2, 2), (0.5, 1), (300, 8)])
def test_one_calls_retry_window_sets_mlflows_retries(monkeypatch, window, retries):
    monkeypatch.setenv("LIME_TRACKING_RETRY_S", str(window))
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", raising=False)
    outbox.apply_retry_window()
    import os

    # urllib3 sleeps 1 * 2^(k-1) s before retry k >= 2: r retries sleep 2^r - 2 s in all
    assert int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) == retries
    assert 2 ** retries - 2 <= max(window, 0) and os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"


def test_a_bad_setting_is_one_line(monkeypatch):
    from lime_arch.errors import ConfigError

    monkeypatch.setenv("LIME_TRACKING_WAIT_S", "forever")
    with pytest.raises(ConfigError, match=r"^\$LIME_TRACKING_WAIT_S: must be a number of seconds > 0, got 'forever'$"):
        outbox.wait_bound()


def test_the_drivers_watch_says_an_outage_while_it_lasts_and_its_end():
    """The sweep driver probes its server itself (a trial waiting to create its run reports
    nothing): a line when it is seen away, one every ``repeat`` seconds, one when it is back."""
    now = [0.0]
    up = [True]

    def probe():
        if not up[0]:
            raise ConnectionRefusedError(111, "Connection refused")

    w = watch.ServerWatch("http://tracking:5000", probe=probe, repeat=60, clock=lambda: now[0])
    w.check()
    assert w.news() is None
    up[0], now[0] = False, 10.0
    w.check()
    now[0] = 12.0
    assert w.news() == ("MLflow at http://tracking:5000 unreachable from the driver (ConnectionRefusedError: [Errno "
                        "111] Connection refused); trials train on and keep what they log, a starting trial's run "
                        "is created when it answers, an ending trial's is sent in the background (at most 1800 s: "
                        "$LIME_TRACKING_WAIT_S)")
    now[0] = 40.0
    w.check()
    assert w.news() is None  # said 28 s ago
    now[0] = 75.0
    assert w.news() == "MLflow at http://tracking:5000 still unreachable, for 65 s"
    up[0], now[0] = True, 100.0
    w.check()
    assert w.news() == "MLflow at http://tracking:5000 answers again after 90 s; the trials send what they kept"
    assert w.news() is None
    up[0] = False  # an outage over before anything was printed is not announced as ended
    w.check()
    up[0] = True
    w.check()
    assert w.news() is None


def test_the_watch_probes_a_real_socket_within_seconds():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: refused at once
    w = watch.ServerWatch(f"http://127.0.0.1:{port}", every=0.1).start()
    t0 = time.monotonic()
    line = None
    while line is None and time.monotonic() - t0 < 10:
        time.sleep(0.05)
        line = w.news()
    w.close()
    assert line is not None and line.startswith(f"MLflow at http://127.0.0.1:{port} unreachable from the driver (")
    assert time.monotonic() - t0 < 10


def test_the_watch_pickles_with_the_console_ray_keeps():
    """Ray Tune pickles its callbacks (the console, holding the watch) with the experiment state:
    a started watch pickles without its lock, thread or probe, and the copy watches by itself."""
    import pickle

    import cloudpickle

    from orchestrator.sweep.console import LiveView

    v = LiveView(total=1, steps={"a": 10}, default_steps=10, metric="final/val_loss", mode="min",
                 uri="http://127.0.0.1:9")
    v.watch.start()
    try:
        for dumps in (pickle.dumps, cloudpickle.dumps):
            copy = pickle.loads(dumps(v))
            assert copy.watch.thread is None and copy.watch.uri == "http://127.0.0.1:9"
            copy.watch.check()  # port 9 (discard) refuses: the copy's own probe says the outage
            assert copy.watch.news().startswith("MLflow at http://127.0.0.1:9 unreachable from the driver (")
    finally:
        v.watch.close()
