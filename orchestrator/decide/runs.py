"""The per-seed values of a running sweep, from its MLflow child runs (the waves of
``lime sweep run --until-decided`` read them after each wave; the report reads the same runs
through its own frame, ``orchestrator.report.runs``).

A trial run carries its axis values as tags, as the sweep file writes the axis (``router``,
``seed``: ``orchestrator.core.record.trial_tags``). A value is a sample when its run's status is
finished and the metric is finite; every run counts as launched. Of several runs of one trial (a
store with duplicates) a finished one wins. A budget (``orchestrator.decide.budget``) also reads
each run's measured wall time (``trial/wall_s``, logged by finished and failed attempts alike).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from orchestrator.core import record
from orchestrator.core.record import cast_param, child_runs
from orchestrator.core.status import TrialStatus


def _trials(cl, exp_id: str, parent: str, axis: str, seed_axis: str, values: list) -> Iterator[tuple[Any, int, Any]]:
    """(axis value, seed, run) of every child run whose tags name one of ``values`` and an integer seed."""
    by_text = {str(v): v for v in values}
    for run in child_runs(cl, exp_id, parent):
        tags = run.data.tags
        v = by_text.get(str(tags.get(axis)))
        seed = cast_param(tags.get(seed_axis))
        if v is not None and isinstance(seed, int):
            yield v, seed, run


def seed_values(cl, exp_id: str, parent: str, axis: str, seed_axis: str, metric: str,
                values: list) -> tuple[dict[Any, dict[int, float]], dict[Any, set]]:
    """({axis value: {seed: metric}} of the finished trials, {axis value: launched seeds}) for the
    axis values ``values`` (as the file writes them; a tag is matched by its text)."""
    finished: dict[Any, dict[int, float]] = {v: {} for v in values}
    launched: dict[Any, set] = {v: set() for v in values}
    for v, seed, run in _trials(cl, exp_id, parent, axis, seed_axis, values):
        launched[v].add(seed)
        x = run.data.metrics.get(metric)
        if record.run_status(run) is TrialStatus.FINISHED and x is not None and math.isfinite(x):
            finished[v][seed] = float(x)
    return finished, launched


def seed_walls(cl, exp_id: str, parent: str, axis: str, seed_axis: str, values: list) -> dict[Any, dict[int, float]]:
    """{axis value: {seed: measured wall seconds}} of the trials that logged one (of several runs of one
    trial, the seconds add up: each cost its time)."""
    walls: dict[Any, dict[int, float]] = {v: {} for v in values}
    for v, seed, run in _trials(cl, exp_id, parent, axis, seed_axis, values):
        w = run.data.metrics.get(record.TRIAL_WALL)
        if w is not None and math.isfinite(w) and w >= 0:
            walls[v][seed] = walls[v].get(seed, 0.0) + float(w)
    return walls
