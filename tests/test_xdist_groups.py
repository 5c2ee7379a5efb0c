"""The xdist groups of `make test` (tests/xdist_groups.py) under the installed pytest and pytest-xdist:
a bare pytest run in a subprocess, two workers and ``--dist loadgroup`` as the Makefile runs them,
counts how often a module fixture is built. The check is end to end because the grouping rests on
how xdist and pytest pass a node id between them (it broke silently once: pytest 9 keeps the id where
xdist 3.8 does not write it)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import pytest

from tests.xdist_groups import group_items


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    group_items(config, items)
"""

# a module fixture that appends its worker's pid to $BUILDS each time it is built, eight tests that
# use it (each long enough that both workers would take some if they were dealt out one by one) and
# eight that do not
SHARED = """
import os
import time

import pytest


@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILDS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return os.getpid()


@pytest.mark.parametrize("i", range(8))
def test_shared(built, i):
    time.sleep(0.1)
    assert built == os.getpid()
"""

FREE = """
import os

import pytest


@pytest.mark.parametrize("i", range(8))
def test_free(i):
    with open(os.environ["FREE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
"""


def _run(tmp_path: Path, *args: str, conftest: str = CONFTEST) -> tuple[list[str], list[str]]:
    """Runs the three files above; the pids that built the fixture and that ran the free tests."""
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_a_free.py").write_text(FREE)
    (tmp_path / "test_b_shared.py").write_text(SHARED)
    builds, free = tmp_path / "builds.txt", tmp_path / "free.txt"
    env = {**os.environ, "BUILDS": str(builds), "FREE": str(free), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "16 passed" in r.stdout, r.stdout + r.stderr
    return builds.read_text().split(), free.read_text().split()


def test_two_workers_build_a_module_fixture_once_and_share_the_free_tests(tmp_path):
    builds, free = _run(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert len(builds) == 1, builds  # one worker ran the whole module, building its fixture once
    assert len(free) == 8


def test_without_workers_the_fixture_is_built_once_too(tmp_path):
    builds, free = _run(tmp_path)
    assert len(builds) == 1 and set(free) == set(builds)  # all in this one process


def test_without_the_groups_both_workers_build_it(tmp_path):
    """The control: the same run without the conftest's hook deals the shared tests to both workers,
    each of which builds the fixture (so the first test can fail)."""
    builds, _ = _run(tmp_path, "-n", "2", "--dist", "loadgroup", conftest="")
    assert len(builds) == 2 and len(set(builds)) == 2, builds
