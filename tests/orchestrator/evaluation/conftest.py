"""Fixtures of the evaluation tests: offline, with a private cache for the harness's datasets and
the generated tasks; the shipped local task folder as the working directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.orchestrator.evaluation.helpers import TASKS


@pytest.fixture(scope="session")
def private_cache(tmp_path_factory) -> Path:
    """One cache for the session: the harness's datasets of the local tasks and the generated tasks
    are built once (their content is a pure function of the files)."""
    return tmp_path_factory.mktemp("eval-cache")


@pytest.fixture(autouse=True)
def offline(private_cache, monkeypatch):
    """No hub, and a private cache for the harness's datasets and the generated tasks."""
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LIME_CACHE", str(private_cache / "lime-cache"))
    monkeypatch.setenv("HF_HOME", str(private_cache / "hf-home"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", private_cache / "hf-datasets")


@pytest.fixture
def task_dir(monkeypatch) -> Path:
    """The shipped local tasks; their data paths are relative to this folder."""
    monkeypatch.chdir(TASKS)
    return TASKS
