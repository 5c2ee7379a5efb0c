"""The one training engine: ``run_trial(TrialConfig)``, used by the CLI, Ray Tune and tests.

AdamW with lime_arch's parameter groups, warmup + cosine/linear/constant schedules, gradient
clipping and accumulation, bf16 autocast on CUDA (fp32 on CPU), optional torch.compile.
Everything is seeded and every batch is a pure function of (seed, step), so a checkpoint needs
only the step as its data position and a resumed run continues bit for bit on CPU.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lime_arch import build_model, flops_per_token, param_counts, param_groups
from orchestrator.engine.config import TrialConfig
from orchestrator.engine.data import IGNORE, make_batches

CKPT_NAME = "checkpoint.pt"


@dataclass
class Tracking:
    """Where a trial logs. ``run_id`` continues an existing MLflow run (retry, resume)."""

    experiment: str = "lime-train"
    run_id: str | None = None
    parent_run_id: str | None = None
    run_name: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True


@dataclass
class TrialResult:
    status: str  # finished | diverged | stopped
    step: int
    final_val_loss: float | None
    final_val_ppl: float | None
    run_id: str | None
    checkpoint: str | None
    history: list[dict] = field(default_factory=list)  # the logged metric dicts, in order
    metrics: dict[str, float] = field(default_factory=dict)  # the last value of every metric


def lr_multiplier(step: int, *, schedule: str, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine or linear decay to ``min_ratio`` at ``total`` (or constant)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1 - frac
    return min_ratio + (1 - min_ratio) * decay


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])}}


def _set_rng_state(s: dict) -> None:
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
    p = Path(path)
    if p.is_dir():
        p = p / CKPT_NAME
    return torch.load(p, map_location="cpu", weights_only=True)


@torch.no_grad()
def evaluate_loss(model, batches, device, autocast) -> float:
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast():
            logits = model(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                                 reduction="sum").item()
        count += int((y != IGNORE).sum())
    model.train()
    return total / max(count, 1)


def run_trial(cfg: TrialConfig, *, tracking: Tracking | None = None, resume: str | Path | None = None,
              on_log: Callable[[int, dict, str | None], None] | None = None,
              stop_at: int | None = None) -> TrialResult:
    """Train one trial. ``on_log(step, metrics, checkpoint_dir)`` is called at every log point
    (``checkpoint_dir`` when a checkpoint was just written); ``stop_at`` ends early with a
    checkpoint, as an interruption would."""
    cfg.validate()
    tr, oc = cfg.train, cfg.optim
    tracking = tracking or Tracking()
    if tr.threads:
        torch.set_num_threads(tr.threads)
    seed_everything(tr.seed)
    data = make_batches(cfg.data)
    mcfg = cfg.model_config(vocab_size=data.vocab_size)
    device = pick_device(tr.device)
    model = build_model(mcfg).to(device)
    fwd = torch.compile(model) if tr.compile else model
    groups = param_groups(model, lr=oc.lr, weight_decay=oc.weight_decay, router_lr=oc.router_lr,
                          router_lr_mult=oc.router_lr_mult)
    opt = torch.optim.AdamW(groups, betas=(oc.beta1, oc.beta2), eps=oc.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(
        s, schedule=oc.schedule, warmup=oc.warmup_steps, total=tr.steps, min_ratio=oc.min_lr / oc.lr))
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" \
        else contextlib.nullcontext

    step, run_id, history = 0, tracking.run_id, []
    if resume is not None:
        ck = load_checkpoint(resume)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        _set_rng_state(ck["rng"])
        step, run_id = int(ck["step"]), run_id or ck.get("run_id")
        history = list(ck.get("history", []))

    logger = None
    if tracking.enabled:
        from orchestrator.core.tracking import RunLogger, git_sha

        n_layers = mcfg.n_layers
        tags = {"router": mcfg.router, "preset": cfg.preset, "n_layers": n_layers, "seed": tr.seed,
                "git_sha": git_sha(), "status": "running", **tracking.tags}
        logger = RunLogger(tracking.experiment, run_id=run_id, run_name=tracking.run_name, tags=tags,
                           parent_run_id=tracking.parent_run_id)
        run_id = logger.run_id
        if resume is None:
            logger.log_params({**cfg.to_dict(), "resolved": {"model": mcfg.to_dict()}, "data_info": data.describe()})
            counts = param_counts(mcfg)
            logger.log_metrics({"model/params": counts["total"], "model/router_params": counts["router"],
                                "model/flops_per_token": flops_per_token(mcfg, tr.seq_len)["total"]}, 0, flush=True)

    ckpt_dir = Path(tr.checkpoint_dir) if tr.checkpoint_dir else Path(tempfile.mkdtemp(prefix="lime-ckpt-"))
    val = data.val_batches(tr.batch_size, tr.seq_len, tr.eval_batches)
    tokens_per_step = tr.batch_size * tr.seq_len * tr.grad_accum

    def checkpoint() -> str:
        save_checkpoint(ckpt_dir / CKPT_NAME, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "rng": _rng_state(), "step": step, "run_id": run_id, "history": history,
            "config": cfg.to_dict(), "vocab_size": mcfg.vocab_size})
        return str(ckpt_dir)

    def emit(metrics: dict, with_checkpoint: bool = False) -> str | None:
        # the history goes into the checkpoint, so it is appended before the checkpoint is written
        history.append({"step": step, **metrics})
        ck = checkpoint() if with_checkpoint else None
        if logger:
            logger.log_metrics(metrics, step, flush=ck is not None)
        if on_log:
            on_log(step, metrics, ck)
        return ck

    status, window, losses, norms, last_ckpt = "finished", [], [], [], step
    try:
        model.train()
        while step < tr.steps:
            t0 = time.perf_counter()
            loss_sum = 0.0
            for micro in range(tr.grad_accum):
                x, y = data.train_batch(step * tr.grad_accum + micro, tr.batch_size, tr.seq_len, tr.seed)
                x, y = x.to(device), y.to(device)
                with autocast():
                    logits = fwd(x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)
                (loss / tr.grad_accum).backward()
                loss_sum += loss.item() / tr.grad_accum
            if not math.isfinite(loss_sum):
                status = "diverged"
                step += 1
                emit({"train/loss": loss_sum if not math.isnan(loss_sum) else float("nan")})
                break
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), oc.grad_clip if oc.grad_clip > 0 else float("inf"))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            window.append(time.perf_counter() - t0)
            losses.append(loss_sum)
            norms.append(float(gn))
            step += 1
            do_log = step % tr.log_interval == 0 or step == tr.steps or step == stop_at
            do_eval = step % tr.eval_interval == 0 and step < tr.steps  # the final eval comes below
            if do_log or do_eval:
                metrics = {}
                if do_log:
                    med = statistics.median(window)
                    metrics = {"train/loss": statistics.fmean(losses), "train/lr": opt.param_groups[0]["lr"],
                               "train/grad_norm": statistics.fmean(norms), "train/tokens_per_s": tokens_per_step / med,
                               "perf/step_time_ms": 1000 * med, "perf/peak_mem_mb": peak_mem_mb(device)}
                    window, losses, norms = [], [], []
                if do_eval:
                    vl = evaluate_loss(fwd, val, device, autocast)
                    metrics.update({"val/loss": vl, "val/ppl": math.exp(min(vl, 50))})
                due = bool(tr.checkpoint_interval) and step - last_ckpt >= tr.checkpoint_interval
                if due or step == stop_at:
                    last_ckpt = step
                emit(metrics, with_checkpoint=due or step == stop_at)
            if stop_at is not None and step >= stop_at and step < tr.steps:
                if logger:
                    logger.flush()
                return TrialResult("stopped", step, None, None, run_id, str(ckpt_dir), history, _last(history))
        final = {}
        if status == "finished":
            vl = evaluate_loss(fwd, val, device, autocast)
            final = {"val/loss": vl, "val/ppl": math.exp(min(vl, 50)), "final/val_loss": vl,
                     "final/val_ppl": math.exp(min(vl, 50))}
            model.eval()
            task_metrics = data.evaluate(model, device)
            model.train()
            final.update(task_metrics)
            final.update({f"final/{k.split('/', 1)[1]}": v for k, v in task_metrics.items() if k.startswith("val/")})
            if tr.analyze:  # optional end-of-trial representation analysis (issue 8)
                from orchestrator.analysis.run import analyze_model

                analysis = analyze_model(model, data, sequences=tr.analyze_sequences, seq_len=tr.seq_len)
                final.update(analysis.metrics)
        ck = emit(final, with_checkpoint=True) if final else checkpoint()
        if logger:
            _log_artifacts(logger, cfg, mcfg, model)
            logger.end(status)
        return TrialResult(status, step, final.get("final/val_loss"), final.get("final/val_ppl"), run_id,
                           ck, history, _last(history))
    except BaseException as e:
        if logger:
            logger.flush()
            logger.end("killed" if isinstance(e, KeyboardInterrupt) else "failed")
        raise


def _last(history: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for h in history:
        out.update({k: v for k, v in h.items() if k != "step"})
    return out


def _log_artifacts(logger, cfg: TrialConfig, mcfg, model) -> None:
    """Resolved config YAML, the final router weights and their heatmap (paper Figure 5)."""
    import yaml

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "config.yaml"
        p.write_text(yaml.safe_dump({**cfg.to_dict(), "resolved_model": mcfg.to_dict()}, sort_keys=True))
        logger.log_artifact(p)
        router = model.router
        dense = [router.dense(l).detach().float().cpu().numpy() for l in range(mcfg.n_layers)]
        np.savez(Path(d) / "router_weights.npz", **{f"layer_{l}": w for l, w in enumerate(dense)})
        logger.log_artifact(Path(d) / "router_weights.npz")
        from orchestrator.analysis.metrics import router_source_map
        from orchestrator.analysis.plots import plot_router_map

        m = router_source_map([None] + dense[1:], mcfg.kv_heads)
        plot_router_map(m, Path(d) / "router_heatmap.png", title=f"{mcfg.router}: mean |w| by source layer")
        logger.log_artifact(Path(d) / "router_heatmap.png")
