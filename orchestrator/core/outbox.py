"""Tracking through an outage of the MLflow server (torch-free).

Without this, a trial logs to MLflow in its training loop: when the server is away, MLflow's
client retries one call for about four minutes, then raises, and the trial fails. Here:

- **Nothing waits for the server.** A ``RunLogger`` hands every metric, and every call that must
  reach the server (creating the run, params, tags, artifacts, its end: an ``Op``), to an
  ``Outbox``: a background thread sends them in the order they were made (metrics in batches).
  While the server is away it keeps them (at most ``$LIME_TRACKING_BUFFER`` values, default
  200,000; when full, training waits, with a line, rather than dropping any) and retries every
  few seconds. A trial that starts during an outage trains at once: its run is created when the
  server answers. Each batch keeps its timestamps, so a batch sent twice stores nothing twice.
- **Waits are bounded.** Where a trial must wait (``patient``; the final flush of ``lime train``)
  it waits at most ``$LIME_TRACKING_WAIT_S`` (default 1800), then fails with one line
  (``TrackingUnavailable``) after its last checkpoint is written. A sweep trial that ends during
  an outage does not wait: it hands what is left to a background sender (``orchestrator.core.spool``)
  and frees its slot.
- **One call's retry window** is ``$LIME_TRACKING_RETRY_S`` seconds (default 30): MLflow's own HTTP
  retries are set from it, so an outage is noticed within it.
- **Outages are said.** ``Health`` holds the process's view of its server; it prints a line when
  an outage begins and ends, and a sweep's trial reports it to the driver's console.

Only connection failures, timeouts and 5xx answers are outages (``is_outage``); any other error
(a rejected value) is raised as before.
"""
from __future__ import annotations

import collections
import math
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from lime_arch.errors import ConfigError

RETRY_ENV, DEFAULT_RETRY_S = "LIME_TRACKING_RETRY_S", 30.0
WAIT_ENV, DEFAULT_WAIT_S = "LIME_TRACKING_WAIT_S", 1800.0
BUFFER_ENV, DEFAULT_BUFFER = "LIME_TRACKING_BUFFER", 200_000
BATCH = 1000  # metrics per request (MLflow's log_batch takes at most 1000)
# what a sweep trial reports to the driver about its server, with every result
OUTAGE_S, BUFFERED, FLUSHED, OUTAGES, LAST_OUTAGE_S, LAST_KEPT, HANDED_OFF = (
    "mlflow_outage_s", "mlflow_buffered", "mlflow_flushed", "mlflow_outages", "mlflow_last_outage_s",
    "mlflow_last_kept", "mlflow_handed_off")
OUTAGE_WORDS = ("Max retries exceeded", "failed with exception", "Connection refused", "Connection aborted",
                "Connection reset", "Read timed out", "RemoteDisconnected", "Temporary failure in name resolution")
SERVER_ERROR = re.compile(r"error code 5\d\d|\b50[0234]\b.*(Server Error|Gateway|Unavailable)")


class TrackingUnavailable(RuntimeError):
    """The tracking server stayed away longer than ``$LIME_TRACKING_WAIT_S`` where a trial had to wait."""


def _seconds(env: str, default: float) -> float:
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"${env}: must be a number of seconds > 0, got {raw!r}")
    return v


def retry_window() -> float:
    return _seconds(RETRY_ENV, DEFAULT_RETRY_S)


def wait_bound() -> float:
    return _seconds(WAIT_ENV, DEFAULT_WAIT_S)


def buffer_limit() -> int:
    return max(BATCH, int(_seconds(BUFFER_ENV, DEFAULT_BUFFER)))


def apply_retry_window() -> None:
    """MLflow's HTTP retries from ``$LIME_TRACKING_RETRY_S``: urllib3 sleeps factor * 2^(k-1) before
    the k-th retry (k >= 2), so r retries at factor 1 take 2^r - 2 seconds; the most that fit."""
    window = retry_window()
    retries = max(1, int(math.log2(window + 2)))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


