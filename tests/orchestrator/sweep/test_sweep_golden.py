"""Every shipped sweep expands to exactly the trials it expanded to before the package
restructuring (trial ids and full trial configs, hashed). The golden file was written by the
code of commit 910d6a4; a deliberate change to a shipped sweep updates it (see the file's
regeneration command below) and says so in its commit.

Regenerate: python -m tests.orchestrator.sweep.test_sweep_golden
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.sweep.files import sweep_files
from orchestrator.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).with_name("sweep_trials_golden.json")
SWEEPS = sweep_files(ROOT / "sweeps")  # shared bases (_name.yaml) are no sweeps


def expansion(path: Path) -> dict:
    spec = load_spec(path)
    trials = [[t.trial_id, t.config.to_dict()] for t in spec.trials()]
    blob = json.dumps(trials, sort_keys=True, separators=(",", ":"))
    return {"n_trials": spec.n_trials(), "trial_ids": [t[0] for t in trials],
            "configs_sha256": hashlib.sha256(blob.encode()).hexdigest()}


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_shipped_sweep_expands_to_the_golden_trials(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    golden = json.loads(GOLDEN.read_text())
    assert path.stem in golden, f"{path.stem} is not in {GOLDEN.name}; regenerate it (see the docstring)"
    assert expansion(path.relative_to(ROOT)) == golden[path.stem]


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    GOLDEN.write_text(json.dumps({p.stem: expansion(p.relative_to(ROOT)) for p in SWEEPS}, indent=1,
                                 sort_keys=True) + "\n")
