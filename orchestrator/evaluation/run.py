"""Evaluate a checkpoint and record the scores on its MLflow run: what ``lime eval`` and a sweep's
evaluation of its finished trials (``orchestrator.sweep.evaluate``) both call.

The tasks are resolved and their data checked first (``checks.resolve``: one line, nothing
loaded), then the model; tasks the run has scores for under the same key are skipped, so an
evaluation that is repeated (a resumed sweep, a second ``lime eval``) adds only what is new.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.tracking import existing_client, existing_run
from orchestrator.engine.checkpoint import read_model_checkpoint
from orchestrator.engine.schedule import pick_device
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.evaluation.checks import Resolved, resolve
from orchestrator.evaluation.harness import Outcome, evaluate
from orchestrator.evaluation.loading import Trained, load_trained, text_tokenizer_check
from orchestrator.evaluation.record import done_keys, log_outcome, mark_complete
from orchestrator.evaluation.settings import EvalSettings, settings_hash


@dataclass
class Evaluated:
    trained: Trained
    outcome: Outcome
    run_id: str | None  # where the scores were logged (None: not logged)


def evaluate_checkpoint(path: str | Path, settings: EvalSettings, *, run_id: str | None = None,
                        device: str = "auto", log: bool = True, resolved: Resolved | None = None,
                        key: str = "eval", complete_tag: bool = False) -> Evaluated:
    """Score the checkpoint at ``path``; log to ``run_id`` (default: the checkpoint's run) unless
    ``log`` is false. ``complete_tag``: also mark the run as evaluated under ``settings`` (a
    sweep's skip of the whole trial next time)."""
    opened = read_model_checkpoint(path)  # what is no checkpoint is one line before anything else
    text_tokenizer_check(TrialConfig.from_dict(opened[1]["config"]).data)  # a synthetic task's: before any task data
    target = (run_id or opened[1].get("run_id")) if log else None
    cl = existing_client(f"run {target}") if target else None
    run = existing_run(target, cl) if target else None  # not there: one line before any work, no store made
    resolved = resolved or resolve(settings, key)
    trained = load_trained(path, pick_device(device), opened)
    skip = done_keys(run) if run is not None else {}
    outcome = evaluate(trained.model, trained.tokenizer, settings, skip=skip, resolved=resolved, key=key)
    if target:
        tag = settings_hash(settings, trained.step) if complete_tag else None
        if outcome.keys:
            log_outcome(target, outcome, settings_tag=tag, cl=cl)
        elif tag:
            mark_complete(target, tag, cl)
    return Evaluated(trained, outcome, target)
