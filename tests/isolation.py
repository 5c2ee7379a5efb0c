"""The process-wide state one test could leave behind for the next, taken before a test and put back
after it (tests/conftest.py), so that no test's outcome depends on which tests ran before it in the
same process: the order `make test-shuffled` draws, or the share of the tests a pytest-xdist worker
gets under `make test`.

Put back: the environment and torch's thread count (silently: the code sets its own defaults in the
environment, MLflow's retries or Inductor's cache, and a trial its train.threads, by design), the
working directory and the handlers of the common signals. Reported, as a ``LeftBehind`` warning
naming the test: a working directory or signal handler still changed after the test's own fixtures
were torn down (monkeypatch's undo included), threads the test started that are still running
(they cannot be stopped from outside), and files written into the repository's working tree where
only a test's tmp_path belongs (``./mlflow.db``, ``results/ray``: two workers would share them). Not
covered: glibc's allocator settings, which no API reads back (the bench sets them only in
``lime bench``'s own process, never under a test).
"""
from __future__ import annotations

import os
import signal
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
                                               "SIGALRM", "SIGCHLD", "SIGPIPE") if hasattr(signal, n))
# where a run of the project writes by default: a test must point it at its tmp_path instead
WATCHED = (ROOT, ROOT / "results", ROOT / "results" / "ray")
# pytest's own, set for each phase of a test
OWN_ENV = "PYTEST_CURRENT_TEST"


class LeftBehind(UserWarning):
    """A test left process-wide state changed (put back before the next test)."""


def _listing(d: Path) -> frozenset[str]:
    try:
        return frozenset(os.listdir(d))
    except OSError:
        return frozenset()


@dataclass
class ProcessState:
    env: dict[str, str]
    cwd: str
    handlers: dict[int, object]
    threads: int
    live: frozenset[threading.Thread]
    files: dict[Path, frozenset[str]]

    @classmethod
    def take(cls) -> ProcessState:
        return cls(env=dict(os.environ), cwd=os.getcwd(), handlers={s: signal.getsignal(s) for s in SIGNALS},
                   threads=torch.get_num_threads(), live=frozenset(threading.enumerate()),
                   files={d: _listing(d) for d in WATCHED})

    def restore(self) -> list[str]:
        """Put back what can be put back; what differed, in words."""
        left = []
        env = dict(os.environ)
        changed = sorted(k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k) and k != OWN_ENV)
        for k in changed:  # not reported: the code sets its own defaults (MLflow's retries, Inductor's cache)
            if k in self.env:
                os.environ[k] = self.env[k]
            else:
                del os.environ[k]
        try:
            cwd = os.getcwd()
        except FileNotFoundError:  # the test's folder is gone
            cwd = None
        if cwd != self.cwd:
            left.append(f"working directory {cwd or 'removed'}")
            os.chdir(self.cwd)
        for s, h in self.handlers.items():
            if signal.getsignal(s) != h:
                left.append(f"handler of {signal.Signals(s).name}")
                if h is not None:  # None: installed outside Python, which cannot be put back from here
                    signal.signal(s, h)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)  # not reported: a trial sets its train.threads by design
        return left

    def report(self) -> list[str]:
        """What cannot be put back: threads still running, files in the repository's tree."""
        left = [f"thread {t.name!r} still running" for t in threading.enumerate()
                if t not in self.live and t.is_alive()]
        for d, names in self.files.items():
            new = sorted(_listing(d) - names)
            if new:
                left.append(f"new files in {d.relative_to(ROOT)}: {', '.join(new)}")
        return left

    def restore_and_report(self, test: str) -> None:
        left = self.restore() + self.report()
        if left:
            warnings.warn(LeftBehind(f"{test} left behind: {'; '.join(left)}"), stacklevel=1)
