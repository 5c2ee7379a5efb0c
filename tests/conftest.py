"""Fixtures of every test: torch's threads, a fixed seed, and the process-wide state a test must not
leave behind (tests/isolation.py), so that the suite passes in any order and in worker processes
(`make test` runs two, `make test-shuffled` shuffles the order; docs/ARCHITECTURE.md, "Tests")."""
import os

import pytest
import torch

import orchestrator.core.tracking  # noqa: F401 - its import-time environment defaults, before any test's snapshot
from tests.isolation import ProcessState
from tests.xdist_groups import group_items


def _threads() -> int:
    """Tests are CPU-only and small: torch's threads per test process, so that the processes of one
    run (pytest-xdist's workers, PYTEST_XDIST_WORKER_COUNT of them) share the cores without
    oversubscribing them (2 workers on CI's 2 cores: one thread each; one process: 2 threads)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


torch.set_num_threads(_threads())


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's loadgroup reads the marks
def pytest_collection_modifyitems(config, items):
    """A module whose tests share a fixture of the project wider than one test is one xdist group
    (tests/xdist_groups.py); the other tests are dealt out one by one (`make test`: --dist loadgroup)."""
    group_items(config, items)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _process_state(request):
    """Set up before every other fixture of the test and torn down after them (monkeypatch's undo
    included): what is still changed then was left behind by the test or the code it ran. torch's
    thread count goes back silently (a trial sets its train.threads by design); the rest goes back
    too and is reported as a LeftBehind warning naming the test."""
    before = ProcessState.take()
    yield
    before.restore_and_report(request.node.nodeid)
