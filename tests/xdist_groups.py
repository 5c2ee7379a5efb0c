"""The pytest-xdist groups of `make test` (``--dist loadgroup``), called from tests/conftest.py: a
module whose tests share a fixture of the project wider than one test (a trained checkpoint, an
MLflow store) is one group, so its tests run in one worker, which builds the fixture once; the other
tests are dealt out one by one. Free of torch and of the project, so that tests/test_xdist_groups.py
can check it in a bare pytest run with two workers."""
from __future__ import annotations

import pytest


def shares_a_wider_fixture(item: pytest.Item) -> bool:
    """A fixture of wider than function scope defined in the test tree (a module or a conftest):
    pytest's own session fixtures (tmp_path_factory) have no base id and share nothing costly."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    return any(d.scope != "function" and d.baseid for fds in defs for d in fds)


def group_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that shares a wider fixture with its module's group (before pytest-xdist's
    worker reads the marks: call it from a ``tryfirst`` hook)."""
    loadgroup = getattr(config.option, "loadgroup", False)  # set in each xdist worker under --dist loadgroup
    for item in items:
        if shares_a_wider_fixture(item):
            name = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(name))
            if loadgroup:
                _name_the_group_in_the_node_id(item, name)


def _name_the_group_in_the_node_id(item: pytest.Item, name: str) -> None:
    """pytest-xdist (3.8) tells its scheduler a test's group by appending ``@<group>`` to the node id,
    which it writes to ``item._nodeid``. pytest 9 keeps the id in ``item._id`` (a NodeId) and no
    longer reads ``_nodeid``: xdist's write is lost, every test is its own group and both workers
    build every module fixture (measured: test_fair_baseline's 34 s fixture twice). Where this pytest
    keeps the id in ``_id``, the suffix is written there; on pytest 8 xdist's own write works and
    nothing is done here (a second suffix would be harmless: the scheduler reads the last one)."""
    if not hasattr(item, "_id"):
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # a pytest with _id but without this parser: leave the id alone
        return
    item._id = coerce_node_id(f"{item.nodeid}@{name}")
