"""orchestrator.core.status: one vocabulary of trial states and its mapping to MLflow."""
from __future__ import annotations

import pytest

from orchestrator.core.status import TrialStatus


@pytest.mark.parametrize("value, status", [
    ("finished", TrialStatus.FINISHED), (" Finished ", TrialStatus.FINISHED), ("DIVERGED", TrialStatus.DIVERGED),
    (TrialStatus.KILLED, TrialStatus.KILLED), (None, None), (float("nan"), None), ("done", None), (1, None)])
def test_parse(value, status):
    assert TrialStatus.parse(value) is status


def test_of_run_prefers_the_tag_and_maps_mlflow_statuses():
    assert TrialStatus.of_run({"status": "diverged"}, "FINISHED") is TrialStatus.DIVERGED
    assert TrialStatus.of_run({"status": "paused"}, "RUNNING") == "paused"  # another version's: as is
    assert TrialStatus.of_run({}, "SCHEDULED") is TrialStatus.RUNNING
    assert TrialStatus.of_run({}, "KILLED") is TrialStatus.KILLED
    assert TrialStatus.of_run({}, "WEIRD") == "unknown"
    # a run ends in MLflow with the coarse status of its state, and comes back as that state
    for s in (TrialStatus.FINISHED, TrialStatus.FAILED, TrialStatus.KILLED, TrialStatus.RUNNING):
        assert TrialStatus.of_run({}, s.mlflow) is s
    assert TrialStatus.DIVERGED.mlflow == "FINISHED" and TrialStatus.STOPPED.mlflow == "KILLED"
    assert f"{TrialStatus.FINISHED}" == "finished" and TrialStatus.FINISHED == "finished"
