"""Post-hoc top-p pruning of a trained checkpoint (``lime prune``; the paper's Table 5).

``prune_checkpoint`` loads a checkpoint with its trial's data, measures the validation loss on the
trial's own validation batches (those the trainer evaluates: a corpus's ``data.val_tokens`` in
windows of ``seq_len``, a task's ``train.eval_batches`` x ``train.batch_size`` examples), prunes
every layer's router weights at ``top_p`` (``lime_arch.prune``: per routed head the smallest prefix
of |w| share above ``top_p``, renormalised unless ``renormalize`` is off) and measures it again. A
checkpoint pruned already (in training or by ``lime prune``) keeps its masks: only the weights they
keep are ranked, so a dropped route stays dropped and the counts include the earlier drops. The
outcome holds both losses, the pruned weights per layer (Table 5's counts), the source layers no
longer read and the sources each routed head still reads. ``save_pruned`` writes the pruned model as
a checkpoint of the engine's format whose config carries ``model.router_prune`` (refreshed once, at
the trained step; ``train.compile`` off), so ``lime analyze``, ``lime eval`` and ``lime export``
load it with its masks.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from lime_arch import ConfigError, ModelConfig, build_model
from lime_arch import prune as lime_prune
from lime_arch.routers import parse_router
from orchestrator.engine.checkpoint import CKPT_NAME, read_model_checkpoint, save_checkpoint
from orchestrator.engine.data import make_batches
from orchestrator.engine.trainer import evaluate_loss
from orchestrator.engine.trial_config import TrialConfig


@dataclass
class Pruned:
    path: Path
    cfg: TrialConfig
    model: torch.nn.Module
    vocab_size: int
    step: int
    run_id: str | None
    top_p: float
    renormalize: bool
    loss_before: float
    loss_after: float
    stats: lime_prune.PruneStats

    @property
    def change(self) -> float:
        return self.loss_after - self.loss_before


@dataclass
class Prunable:
    """A checkpoint whose router can be pruned (read and checked, nothing computed yet)."""

    file: Path
    ck: dict
    cfg: TrialConfig
    mcfg: ModelConfig


def open_prunable(path: str | Path) -> Prunable:
    """The checkpoint at ``path``, checked: a lime checkpoint whose router has weights to prune.
    ``lime prune`` opens every target this way before it computes anything."""
    f, ck = read_model_checkpoint(path)
    cfg = TrialConfig.from_dict(ck["config"])
    mcfg = cfg.model_config(vocab_size=ck.get("vocab_size"))
    try:
        lime_prune.check_prunable(parse_router(mcfg.router)[0], key="--top-p")
    except ConfigError as e:
        raise ConfigError(f"{f}: {e}") from None
    return Prunable(f, ck, cfg, mcfg)


def prune_checkpoint(path: str | Path | Prunable, top_p: float, *, renormalize: bool = True,
                     device: str | torch.device = "cpu") -> Pruned:
    """Prune a checkpoint's router at ``top_p``; the validation loss before and after."""
    if not 0 < top_p < 1:
        raise ConfigError(f"--top-p: must be in (0, 1), got {top_p}")
    opened = path if isinstance(path, Prunable) else open_prunable(path)
    f, ck, cfg, mcfg = opened.file, opened.ck, opened.cfg, opened.mcfg
    data = make_batches(cfg.data)
    model = build_model(mcfg)
    model.load_state_dict(ck["model"])
    model.to(device)
    tr = cfg.train
    val = data.val_batches(tr.batch_size, tr.seq_len, tr.eval_batches)
    before = evaluate_loss(model, val, torch.device(device), contextlib.nullcontext)
    lime_prune.refresh(model.router, top_p, renormalize=renormalize, step=int(ck.get("step", 0)), only_kept=True)
    after = evaluate_loss(model, val, torch.device(device), contextlib.nullcontext)
    return Pruned(f.parent, cfg, model, mcfg.vocab_size, int(ck.get("step", 0)), ck.get("run_id"), top_p,
                  renormalize, before, after, lime_prune.stats(model.router))


def save_pruned(p: Pruned, folder: str | Path) -> Path:
    """The pruned model as an engine checkpoint in ``folder`` (which must not hold one already)."""
    out = Path(folder).expanduser()
    if (out / CKPT_NAME).exists():
        raise ConfigError(f"--save: {str(out)!r} holds a checkpoint already; choose a new folder")
    d = p.cfg.to_dict()
    d["model"] = {**d["model"], "router_prune": {"top_p": p.top_p, "start": p.step, "every": 0,
                                                 "renormalize": p.renormalize}}
    d["train"] = {**d["train"], "compile": False, "checkpoint_dir": str(out)}
    TrialConfig.from_dict(d)  # the saved config must load
    return save_checkpoint(out / CKPT_NAME, {"model": p.model.state_dict(), "config": d, "vocab_size": p.vocab_size,
                                             "step": p.step, "run_id": None, "history": [],
                                             "pruned_from": {"checkpoint": str(p.path), "run_id": p.run_id}})


def metrics(p: Pruned) -> dict[str, float]:
    """What ``lime prune`` logs on the trial's run, under ``prune/top_p_<p>/``."""
    k = f"prune/top_p_{p.top_p:g}"
    out = {f"{k}/val_loss_before": p.loss_before, f"{k}/val_loss_after": p.loss_after,
           f"{k}/val_loss_change": p.change, f"{k}/pruned_weights": float(sum(p.stats.pruned)),
           f"{k}/router_weights": float(sum(p.stats.total)), f"{k}/pruned_fraction": p.stats.fraction,
           f"{k}/skipped_sources": float(sum(map(len, p.stats.skipped)))}
    out.update({f"{k}/pruned_weights/layer_{l}": float(n) for l, n in enumerate(p.stats.pruned) if l})
    return out


def markdown(label: str, p: Pruned) -> list[str]:
    """One pruned model: the losses, Table 5's counts per layer, the sources each head still reads."""
    st, L = p.stats, len(p.stats.pruned)
    lines = [f"## {label}", "",
             f"`{p.path}` (step {p.step}), router `{p.cfg.model_config(vocab_size=p.vocab_size).router}`, "
             f"{L} layers; top_p = {p.top_p:g}, {'renormalised' if p.renormalize else 'not renormalised'}.", "",
             "| validation loss before | after | change | pruned weights | of | fraction | source layers skipped |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             f"| {p.loss_before:.4f} | {p.loss_after:.4f} | {p.change:+.4f} | {sum(st.pruned)} | {sum(st.total)} | "
             f"{st.fraction:.3f} | {sum(map(len, st.skipped))} |", "",
             "| layer | pruned weights | of | source layers no head reads | kept sources per head |",
             "|---:|---:|---:|---|---|"]
    for l in range(1, L):
        heads = "; ".join(f"h{h}: {_ranges(s)}" for h, s in enumerate(st.kept_sources[l]))
        lines.append(f"| {l} | {st.pruned[l]} | {st.total[l]} | {_ranges(st.skipped[l]) or '-'} | {heads} |")
    if not math.isfinite(p.loss_after):
        lines += ["", "The pruned model's loss is not finite."]
    return lines + [""]


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)
