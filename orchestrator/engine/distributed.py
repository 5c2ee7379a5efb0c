"""Data-parallel training of one trial on several workers (processes, one per device).

Every worker runs the same ``Trainer`` with a ``DistributedHook``; ``torch.distributed`` must be
initialised already (Ray Train's ``TorchTrainer`` does it: gloo on CPU, NCCL on GPU; see
``orchestrator.sweep.workers``).

- Data: a step's global batch is ``train.batch_size`` sequences, the same pure function of
  (seed, step) as in one process; worker r trains on rows [r*B/N, (r+1)*B/N) of it
  (``RankSlice``), so the data order does not depend on the number of workers.
- Gradients: DDP (``ddp``, the default) averages them over the workers during backward; FSDP2
  (``fsdp``) also shards parameters, gradients and optimizer state (one unit per decoder block
  and one for the rest). A worker whose slice holds a different share of the global batch's
  target tokens than 1/N (masked targets of the synthetic tasks) has its gradient scaled by
  n_r * N / n_global, so the average is exactly the gradient of the global batch's mean loss.
- The step's loss (``after_backward``): the target-token-weighted sum of the workers' losses
  over the global batch's target tokens, the same number on every worker, so all of them stop
  at the same step when it is NaN. Exact when every micro-batch splits its targets evenly
  (language-model data) or ``grad_accum`` is 1.
- Checkpoints: DDP state is identical everywhere, so only rank 0 writes; FSDP2 gathers the
  full state dict on every rank and rank 0 writes it, in the one-process format (a checkpoint
  resumes with any number of workers, or in ``lime train``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from orchestrator.engine.checkpoint import CKPT_NAME, rng_state, save_checkpoint
from orchestrator.engine.data import IGNORE
from orchestrator.engine.schedule import make_optimizer
from orchestrator.engine.trainer import Hook, Trainer

STRATEGIES = ("ddp", "fsdp")


def check_split(batch_size: int, workers: int) -> str | None:
    """Why a global batch cannot be split over the workers, or None."""
    if workers > 1 and batch_size % workers:
        return f"train.batch_size {batch_size} is not a multiple of resources.workers {workers}"
    return None


class RankSlice:
    """A data object whose training batches are this worker's rows of the global batch; every
    other attribute is the wrapped data object's."""

    def __init__(self, data, rank: int, world: int):
        self.data, self.rank, self.world = data, rank, world
        self.weight = 1.0  # gradient scale of the last slice (1.0: its share of targets is 1/N)
        self.tokens = [0, 0]  # target tokens of this step: this slice's, the global batch's

    def train_batch(self, index: int, batch_size: int, seq_len: int, seed: int):
        x, y = self.data.train_batch(index, batch_size, seq_len, seed)  # (B, T) each: the global batch
        n = x.shape[0] // self.world
        rows = slice(self.rank * n, (self.rank + 1) * n)
        xs, ys = x[rows], y[rows]  # (B/N, T)
        n_local, n_global = int((ys != IGNORE).sum()), int((y != IGNORE).sum())
        self.weight = n_local * self.world / n_global if n_global and n_local * self.world != n_global else 1.0
        self.tokens[0] += n_local
        self.tokens[1] += n_global
        return xs, ys

    def __getattr__(self, name: str):
        return getattr(self.data, name)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``w`` (a worker's share of the target tokens)."""

    @staticmethod
    def forward(ctx, x, w: float):
        ctx.w = w
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w, None


class _Forward(torch.nn.Module):
    """The loop's forward: the wrapped model, with the slice's gradient scale when it is not 1
    (a module, so the trainer's eval()/train() reach the model)."""

    def __init__(self, fwd, data: RankSlice):
        super().__init__()
        self.fwd, self.data = fwd, data

    def forward(self, x):
        logits = self.fwd(x)  # (B/N, T, V)
        w = self.data.weight
        return logits if w == 1.0 or not torch.is_grad_enabled() else _ScaleGrad.apply(logits, w)


class DistributedHook(Hook):
    """Data-parallel training of the trainer ``t`` on ``world`` workers (this one is ``rank``).

    Put it first in the hook list: it replaces ``t.data`` and ``t.fwd`` in ``on_start``."""

    def __init__(self, rank: int, world: int, strategy: str = "ddp"):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.rank, self.world, self.strategy = rank, world, strategy

    def on_start(self, t: Trainer) -> None:
        if t.cfg.train.batch_size % self.world:
            raise ValueError(check_split(t.cfg.train.batch_size, self.world))
        t.data = RankSlice(t.data, self.rank, self.world)
        if self.strategy == "ddp":
            cuda = t.device.type == "cuda"
            device = (t.device.index if t.device.index is not None else torch.cuda.current_device()) if cuda else None
            model = torch.nn.parallel.DistributedDataParallel(
                t.model, device_ids=[device] if cuda else None,
                forward_sync_buffers=False)  # the only buffers are the RoPE tables, the same everywhere
            if self.rank != 0:
                t.save = lambda: None  # every worker holds the same state: rank 0 writes it
        else:
            model = _fully_shard(t)
            t.save = lambda: _save_full(t, self.rank)
        t.fwd = _Forward(torch.compile(model) if t.cfg.train.compile else model, t.data)

    def after_backward(self, t: Trainer, loss: float) -> float:
        n_local, n_global = t.data.tokens
        t.data.tokens = [0, 0]
        # this worker's summed target losses (as a share of the global batch), summed over workers
        part = torch.tensor([loss * n_local / max(n_global, 1)], dtype=torch.float64, device=_comm_device(t))
        dist.all_reduce(part)
        return float(part.item())


def _comm_device(t: Trainer) -> torch.device:
    return t.device if dist.get_backend() == "nccl" else torch.device("cpu")


def _fully_shard(t: Trainer):
    """FSDP2 over the decoder blocks and the whole model; the optimizer rebuilt over the sharded
    parameters with the state it had (a resumed trial's)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    full = StateDictOptions(full_state_dict=True)
    osd = get_optimizer_state_dict(t.model, t.optimizer, options=full) if t.resumed else None
    sched = t.scheduler.state_dict()
    for block in _blocks(t.model):
        fully_shard(block)
    fully_shard(t.model)
    t.optimizer, t.scheduler = make_optimizer(t.model, t.cfg.optim, t.cfg.train.steps)
    t.scheduler.load_state_dict(sched)
    if osd is not None:
        set_optimizer_state_dict(t.model, t.optimizer, osd, options=full)
    return t.model


def _blocks(model) -> list[torch.nn.Module]:
    """The repeated decoder blocks: the modules of the model's longest ModuleList."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _save_full(t: Trainer, rank: int) -> str | None:
    """Gather the full (unsharded) state on every rank; rank 0 writes the usual checkpoint."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_state_dict(t.model, t.optimizer, options=opts)
    if rank != 0:
        return None
    save_checkpoint(t.ckpt_dir / CKPT_NAME, {
        "model": msd, "optimizer": _index_keyed(osd, t), "scheduler": t.scheduler.state_dict(), "rng": rng_state(),
        "step": t.step, "run_id": t.run_id, "history": t.history, "config": t.cfg.to_dict(),
        "vocab_size": t.mcfg.vocab_size})
    return str(t.ckpt_dir)


def _index_keyed(osd: dict, t: Trainer) -> dict:
    """A parameter-name-keyed optimizer state dict in ``torch.optim``'s own format (parameters
    numbered in parameter-group order), which ``Optimizer.load_state_dict`` reads."""
    names = {id(p): n for n, p in t.model.named_parameters()}
    index, groups = {}, []
    by_name = {tuple(g["params"]): g for g in osd["param_groups"]}
    for group in t.optimizer.param_groups:
        fqns = [names[id(p)] for p in group["params"]]
        index.update({n: len(index) + i for i, n in enumerate(fqns)})
        saved = by_name.get(tuple(fqns), {k: v for k, v in group.items() if k != "params"})
        groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": [index[n] for n in fqns]})
    return {"state": {index[n]: v for n, v in osd["state"].items()}, "param_groups": groups}