def is_outage(exc: BaseException) -> bool:
    """A failure of the connection or of the server (worth waiting for), not of the request."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout", "MaxRetryError", "ProtocolError"}:
        return True
    text = str(exc)
    return any(w in text for w in OUTAGE_WORDS) or bool(SERVER_ERROR.search(text))


def error_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    m = re.search(r"\(Caused by (\w+)", text)
    return f"{type(exc).__name__}: {m.group(1) if m else text[:80]}"


class Health:
    """What this process knows about its tracking server; lines go to ``say`` (stdout: the console
    of ``lime train``, a sweep trial's ``trial.log``)."""

    def __init__(self, uri: str = "", say: Callable[[str], None] | None = None, who: str = "the trial"):
        self.uri, self.say, self.who = uri, say or (lambda line: print(line, flush=True)), who
        self.lock = threading.Lock()
        self.since: float | None = None  # monotonic start of the current outage
        self.buffered = 0  # metrics waiting to be sent
        self.flushed = 0  # metrics that waited for the server during outages (sent when it answered)
        self.outages: list[float] = []  # durations of the outages that ended
        self.last_kept = 0  # the metrics that waited for the server in the last outage
        self.said_wait = False  # this outage's line said that the trial waits
        self.handed_off = ""  # the spool file a background sender sends (the trial ended during an outage)

    def down(self, exc: BaseException, started: float, what: str, wait: float | None = None) -> None:
        """An outage seen by a call; ``wait``: the caller waits for the server at most this long
        (``patient``: the trial does not go on meanwhile), None: it goes on (the outbox). The line
        says which: a trial that waits to create its run is not training."""
        waiting = wait is not None
        with self.lock:
            first = self.since is None
            if first:
                self.since = started
            say_wait = waiting and not self.said_wait
            self.said_wait = self.said_wait or waiting
        if say_wait:
            self.say(f"MLflow at {self.uri} unreachable ({what}: {error_line(exc)}); {self.who} waits for it, at most "
                     f"{wait:g} s (${WAIT_ENV}), and goes on when it answers")
        elif first:
            self.say(f"MLflow at {self.uri} unreachable ({what}: {error_line(exc)}); training continues, metrics are "
                     f"kept and sent when it answers (waiting at most {wait_bound():g} s where a trial must: "
                     f"${WAIT_ENV})")

    def starts_without(self, exc: BaseException, started: float, what: str) -> None:
        """An outage seen before the trial's run exists: the trial trains anyway, and its run is
        created when the server answers (``orchestrator.core.tracking.RunLogger``)."""
        with self.lock:
            if self.since is None:
                self.since = started
        self.say(f"MLflow at {self.uri} unreachable ({what}: {error_line(exc)}); the trial starts training "
                 "without it: its run is created when the server answers, and everything is sent then, in order")

    def up(self, kept: int = 0) -> None:
        """The server answered: ends an outage (``kept``: the metrics that waited for it, sent now in order)."""
        with self.lock:
            if self.since is None:
                return
            lasted, self.since, self.said_wait = time.monotonic() - self.since, None, False
            self.outages.append(lasted)
            self.flushed += kept
            self.last_kept = kept
        sending = f"; sending the {kept} metrics kept meanwhile, in order" if kept else ""
        self.say(f"MLflow at {self.uri} back after {lasted:.0f} s{sending}")

    def outage_s(self) -> float:
        with self.lock:
            return 0.0 if self.since is None else time.monotonic() - self.since

    def report(self) -> dict[str, float]:
        """What a sweep trial tells the driver with every result (``orchestrator.sweep.console``)."""
        with self.lock:
            last = self.outages[-1] if self.outages else 0.0
            n = len(self.outages)
        return {OUTAGE_S: round(self.outage_s(), 1), BUFFERED: float(self.buffered), FLUSHED: float(self.flushed),
                OUTAGES: float(n), LAST_OUTAGE_S: round(last, 1), LAST_KEPT: float(self.last_kept),
                HANDED_OFF: float(bool(self.handed_off))}


_HEALTH = Health()


def health() -> Health:
    """The process's tracking health (one per trial: ``reset_health`` at each trial's start)."""
    return _HEALTH


def reset_health() -> Health:
    global _HEALTH
    _HEALTH = Health()
    return _HEALTH


def try_once(fn: Callable[[], Any], what: str, h: Health | None = None) -> tuple[bool, Any]:
    """``(True, fn())``, or ``(False, None)`` when the server is away (one call's retry window:
    ``$LIME_TRACKING_RETRY_S``; said as a start without the server). Other errors are raised."""
    h = h or health()
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - only outages are tolerated
        if not is_outage(e):
            raise
        h.starts_without(e, t0, what)
        return False, None
    h.up(h.buffered)
    return True, out


class Op:
    """A call that must reach the server (create the run, params, tags, an artifact, its end),
    queued in the outbox between the metrics, so everything reaches the server in the order the
    trial made it; picklable (a finished trial hands what is left to a background sender:
    ``orchestrator.core.spool``). ``name``: the ``RunLogger`` method ``_do_<name>`` that runs it."""

    is_op = True

    def __init__(self, name: str, *args: Any, what: str = ""):
        self.name, self.args, self.what = name, args, what or name

    def __repr__(self) -> str:
        return f"Op({self.name})"


def patient(fn: Callable[[], Any], what: str, h: Health | None = None, wait: float | None = None) -> Any:
    """``fn()``, retried while the tracking server is away, for at most ``wait`` seconds
    (``$LIME_TRACKING_WAIT_S``); then ``TrackingUnavailable``. Other errors are raised at once."""
    h = h or health()
    wait = wait_bound() if wait is None else wait
    start = time.monotonic()
    while True:
        t0 = time.monotonic()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - only outages are retried
            if not is_outage(e):
                raise
            h.down(e, t0, what, wait)
            waited = time.monotonic() - start
            if waited >= wait:
                raise TrackingUnavailable(
                    f"MLflow at {h.uri} unreachable for {waited:.0f} s ({what}); gave up after ${WAIT_ENV}="
                    f"{wait:g} s") from None
            time.sleep(min(5.0, max(0.5, wait - waited), retry_window()))
            continue
        h.up(h.buffered)  # what waits in the outbox goes now
        return out


class Outbox:
    """Metrics sent in the background, in order, kept while the server is away (see the module)."""

    def __init__(self, send: Callable[[list], None], h: Health | None = None, limit: int | None = None):
        self.send, self.health = send, h or health()
        self.limit = limit or buffer_limit()
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.busy = False  # a batch is being sent
        self.error: BaseException | None = None  # a failure that is no outage: raised in the caller
        self.closed = False
        self.detached = False  # the sender thread stops after its call in flight (``detach``)
        self.thread = threading.Thread(target=self._run, name="lime-mlflow-outbox", daemon=True)
        self.thread.start()

    def put(self, items: list) -> None:
        """Queue metrics (returns at once; waits only while the buffer is full)."""
        self._raise()
        told = False
        with self.cond:
            while len(self.queue) >= self.limit and not self.closed and self.error is None:
                if not told:
                    told = True
                    self.health.say(f"{len(self.queue)} metrics kept for MLflow (${BUFFER_ENV}={self.limit}): "
                                    "training waits until it answers")
                self.cond.wait(1.0)
            self.queue.extend(items)
            self.health.buffered = len(self.queue)
            self.cond.notify_all()
        self._raise()

    def flush(self, wait: float | None = None) -> None:
        """Until every queued metric is sent; ``TrackingUnavailable`` after ``wait`` seconds."""
        wait = wait_bound() if wait is None else wait
        deadline = time.monotonic() + wait
        with self.cond:
            while (self.queue or self.busy) and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TrackingUnavailable(
                        f"MLflow at {self.health.uri} unreachable: {len(self.queue)} metrics not sent after "
                        f"{wait:g} s (${WAIT_ENV}); they are in the trial's checkpoint and are sent when it resumes")
                self.cond.wait(min(left, 1.0))
        self._raise()

    def close(self, wait: float | None = None) -> None:
        try:
            self.flush(wait)
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()
        # everything is sent (flush returned): the thread ends now; a process that runs many
        # trials (a reused Ray worker) keeps none of them
        self.thread.join(5.0)

    def detach(self) -> list:
        """Stop the sender thread (after the call it has in flight, at most one call's retry window)
        and take what it has not sent, in order: a finished trial hands it to a background sender
        (``orchestrator.core.spool``) instead of holding its slot until the server answers."""
        with self.cond:
            self.detached = self.closed = True
            self.cond.notify_all()
        self.thread.join(retry_window() + 30.0)
        with self.cond:
            left = list(self.queue)
            self.queue.clear()
            self.health.buffered = 0
        return left

    def _raise(self) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue or self.detached:
                    return
                batch = _next_batch(self.queue)
                self.busy = True
            t0 = time.monotonic()
            try:
                self.send(batch)
            except Exception as e:  # noqa: BLE001 - an outage waits; anything else goes to the caller
                with self.cond:
                    self.busy = False
                    if not is_outage(e):
                        self.error = e
                        self.queue.clear()
                        self.health.buffered = 0
                    self.cond.notify_all()
                if is_outage(e):
                    self.health.down(e, t0, _what(batch))
                    end = time.monotonic() + min(5.0, retry_window())
                    while not self.detached and time.monotonic() < end:  # then the same batch again
                        time.sleep(0.05)
                continue
            with self.cond:
                # the metrics that waited for the server, this batch's included (counted when an outage ends)
                kept = sum(not getattr(x, "is_op", False) for x in self.queue) if self.health.since is not None else 0
                for _ in batch:
                    self.queue.popleft()
                self.busy = False
                self.health.buffered = len(self.queue)
                self.cond.notify_all()
            self.health.up(kept)


def _next_batch(queue: collections.deque) -> list:
    """The queue's head: one op alone, or the metrics before the next op (at most ``BATCH``)."""
    if getattr(queue[0], "is_op", False):
        return [queue[0]]
    batch = []
    for item in queue:
        if getattr(item, "is_op", False) or len(batch) == BATCH:
            break
        batch.append(item)
    return batch


def _what(batch: list) -> str:
    return batch[0].what if getattr(batch[0], "is_op", False) else "sending metrics"


class PatientClient:
    """An ``MlflowClient`` whose every call waits for an absent server (``patient``): the sweep
    driver's, so a sweep that ends while its server is away finishes when it is back (at most
    ``$LIME_TRACKING_WAIT_S``, then one ``TrackingUnavailable`` line) instead of a traceback."""

    def __init__(self, cl, h: Health | None = None):
        self._cl, self._health = cl, h or health()
        self._health.uri = self._health.uri or str(getattr(cl, "tracking_uri", ""))

    def __getattr__(self, name: str):
        attr = getattr(self._cl, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            return patient(lambda: attr(*args, **kwargs), name.replace("_", " "), self._health)

        return call
