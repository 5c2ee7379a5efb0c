"""Trial checkpoints: one ``checkpoint.pt`` per trial folder, written atomically.

A checkpoint holds the model, optimizer and scheduler states, every RNG state, the step (the
data position: a batch is a pure function of (seed, step)), the MLflow run id, the logged
metric history and the trial config. Only tensors and plain Python values are stored, so it
loads with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

CKPT_NAME = "checkpoint.pt"


def rng_state() -> dict:
    """The torch, python and numpy RNG states (numpy's as tensors: weights_only loads them)."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])}}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(("MT19937", s["numpy"]["keys"].numpy().astype(np.uint32), s["numpy"]["pos"], 0, 0.0))


def save_checkpoint(path: Path, state: dict) -> Path:
    """Atomic: write a temp file in the same folder, then rename over the old checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt-", suffix=".tmp")
    os.close(fd)
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint file, or the ``checkpoint.pt`` of a folder."""
    p = Path(path)
    if p.is_dir():
        p = p / CKPT_NAME
    return torch.load(p, map_location="cpu", weights_only=True)
