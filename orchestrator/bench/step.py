"""One benchmarked training step: the model config of a case, the optimizer, the step, the clock.

Both the timing (all variants of a shape on one shared decoder body) and the memory worker (a
standalone model per case, ``make_step``) run the same ``train_step``: forward, cross-entropy,
backward, AdamW step. CPU runs fp32; CUDA runs bf16 autocast with flash-attn. With a compile mode
the forward is ``torch.compile(model, mode=...)`` (Inductor; the routing runs as its custom ops,
``lime_arch.routing.ops``); the loss and the optimizer step stay eager, as in the trainer.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from lime_arch.config import ModelConfig, preset
from lime_arch.depth_mix import build_depth_mix
from lime_arch.errors import ConfigError
from lime_arch.model import build_model
from lime_arch.optim import param_groups
from lime_arch.routers import build_router
from orchestrator.bench.shapes import SEQ, VOCAB, Shape, split_label


def device_of(device: str | None) -> torch.device:
    """The requested device (default: cuda when available); cuda without a CUDA device is a
    ConfigError, raised before anything is measured."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("bench.device: cuda requested but torch sees no CUDA device here")
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def bench_cfg(shape: Shape, label: str, device: torch.device, seq: int = SEQ, vocab: int = VOCAB) -> ModelConfig:
    """The model of one case; ``label`` is a router spec, ``router/impl`` for another mixer,
    ``router+depth_mix`` with a depth mix (``shapes.split_label``)."""
    router, impl, depth_mix = split_label(label)
    attn = "flash" if device.type == "cuda" else "sdpa"
    return preset("deep32", n_layers=shape.n_layers, n_kv_heads=shape.n_kv_heads, router=router,
                  routing_impl=impl, depth_mix=depth_mix, vocab_size=vocab, max_seq_len=seq, attn_impl=attn)


def autocast(device: torch.device, amp: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if amp and device.type == "cuda" else nullcontext()


def train_step(model, opt, idx, device, amp, accum: int = 1) -> None:
    """``model``: the module or its compiled form; ``opt`` holds the module's parameters. ``accum``
    micro-batches (forward and backward each, on the same tokens) before the optimizer step, as a
    trial with ``train.grad_accum`` runs them (``lime report --throughput`` times a sweep's step)."""
    opt.zero_grad(set_to_none=True)
    for _ in range(accum):
        with autocast(device, amp):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        (loss / accum if accum > 1 else loss).backward()
    opt.step()


def adamw(model):
    """AdamW with lime_arch's parameter groups; the fused kernel where this torch has it. The
    for-loop implementation costs ~1 ms of Python per parameter tensor on the dev CPU, so every
    router weight matrix (one per layer) would add optimizer time unrelated to routing."""
    groups = param_groups(model, lr=1e-4, weight_decay=0.1)
    try:
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8)


def compiled(model, mode: str | None, variants: int = 1):
    """``model`` itself (``mode`` None) or ``torch.compile(model, mode=mode)``. A shared body swaps
    routers, and Dynamo compiles each variant once (its guards see the router). Dynamo counts
    recompiles per code object across every model of the process (``Decoder.forward``), so each
    shape starts from a reset (the previous shape's graphs are of no further use), the limit holds
    this shape's variants, and hitting it raises instead of silently running the rest eagerly,
    which would be timed as "compiled" rows."""
    if mode is None:
        return model
    torch._dynamo.reset()
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(8, 2 * variants)
    cfg.fail_on_recompile_limit_hit = True
    return torch.compile(model, mode=mode)


def make_step(cfg: ModelConfig, batch: int, seq: int, device: torch.device, amp: bool, compile_mode: str | None = None,
              accum: int = 1, variants: int = 1):
    """A standalone model, optimizer and batch: ``step()`` runs one training step (the memory worker;
    ``lime report --throughput``, whose ``variants`` models are compiled in one process)."""
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    opt = adamw(model)
    fwd = compiled(model, compile_mode, variants)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    return lambda: train_step(fwd, opt, idx, device, amp, accum)


def clock(device: torch.device, threads: int):
    """(clock function, its name). On CPU with one thread the thread's CPU time (CPU autograd runs
    on the calling thread), which a loaded shared machine disturbs far less than wall time; with
    more threads wall time; on CUDA wall time after a synchronize."""
    if device.type == "cuda":
        def cuda_clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()
        return cuda_clock, "wall (CUDA synchronized)"
    if threads == 1:
        return time.thread_time, "thread CPU time"
    return time.perf_counter, "wall"


class SharedBody:
    """All variants of one shape on one decoder body (same weights); each variant brings its own
    router, depth mix and AdamW param groups, the body's optimizer state is shared. ``compile_mode``:
    the forward compiled (one graph per variant)."""

    def __init__(self, shape: Shape, labels, device, amp, batch, seq, compile_mode: str | None = None):
        torch.manual_seed(0)
        self.device, self.amp = device, amp
        self.cfgs = {lab: bench_cfg(shape, lab, device, seq) for lab in labels}
        self.model = build_model(self.cfgs[labels[0]]).to(device)
        self.fwd = compiled(self.model, compile_mode, len(labels))
        self.routers = {lab: build_router(c.router, n_layers=c.n_layers, n_kv_heads=c.kv_heads, head_dim=c.head_dim,
                                          init=c.router_init, options=c.router_dynamic, d_model=c.d_model).to(device)
                        for lab, c in self.cfgs.items()}
        self.mixes = {lab: build_depth_mix(c.depth_mix, n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads,
                                           n_kv_heads=c.kv_heads, head_dim=c.head_dim, norm_eps=c.norm_eps,
                                           std=c.std).to(device) for lab, c in self.cfgs.items()}
        self.body = [p for n, p in self.model.named_parameters() if not n.startswith(("router.", "depth_mix."))]
        self.opts: dict[str, torch.optim.Optimizer] = {}
        self.state: dict | None = None
        self.idx = torch.randint(0, VOCAB, (batch, seq + 1), device=device)

    def step(self, label: str) -> None:
        m = self.model
        m.router, m.depth_mix, m.cfg = self.routers[label], self.mixes[label], self.cfgs[label]
        if label not in self.opts:
            opt = self.opts[label] = adamw(m)
            if self.state is not None:  # share the body's AdamW state (memory; values are irrelevant)
                for p in self.body:
                    opt.state[p] = self.state[p]
        train_step(self.fwd, self.opts[label], self.idx, self.device, self.amp)
        if self.state is None:
            self.state = {p: self.opts[label].state[p] for p in self.body}
