"""The one vocabulary of trial states, and its one mapping to MLflow run statuses.

A trial's ``status`` tag in MLflow (and ``TrialResult.status``) is a ``TrialStatus`` value;
MLflow's own run status is coarser (``FINISHED``/``FAILED``/``KILLED``/``RUNNING``), so both are
kept: the tag says what happened, MLflow's status drives its UI.
"""
from __future__ import annotations

from enum import Enum


class TrialStatus(str, Enum):
    RUNNING = "running"
    FINISHED = "finished"  # ran every step
    DIVERGED = "diverged"  # stopped at a NaN/inf loss: a result, not an error
    STOPPED = "stopped"  # stopped early on purpose (ASHA, stop_at)
    KILLED = "killed"  # interrupted (Ctrl-C, a killed driver); resumes on the next launch
    FAILED = "failed"  # crashed after its retries

    def __str__(self) -> str:  # f-strings and MLflow tags get the plain value
        return self.value

    @property
    def mlflow(self) -> str:
        """The MLflow run status a run in this state ends (or stays) with."""
        return _TO_MLFLOW[self]

    @property
    def done(self) -> bool:
        """A final outcome: the trial will not run again."""
        return self in (TrialStatus.FINISHED, TrialStatus.DIVERGED)

    @classmethod
    def parse(cls, value: object) -> TrialStatus | None:
        """A status as a table may hold it (any case, padded, the enum or its value); None when it
        is missing or not a trial status."""
        if value is None:
            return None
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            return None

    @classmethod
    def of_run(cls, tags: dict, mlflow_status: str) -> TrialStatus | str:
        """A run's state: its ``status`` tag, else derived from MLflow's run status."""
        tag = tags.get("status")
        if tag:
            try:
                return cls(tag)
            except ValueError:
                return tag  # written by another version: shown as is
        return _FROM_MLFLOW.get(mlflow_status, "unknown")


_TO_MLFLOW = {TrialStatus.RUNNING: "RUNNING", TrialStatus.FINISHED: "FINISHED", TrialStatus.DIVERGED: "FINISHED",
              TrialStatus.STOPPED: "KILLED", TrialStatus.KILLED: "KILLED", TrialStatus.FAILED: "FAILED"}
_FROM_MLFLOW = {"RUNNING": TrialStatus.RUNNING, "SCHEDULED": TrialStatus.RUNNING, "FINISHED": TrialStatus.FINISHED,
                "FAILED": TrialStatus.FAILED, "KILLED": TrialStatus.KILLED}
