"""A real small sweep run until decided (``lime sweep run --until-decided``, local Ray, the CLI in a
subprocess): a clear comparison (lr 3e-3 against a baseline at 1e-5 that barely trains in 20 steps)
cannot be decided at 4 or 6 seeds (the median's sign confidence sequence at 95% is the whole line below
7), gets two waves of 2 seeds from Ray Tune, is decided "better" at 8 (all 8 signs agree), and the sweep
stops there, below its cap of 12 seeds;
the report reads the sequence and the trials used."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
TINY = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
        "data": {"source": "builtin"}, "optim": {"min_lr": 1.0e-6, "warmup_steps": 2},
        "train": {"steps": 20, "batch_size": 4, "seq_len": 32, "log_interval": 10, "eval_interval": 20,
                  "eval_batches": 2}}


def test_a_clear_comparison_stops_early(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "LIME_RESULTS": str(tmp_path / "results"), "LIME_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    doc = {"name": "decide-e2e", "description": "a clear comparison, run until decided", "base": TINY,
           "grid": {"optim.lr": [1.0e-5, 3.0e-3], "seed": [0, 1, 2, 3]}, "resources": {"cpu": 0.5},
           "report": {"metric": "final/val_loss", "axis": "optim.lr", "baseline": 1.0e-5},
           "decide": {"max_seeds": 12, "wave": 2}}
    path = tmp_path / "decide-e2e.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=800,
                       env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "look 1: 0.003 cannot decide (4 seeds)" in r.stdout
    assert "look 2: 0.003 cannot decide (6 seeds)" in r.stdout
    assert "look 3: 0.003 better (8 seeds); done: every comparison is decided" in r.stdout
    state = json.loads((tmp_path / "results" / "ray" / "decide-e2e" / "lime_sweep.json").read_text())
    assert state["seeds"] == list(range(8)) and len(state["extensions"]) == 2
    r = subprocess.run([LIME, "report", "decide-e2e", "--out", str(tmp_path / "reports")], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "reports" / "decide-e2e"
    rows = {row["variant"]: row for row in csv.DictReader(open(out / "summary.csv"))}
    assert rows["0.003"]["verdict"] == "better" and rows["0.003"]["seeds_design"] == "sequential"
    assert rows["0.003"]["n_pairs"] == "8" and rows["0.003"]["estimand"] == "median"
    md = (out / "report.md").read_text()
    assert "## Sequential seeds" in md and "Compute: 16 finished trials" in md
