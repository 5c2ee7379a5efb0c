"""A sweep's saved state, ``<results>/ray/<sweep>/lime_sweep.json``: what survives the driver.

Written by the driver when it opens the sweep's MLflow run (name, fingerprint of the trials,
parent run id, tracking URI, experiment id, file, number of launches) and by
``orchestrator.sweep.extend`` when the seed axis grows (the seeds in effect, the first launch's
seeds and fingerprint, and one entry per extension: its seeds and its Ray experiment folder).
A write keeps the keys it does not name, so neither writer drops the other's.
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
    """The Ray experiment folders of the sweep's seed extensions, oldest first."""
    exts = read_state(exp_dir).get("extensions") or []
    return [Path(exp_dir) / e["name"] for e in exts if isinstance(e, dict) and isinstance(e.get("name"), str)]
