"""Helpers of the evaluation tests: tiny models and the local task folder (``tasks/``: harness
YAML tasks with their JSON data)."""
from __future__ import annotations

from pathlib import Path

import torch

from lime_arch import build_model, preset

TASKS = Path(__file__).with_name("tasks")
TINY = {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64, "vocab_size": 257}


def tiny_model(router: str = "full", depth_mix: str = "none", dtype=torch.float32, seed: int = 0, **over):
    """A 2-layer byte-vocabulary model in eval mode (float64 for hand computations)."""
    torch.manual_seed(seed)
    m = build_model(preset("tiny", router=router, depth_mix=depth_mix, **{**TINY, **over}))
    return m.to(dtype).eval()
