"""The routing alone: its forward and backward on random K/V, outside the model.

The benchmark's step-time ratio measures the routing inside a training step, where the layers'
weights stream through the caches between a slot's write and its reads. This measures the same
mixer calls (write, products, gradient bookkeeping) on their own, for the same shapes, in the
same process, minus the ``none`` mixer's cost (its transposes and autograd). If the routing
alone already costs more than a target, no integration can meet it on this machine with these
kernels: the report marks such rows ``kernel-bound``, with the products' achieved GFLOP/s.
"""
from __future__ import annotations

import statistics

import torch

from lime_arch.config import ModelConfig
from lime_arch.routers import build_router
from lime_arch.routing.mixers import make_mixer


def _case(cfg: ModelConfig, batch: int, seq: int, device: torch.device):
    g = torch.Generator(device="cpu").manual_seed(0)
    L, R, Hd = cfg.n_layers, cfg.kv_heads, cfg.head_dim
    router = build_router(cfg.router, n_layers=L, n_kv_heads=R, head_dim=Hd, init=cfg.router_init,
                          options=cfg.router_dynamic, d_model=cfg.d_model).to(device)
    kv = [torch.randn(batch, seq, R, Hd, generator=g).to(device).requires_grad_() for _ in range(2 * L)]
    gout = [torch.randn(batch, R, seq, Hd, generator=g).to(device) for _ in range(2 * L)]
    # the layers' queries: token-dependent kinds read them (and their gradient flows back to them)
    q = [torch.randn(batch, seq, cfg.n_heads, Hd, generator=g).to(device).requires_grad_() for _ in range(L)]
    # and their normed inputs (the dynamic kind's hidden-state scores read them)
    x = [torch.randn(batch, seq, cfg.d_model, generator=g).to(device).requires_grad_() for _ in range(L)]

    def run() -> None:
        mixer = make_mixer(router, cfg.routing_impl)
        outs = []
        for l in range(L):
            outs.extend(mixer.route(l, kv[2 * l], kv[2 * l + 1], q=q[l], x=x[l]))
        torch.autograd.backward(outs, gout)
        for t in kv + q + x:
            t.grad = None
        for p in router.parameters():
            p.grad = None
    return run


def time_alone(cfgs: dict[str, ModelConfig], batch: int, seq: int, device: torch.device, reps: int,
               clock) -> dict[str, float]:
    """Median seconds of the routing's forward + backward per label, minus ``none``'s (interleaved)."""
    runs = {lab: _case(c, batch, seq, device) for lab, c in cfgs.items()}
    times = {lab: [] for lab in runs}
    for run in runs.values():
        run()  # warm-up: plans, pooled buffers
    for r in range(reps):
        labs = list(runs)
        for lab in labs[r % len(labs):] + labs[:r % len(labs)]:
            t0 = clock()
            runs[lab]()
            times[lab].append(clock() - t0)
    base = statistics.median(times["none"])
    return {lab: max(0.0, statistics.median(t) - base) for lab, t in times.items()}
