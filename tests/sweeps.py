"""What the tests that run real sweeps share: the tiny trial they train, a sweep file written from
it, and the environment of a `lime sweep run` subprocess with its own MLflow store, results folder
and cache (a local Ray: any RAY_ADDRESS of the caller is dropped, and so is a fault injection)."""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LIME = str(Path(sys.executable).parent / "lime")
# two layers of width 32 on the built-in corpus: a trial of 20 steps takes seconds
TINY = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
        "data": {"source": "builtin"}, "optim": {"lr": 3.0e-3, "min_lr": 3.0e-4, "warmup_steps": 2},
        "train": {"steps": 20, "batch_size": 4, "seq_len": 32, "log_interval": 5, "eval_interval": 10,
                  "eval_batches": 2}}
DROPPED = ("RAY_ADDRESS", "LIME_FAULT_ONCE")


def tiny(**sections: dict) -> dict:
    """A copy of TINY with ``sections`` merged into its sections (``train={"steps": 40}``)."""
    base = copy.deepcopy(TINY)
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return base


def sweep_env(root: Path, store: str = "mlflow", **extra: str) -> dict:
    """The environment of a local sweep whose MLflow store is ``root/<store>.db``."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{root}/{store}.db", LIME_RESULTS=str(root / "results"),
               LIME_CACHE=str(root / "cache"), PYTHONUNBUFFERED="1")
    return {**env, **extra}


def write_sweep(folder: Path, name: str, base: dict | None = None, **doc) -> Path:
    """``folder/<name>.yaml``: a sweep of ``base`` (default TINY) at one CPU per trial, plus ``doc``."""
    d = {"name": name, "description": f"test sweep {name}", "base": base or tiny(), "resources": {"cpu": 1}, **doc}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path
