"""A sweep's local cache, ``<results>/ray/<sweep>/lime_sweep.json``: what the driver finds without
asking MLflow. The record (``orchestrator.core.record``) is the store; this file only saves a
search: the parent run id, the tracking URI and experiment id, the name, the fingerprint of the
trials in effect and the number of launches (the driver, when it opens the sweep's MLflow run), and
the seed history (``orchestrator.sweep.extend``: the seeds in effect, the first launch's seeds and
fingerprint, and one entry per extension: its seeds, a wave's axis and values), which the parent
run's params also hold (``orchestrator.sweep.history``). Deleted, it is rebuilt from the record on
the next launch. A write keeps the keys it does not name, so neither writer drops the other's.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

STATE_FILE = "lime_sweep.json"


def read_state(exp_dir: Path) -> dict:
    """The saved state of the sweep whose Ray folder is ``exp_dir`` ({} if none or unreadable)."""
    p = Path(exp_dir) / STATE_FILE
    if not p.is_file():
        return {}
    try:
        state = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(exp_dir: Path, state: dict) -> None:
    """Update the saved state with ``state``'s keys (atomically; other keys are kept)."""
    exp_dir = Path(exp_dir)
    exp_dir.mkdir(parents=True, exist_ok=True)
    merged = {**read_state(exp_dir), **state}
    tmp = exp_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True))
    os.replace(tmp, exp_dir / STATE_FILE)


def extension_dirs(exp_dir: Path) -> list[Path]:
    """The Ray experiment folders of the sweep's seed extensions (``extend-<k>/``), oldest first:
    read from the folder itself, so Ray's saved state needs no cache to be found."""
    found = [p for p in Path(exp_dir).glob("extend-*") if p.is_dir() and p.name[len("extend-"):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len("extend-"):]))
