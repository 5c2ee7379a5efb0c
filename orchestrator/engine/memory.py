"""Training memory attributable to the model, as metrics (``MemoryHook``).

The process's resident set says little on CPU: a 50k-parameter model trains in ~500 MB of RSS,
almost all of it torch, Python and the data, the same for every router. What a router changes is
what one training step holds:

  perf/saved_activations_mb  bytes the forward keeps for backward: every storage autograd saves
                             (saved-tensor hooks; each storage once, parameters left out) plus the
                             K/V buffers the routing holds for its backward outside autograd's
                             saved tensors (``lime_arch.routing.state.held_bytes``). Measured on the
                             first micro-batch of the first step and of every step before a log point.
                             Compiled models save what AOTAutograd's partitioner keeps (often less).
                             The loss's own saved tensors (the log-softmax of the logits) are not
                             part of the model's forward and are left out.
  perf/model_state_mb        parameters + their gradients (one per trainable parameter, as large) +
                             optimizer state (AdamW: two moments and a step counter per tensor)
  perf/train_mem_mb          the sum of the two: the model's training memory, short of transients
  perf/cuda_peak_mb          CUDA only: the caching allocator's peak (``max_memory_allocated``)
  perf/rss_peak_mb           the process's peak resident set (VmHWM), for what it is worth

The trainer's ``perf/peak_mem_mb`` (the allocator's peak on CUDA, the RSS on CPU) stays as it was:
reports read it.
"""
from __future__ import annotations

import torch

from lime_arch.saved import SavedBytes, saved_activation_bytes, storages
from orchestrator.engine.schedule import peak_rss_mb
from orchestrator.engine.trainer import Hook, Trainer

MB = 2**20
__all__ = ["MB", "MemoryHook", "SavedBytes", "model_state_bytes", "saved_activation_bytes"]


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of the parameters, of their gradients (a trainable parameter's gradient is as large
    as the parameter, whether or not it exists at this moment) and of the optimizer's state tensors."""
    params = list(model.parameters())
    state = []
    if optimizer is not None:
        for st in optimizer.state.values():
            state.extend(v for v in st.values() if isinstance(v, torch.Tensor))
    return {"params": sum(storages(params).values()),
            "grads": sum(storages(p for p in params if p.requires_grad).values()),
            "optimizer": sum(storages(state).values())}


class _Measured:
    """``t.fwd`` that measures the saved bytes of the forwards where ``due()``; everything else
    (``eval()``, ``train()``, attributes) goes to the wrapped callable."""

    def __init__(self, inner, hook: MemoryHook, t: Trainer):
        self.inner, self.hook, self.t, self.first = inner, hook, t, t.step

    def due(self) -> bool:
        t, tr = self.t, self.t.cfg.train
        return t.step == self.first or (t.step + 1) % tr.log_interval == 0 or t.step + 1 == tr.steps

    def __call__(self, *args, **kwargs):
        if not (torch.is_grad_enabled() and self.due()):
            return self.inner(*args, **kwargs)
        out, self.hook.saved = saved_activation_bytes(self.inner, *args, exclude=self.t.model.parameters(), **kwargs)
        return out

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class MemoryHook(Hook):
    """The memory metrics above at every log point (wraps ``t.fwd`` to measure a step's saved bytes)."""

    def __init__(self):
        self.saved: int | None = None

    def on_start(self, t: Trainer) -> None:
        t.fwd = _Measured(t.fwd, self, t)

    def log_metrics(self, t: Trainer) -> dict[str, float]:
        state = sum(model_state_bytes(t.model, t.optimizer).values())
        out = {"perf/model_state_mb": state / MB,
               "perf/rss_peak_mb": peak_rss_mb()}
        if self.saved is not None:
            out["perf/saved_activations_mb"] = self.saved / MB
            out["perf/train_mem_mb"] = (self.saved + state) / MB
        if t.device.type == "cuda":
            out["perf/cuda_peak_mb"] = torch.cuda.max_memory_allocated(t.device) / MB
        return out
