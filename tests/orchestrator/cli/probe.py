"""What the refusal tests share: a probe sweep file, the one-line-and-exit-2 check, and a private
store, cache and results folder per test."""
from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.cli import main
from tests.sweeps import tiny


def sweep_file(folder: Path, name: str, base: dict | None = None, **doc) -> Path:
    """``folder/name.yaml``: a valid sweep of the tiny model, with ``doc``'s keys added or replaced."""
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "description": "a probe", "base": base or tiny(),
                                 "resources": {"cpu": 1}, **doc}, sort_keys=False))
    return p


def one_line(capsys, argv: list[str]) -> str:
    """The CLI's one stderr line for ``argv``, asserting exit code 2 and nothing else printed."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1, (rc, out, err)
    return err.rstrip("\n")


def private(tmp_path: Path, monkeypatch) -> None:
    """Run in ``tmp_path`` with its own MLflow store, results and cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
