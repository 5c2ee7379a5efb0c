"""The optimizer, its learning-rate schedule, seeding and devices of a trial.

AdamW over lime_arch's parameter groups (decay, no_decay and the router's own group with its
own learning rate and no weight decay), linear warmup then cosine, linear or constant decay.
"""
from __future__ import annotations

import math
import random
import resource

import numpy as np
import torch

from lime_arch import param_groups
from orchestrator.engine.trial_config import OptimConfig


def lr_multiplier(step: int, *, schedule: str, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine or linear decay to ``min_ratio`` at ``total`` (or constant)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1 - frac
    return min_ratio + (1 - min_ratio) * decay


def make_optimizer(model: torch.nn.Module, oc: OptimConfig, total_steps: int):
    """AdamW and its LambdaLR schedule; every group's lr follows the same multiplier."""
    groups = param_groups(model, lr=oc.lr, weight_decay=oc.weight_decay, router_lr=oc.router_lr,
                          router_lr_mult=oc.router_lr_mult)
    opt = torch.optim.AdamW(groups, betas=(oc.beta1, oc.beta2), eps=oc.eps)
    # a plain function, not a partial: LambdaLR stores a callable object's __dict__ in its
    # state_dict, which would change what a checkpoint holds
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(
        s, schedule=oc.schedule, warmup=oc.warmup_steps, total=total_steps, min_ratio=oc.min_lr / oc.lr))
    return opt, sched


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def peak_mem_mb(device: torch.device) -> float:
    """CUDA: the allocator's peak; CPU: the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mb()


def peak_rss_mb() -> float:
    """The process's peak resident set in MB: Linux's VmHWM, which ``/proc/self/clear_refs``
    restarts (``startup.reset_peak_memory``, between the trials of a reused worker). Not
    ``ru_maxrss``: it also keeps the peak of every thread that has exited (the kernel folds a
    thread's peak into the process's record when it ends), so it cannot start again."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS
