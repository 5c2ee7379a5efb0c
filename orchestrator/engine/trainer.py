"""The training loop of one trial, in phases (setup, resume, step, evaluate, finish) with hooks.

Setup builds data, model, optimizer and the fixed validation batches; resume restores a
checkpoint; each step runs ``grad_accum`` micro-batches, clips and steps; every log point emits
one metric dict; the finish evaluates a finished trial and writes the last checkpoint. Hooks see
every phase (``Hook``), so tracking, progress and Ray reporting, end-of-trial analysis or a new
kind of logging are hooks, not edits of the loop.

bf16 autocast on CUDA (fp32 on CPU), optional torch.compile. Everything is seeded and every
batch is a pure function of (seed, step), so a checkpoint needs only the step as its data
position and a resumed run continues bit for bit on CPU.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lime_arch import ConfigError, build_model
from orchestrator.core.record import FINAL_VAL_LOSS, FINAL_VAL_LOSS_SE, VAL_LOSS, VAL_LOSS_SE
from orchestrator.core.status import TrialStatus
from orchestrator.engine import final_names
from orchestrator.engine.checkpoint import (
    CKPT_NAME,
    OR_FRESH,
    model_differences,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from orchestrator.engine.data import IGNORE, make_batches
from orchestrator.engine.schedule import make_optimizer, peak_mem_mb, pick_device, seed_everything
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.engine.val_loss import evaluate_loss, mean_and_se, window_losses  # noqa: F401 - evaluate_loss: re-exported


@dataclass
class TrialResult:
    status: TrialStatus  # FINISHED | DIVERGED | STOPPED
    step: int
    final_val_loss: float | None
    final_val_ppl: float | None
    run_id: str | None
    checkpoint: str | None
    history: list[dict] = field(default_factory=list)  # the logged metric dicts, in order
    metrics: dict[str, float] = field(default_factory=dict)  # the last value of every metric


class Hook:
    """What a hook may do at each phase of a trial; every method is a no-op by default.

    A hook gets the ``Trainer`` (``t``): ``t.cfg``, ``t.mcfg`` (resolved model config), ``t.data``,
    ``t.model``, ``t.fwd`` (the callable the loop runs: the model, or its compiled form),
    ``t.optimizer``, ``t.scheduler``, ``t.device``, ``t.step``, ``t.run_id``, ``t.resumed``,
    ``t.history``, ``t.ckpt_dir``, ``t.timings`` (start-up phases, seconds). Hooks run in list
    order at every phase.
    """

    def on_start(self, t: Trainer) -> None:
        """Built, and restored from a checkpoint if resuming; before the first step. A hook may
        wrap ``t.fwd`` here, or set ``t.run_id`` (stored in every later checkpoint)."""

    def before_step(self, t: Trainer) -> None:
        """Before the step's forward passes (``t.step``: the 0-based step about to run), e.g. a
        change of the model that the step must see (``model.router_prune``'s mask refresh)."""

    def after_backward(self, t: Trainer, loss: float) -> float | None:
        """After the step's backward passes, before the finite-loss check, clipping and the
        optimizer step. May return the step's loss to use instead (a multi-worker hook returns
        the loss of the whole global batch, the same on every worker); None keeps it."""
        return None

    def log_metrics(self, t: Trainer) -> dict[str, float]:
        """Extra metrics at a log point, merged after the train/perf metrics of the window."""
        return {}

    def final_metrics(self, t: Trainer) -> dict[str, float]:
        """Extra end-of-trial metrics of a finished trial, after the validation/task metrics."""
        return {}

    def on_log(self, t: Trainer, step: int, metrics: dict, checkpoint: str | None) -> None:
        """Every emitted metric dict (log and eval points, the final one); ``checkpoint`` is the
        checkpoint folder when one was written for this step, else None."""

    def on_stop(self, t: Trainer) -> None:
        """Stopped early by ``stop_at`` (with a checkpoint); the trial will be resumed."""

    def on_end(self, t: Trainer, status: TrialStatus) -> None:
        """Finished or diverged, after the last checkpoint was written."""

    def on_error(self, t: Trainer, exc: BaseException) -> None:
        """An exception leaves the trainer (KeyboardInterrupt: killed); it is re-raised after."""


def last_values(history: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for h in history:
        out.update({k: v for k, v in h.items() if k != "step"})
    return out


@dataclass
class _Window:
    """Step times, losses and gradient norms since the last log point."""

    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)


class Trainer:
    """One trial. ``Trainer(cfg, hooks).run(resume=..., stop_at=...)`` -> ``TrialResult``.

    ``data`` replaces the configured data source (an object with the interface described in
    ``orchestrator.engine.data.corpus``); ``run_id`` is the tracking run to continue.
    """

    def __init__(self, cfg: TrialConfig, hooks: Iterable[Hook] = (), *, data: Any = None,
                 run_id: str | None = None):
        cfg.validate()
        self.cfg, self.hooks = cfg, list(hooks)
        self.step, self.run_id, self.history, self.resumed = 0, run_id, [], False
        self.timings: dict[str, float] = {}  # seconds of the start-up phases (orchestrator.engine.startup)
        self._setup(data)

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Add the block's wall time to ``timings[phase]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - start

    # -- setup and resume ------------------------------------------------------------------------
    def _setup(self, data: Any) -> None:
        tr = self.cfg.train
        if tr.threads:
            torch.set_num_threads(tr.threads)
        seed_everything(tr.seed)
        with self.timed("data"):
            self.data = make_batches(self.cfg.data) if data is None else data
        with self.timed("model"):
            self.mcfg = self.cfg.model_config(vocab_size=self.data.vocab_size)
            self.device = pick_device(tr.device)
            self.model = build_model(self.mcfg).to(self.device)
            self.fwd = torch.compile(self.model) if tr.compile else self.model
            self.optimizer, self.scheduler = make_optimizer(self.model, self.cfg.optim, tr.steps)
        cuda = self.device.type == "cuda"
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
        self.ckpt_dir = Path(tr.checkpoint_dir) if tr.checkpoint_dir else Path(tempfile.mkdtemp(prefix="lime-ckpt-"))
        with self.timed("data"):
            self.val = self.data.val_batches(tr.batch_size, tr.seq_len, tr.eval_batches)
        self.tokens_per_step = tr.batch_size * tr.seq_len * tr.grad_accum

    def resume(self, path: str | Path) -> None:
        """Model, optimizer, scheduler, RNGs, step, run id and history from a checkpoint (one
        ConfigError line if it is none, or of another model: ``checkpoint.read_checkpoint``)."""
        ck = read_checkpoint(path)
        diff = model_differences(ck, self.mcfg.to_dict())
        if diff:
            raise ConfigError(f"--resume {path}: the checkpoint's model differs from this config ({'; '.join(diff)}); "
                              f"resume with the checkpoint's settings, {OR_FRESH}")
        try:
            self.model.load_state_dict(ck["model"])
            self.optimizer.load_state_dict(ck["optimizer"])
            self.scheduler.load_state_dict(ck["scheduler"])
        except (RuntimeError, ValueError, KeyError) as e:  # an older checkpoint (no model_config) of another model
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()[:200]
            raise ConfigError(f"--resume {path}: the checkpoint does not fit this config's model or optimizer "
                              f"({first}); resume with the checkpoint's settings, {OR_FRESH}") from None
        set_rng_state(ck["rng"])
        self.step, self.run_id = int(ck["step"]), self.run_id or ck.get("run_id")
        self.history, self.resumed = list(ck.get("history", [])), True

    def save(self) -> str:
        """Write the checkpoint; returns its folder."""
        save_checkpoint(self.ckpt_dir / CKPT_NAME, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "rng": rng_state(), "step": self.step,
            "run_id": self.run_id, "history": self.history, "config": self.cfg.to_dict(),
            "vocab_size": self.mcfg.vocab_size, "model_config": self.mcfg.to_dict()})
        return str(self.ckpt_dir)

    # -- the run ---------------------------------------------------------------------------------
    def run(self, *, resume: str | Path | None = None, stop_at: int | None = None) -> TrialResult:
        """Train to ``train.steps`` (or ``stop_at``: stop there with a checkpoint, as an
        interruption would) and finish."""
        if resume is not None:
            with self.timed("resume"):
                self.resume(resume)
        try:
            self._call("on_start")
            status = self._train(stop_at)
            if status is TrialStatus.STOPPED:
                self._call("on_stop")
                return self._result(status, {}, str(self.ckpt_dir))
            return self.finish(status)
        except BaseException as e:
            self._call("on_error", e)
            raise

    def _train(self, stop_at: int | None) -> TrialStatus:
        tr = self.cfg.train
        window, self._last_ckpt = _Window(), self.step
        self.model.train()
        while self.step < tr.steps:
            t0 = time.perf_counter()
            self._call("before_step")
            loss = self.forward_backward()
            for h in self.hooks:
                got = h.after_backward(self, loss)
                loss = loss if got is None else got
            if not math.isfinite(loss):
                self.step += 1
                self.emit({"train/loss": float("nan") if math.isnan(loss) else loss})
                return TrialStatus.DIVERGED
            norm = self.optimizer_step()
            window.times.append(time.perf_counter() - t0)
            window.losses.append(loss)
            window.norms.append(norm)
            self.step += 1
            if self._log_point(window, stop_at):
                window = _Window()
            if stop_at is not None and self.step >= stop_at and self.step < tr.steps:
                return TrialStatus.STOPPED
        return TrialStatus.FINISHED

    # -- one step --------------------------------------------------------------------------------
    def forward_backward(self) -> float:
        """Gradients of the step's ``grad_accum`` micro-batches (each loss / grad_accum); the
        mean micro-batch loss."""
        tr = self.cfg.train
        loss_sum = 0.0
        for micro in range(tr.grad_accum):
            x, y = self.data.train_batch(self.step * tr.grad_accum + micro, tr.batch_size, tr.seq_len, tr.seed)
            x, y = x.to(self.device), y.to(self.device)
            with self.autocast():
                logits = self.fwd(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)
            (loss / tr.grad_accum).backward()
            loss_sum += loss.item() / tr.grad_accum
        return loss_sum

    def optimizer_step(self) -> float:
        """Clip, step the optimizer and the schedule, clear the gradients; the pre-clip norm."""
        clip = self.cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return float(norm)

    def _log_point(self, window: _Window, stop_at: int | None) -> bool:
        """Emit the metrics due at this step (with a checkpoint when due); True if the window
        was logged."""
        tr, step = self.cfg.train, self.step
        do_log = step % tr.log_interval == 0 or step == tr.steps or step == stop_at
        do_eval = step % tr.eval_interval == 0 and step < tr.steps  # the final eval comes in finish()
        if not (do_log or do_eval):
            return False
        metrics = self._window_metrics(window) if do_log else {}
        if do_eval:
            metrics.update(self.evaluate())
        due = bool(tr.checkpoint_interval) and step - self._last_ckpt >= tr.checkpoint_interval
        if due or step == stop_at:
            self._last_ckpt = step
        self.emit(metrics, checkpoint=due or step == stop_at)
        return do_log

    def _window_metrics(self, window: _Window) -> dict[str, float]:
        med = statistics.median(window.times)
        metrics = {"train/loss": statistics.fmean(window.losses), "train/lr": self.optimizer.param_groups[0]["lr"],
                   "train/grad_norm": statistics.fmean(window.norms), "train/tokens_per_s": self.tokens_per_step / med,
                   "perf/step_time_ms": 1000 * med, "perf/peak_mem_mb": peak_mem_mb(self.device)}
        for h in self.hooks:
            metrics.update(h.log_metrics(self))
        return metrics

    # -- evaluation and the end ------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """The loss, its standard error over the validation windows and the perplexity on the
        fixed validation batches."""
        vl, se = mean_and_se(*window_losses(self.fwd, self.val, self.device, self.autocast))
        return {VAL_LOSS: vl, VAL_LOSS_SE: se, "val/ppl": math.exp(min(vl, 50))}

    def final_metrics(self) -> dict[str, float]:
        """Validation, the data source's own metrics (task accuracy) and the hooks' metrics."""
        final = self.evaluate()
        final.update({FINAL_VAL_LOSS: final[VAL_LOSS], FINAL_VAL_LOSS_SE: final[VAL_LOSS_SE],
                      final_names.VAL_PPL: final["val/ppl"]})
        self.model.eval()
        task_metrics = self.data.evaluate(self.model, self.device)
        self.model.train()
        final.update(task_metrics)
        final.update({final_names.final_of(k): v for k, v in task_metrics.items() if k.startswith(final_names.VAL)})
        for h in self.hooks:
            final.update(h.final_metrics(self))
        return final

    def finish(self, status: TrialStatus) -> TrialResult:
        """The final metrics of a finished trial, the last checkpoint, the hooks' on_end."""
        final = self.final_metrics() if status is TrialStatus.FINISHED else {}
        ck = self.emit(final, checkpoint=True) if final else self.save()
        self._call("on_end", status)
        return self._result(status, final, ck)

    def emit(self, metrics: dict, checkpoint: bool = False) -> str | None:
        """Record a metric dict for the current step (then write the checkpoint, which carries
        the history) and hand it to every hook."""
        self.history.append({"step": self.step, **metrics})
        ck = self.save() if checkpoint else None
        for h in self.hooks:
            h.on_log(self, self.step, metrics, ck)
        return ck

    def _call(self, phase: str, *args) -> None:
        for h in self.hooks:
            getattr(h, phase)(self, *args)

    def _result(self, status: TrialStatus, final: dict, ck: str | None) -> TrialResult:
        return TrialResult(status, self.step, final.get(FINAL_VAL_LOSS), final.get(final_names.VAL_PPL), self.run_id,
                           ck, self.history, last_values(self.history))
