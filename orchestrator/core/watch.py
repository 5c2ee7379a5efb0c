"""The sweep driver's own watch of its MLflow server (torch-free, stdlib only).

A trial reports an outage only with its next result (a starting one reports nothing until it
has trained to its first log point); so the driver probes the server itself and its console says
an outage within seconds. The watch lives in the console, a Ray Tune
callback that Ray pickles with the experiment's state: its lock, thread and probe are made when
first used, never pickled.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.core.outbox import WAIT_ENV, error_line, is_outage, wait_bound


def http_probe(uri: str, timeout: float = 3.0) -> Callable[[], None]:
    """One request to an MLflow server's ``/health`` (stdlib: the driver's watch needs no MLflow)."""
    import urllib.error
    import urllib.request

    url = uri.rstrip("/") + "/health"

    def probe() -> None:
        try:
            urllib.request.urlopen(url, timeout=timeout).read()
        except urllib.error.HTTPError as e:
            if e.code >= 500:
                raise
        # any answer below 500 (a proxy's 404 included) is a server that is there

    return probe


class ServerWatch:
    """The sweep driver's own view of its MLflow server, for the console: a trial that waits for
    the server (to create its run) reports nothing, and one that trains reports its outage only
    with its next result, so the driver probes the server itself (``probe``, every ``every``
    seconds, in a daemon thread) and ``news`` gives the line to print: when an outage is seen,
    every ``repeat`` seconds while it lasts, and when it ends."""

    def __init__(self, uri: str, probe: Callable[[], None] | None = None, every: float = 5.0,
                 repeat: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.uri, self.every, self.repeat, self.clock = uri, every, repeat, clock
        self._probe = probe  # None: ``http_probe(uri)``, made when first used
        self._lock: threading.Lock | None = None
        self.since: float | None = None  # when the current outage was first seen
        self.why = ""
        self.said: float | None = None  # when the current outage was last said
        self.ended: float | None = None  # the length of an outage that ended and is not said yet
        self._stop: threading.Event | None = None
        self.thread: threading.Thread | None = None

    def __getstate__(self) -> dict:
        # Ray pickles the console (a Tune callback) with the experiment's state: no lock, thread
        # or closure goes with it; a copy that is unpickled starts its own watch when used
        state = dict(self.__dict__, _lock=None, _stop=None, thread=None)
        if state["_probe"] is not None and getattr(state["_probe"], "__qualname__", "").startswith("http_probe"):
            state["_probe"] = None
        return state

    @property
    def lock(self) -> threading.Lock:
        if self._lock is None:
            self._lock = threading.Lock()
        return self._lock

    @property
    def stop(self) -> threading.Event:
        if self._stop is None:
            self._stop = threading.Event()
        return self._stop

    @property
    def probe(self) -> Callable[[], None]:
        if self._probe is None:
            self._probe = http_probe(self.uri)
        return self._probe

    def start(self) -> ServerWatch:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="mlflow-watch", daemon=True)
            self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.check()
            self.stop.wait(self.every)

    def check(self) -> None:
        """One probe; records the start or the end of an outage."""
        try:
            self.probe()
        except Exception as e:  # noqa: BLE001 - only outages count; anything else is a server that answered
            if is_outage(e):
                with self.lock:
                    if self.since is None:
                        self.since, self.why, self.said = self.clock(), error_line(e), None
                return
        with self.lock:
            if self.since is not None:
                self.ended, self.since = self.clock() - self.since, None

    def news(self) -> str | None:
        """The line to print now, if any."""
        now = self.clock()
        with self.lock:
            if self.ended is not None:
                lasted, self.ended = self.ended, None
                if self.said is not None:  # an outage too short to be said is not said to have ended
                    return f"MLflow at {self.uri} answers again after {lasted:.0f} s; the trials send what they kept"
            if self.since is None:
                return None
            if self.said is None:
                self.said = now
                return (f"MLflow at {self.uri} unreachable from the driver ({self.why}); trials train on and keep "
                        "what they log, a starting trial's run is created when it answers, an ending trial's is sent "
                        f"in the background (at most {wait_bound():g} s: ${WAIT_ENV})")
            if now - self.said >= self.repeat:
                self.said = now
                return f"MLflow at {self.uri} still unreachable, for {now - self.since:.0f} s"
        return None
