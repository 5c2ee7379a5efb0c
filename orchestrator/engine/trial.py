"""The one training entry point: ``run_trial(TrialConfig)``, used by the CLI, Ray Tune and tests.

``run_trial`` assembles the standard hooks (MLflow tracking, the ``on_log`` callback, the
end-of-trial analysis) around a ``Trainer`` (``orchestrator.engine.trainer``: the loop and its
phases) and runs it. The checkpoint helpers live in ``orchestrator.engine.checkpoint`` and are
re-exported here with the rest of the engine's public API.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.engine.checkpoint import CKPT_NAME, load_checkpoint, save_checkpoint
from orchestrator.engine.hooks import AnalysisHook, CallbackHook, CostHook, MLflowHook
from orchestrator.engine.memory import MemoryHook
from orchestrator.engine.prune import RouterPruneHook
from orchestrator.engine.schedule import lr_multiplier, peak_mem_mb, pick_device, seed_everything
from orchestrator.engine.stability import StabilityHook
from orchestrator.engine.trainer import Hook, Trainer, TrialResult, evaluate_loss
from orchestrator.engine.trial_config import TrialConfig

__all__ = ["CKPT_NAME", "Hook", "Tracking", "Trainer", "TrialResult", "evaluate_loss", "load_checkpoint",
           "lr_multiplier", "peak_mem_mb", "pick_device", "run_trial", "save_checkpoint", "seed_everything",
           "trial_hooks"]


@dataclass
class Tracking:
    """Where a trial logs. ``run_id`` continues an existing MLflow run (retry, resume)."""

    experiment: str = "lime-train"
    run_id: str | None = None
    parent_run_id: str | None = None
    run_name: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)  # besides the config's (a sweep's variant)
    enabled: bool = True
    # a sweep trial's id: its run, when opened late (the server was away at the start), is looked up
    # in the sweep's record first (``orchestrator.core.tracking.RunLogger``)
    trial_id: str | None = None
    spool: str | None = None  # a folder: a trial that ends during an outage hands off what is left


def trial_hooks(cfg: TrialConfig, tracking: Tracking, on_log: Callable | None = None) -> list[Hook]:
    """The standard hooks of a trial, in the order they run: MLflow first, so a metric dict is
    stored before ``on_log`` reports it (and may raise); the memory metrics come with every log point,
    the cost summary (``CostHook``) with the final metrics; ``RouterPruneHook`` runs
    ``model.router_prune``'s schedule (nothing without it); ``StabilityHook`` counts loss and
    gradient-norm spikes (``orchestrator.engine.stability``)."""
    hooks: list[Hook] = [RouterPruneHook(), MemoryHook(), CostHook(), StabilityHook()]
    if tracking.enabled:
        hooks.append(MLflowHook(tracking.experiment, run_name=tracking.run_name,
                                parent_run_id=tracking.parent_run_id, tags=tracking.tags, params=tracking.params,
                                trial=tracking.trial_id, spool=tracking.spool))
    if cfg.train.analyze:
        hooks.append(AnalysisHook())
    if on_log is not None:
        hooks.append(CallbackHook(on_log))
    return hooks


def run_trial(cfg: TrialConfig, *, tracking: Tracking | None = None, resume: str | Path | None = None,
              on_log: Callable[[int, dict, str | None], None] | None = None,
              stop_at: int | None = None, hooks: Iterable[Hook] = (), data: Any = None) -> TrialResult:
    """Train one trial. ``on_log(step, metrics, checkpoint_dir)`` is called at every log point
    (``checkpoint_dir`` when a checkpoint was just written); ``stop_at`` ends early with a
    checkpoint, as an interruption would; ``hooks`` run after the standard ones; ``data``: a data
    object built already (``orchestrator.engine.startup.shared_data``), else the config's is built."""
    tracking = tracking or Tracking()
    trainer = Trainer(cfg, [*trial_hooks(cfg, tracking, on_log), *hooks], data=data, run_id=tracking.run_id)
    return trainer.run(resume=resume, stop_at=stop_at)
