"""A sweep's ``eval:`` block: the downstream tasks of every finished trial's final checkpoint.

- Before anything starts (``preflight``, from ``run_sweep``): the tasks resolve and their data can
  be had (``orchestrator.evaluation.checks``: the hub only when reachable or cached offline), and
  every trial has a text tokenizer. A mistake is one line, exit 2, before Ray or MLflow is touched.
- After Ray Tune's fit (``finished_trials``): each finished trial whose run does not carry the
  ``eval/settings`` tag of this block (and its final step) is evaluated as one Ray task with the
  trial's resources (per worker), reading the trial's newest checkpoint in its Ray trial folder
  (``orchestrator.sweep.checkpoints``: on a cluster the Ray storage must be a shared path) and
  writing its scores to the trial's own MLflow run (``orchestrator.evaluation.record``). Its
  output goes to ``eval.log`` beside the trial's ``trial.log``. Relative ``eval.include`` folders
  and the data files of their tasks are read from the folder the sweep was launched in.
- Nothing is evaluated twice: a resumed or retried trial trains in its own run and is evaluated
  once it is finished; a second launch skips runs tagged complete, and within a run tasks already
  scored under the same key (``eval/<task>/config``). A finished sweep launched again with a new
  ``eval:`` block restores its Ray experiment (no trial runs again) and only evaluates.
- An evaluation that fails is reported and left untagged (the next launch tries it again); it
  does not fail the sweep.
"""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from lime_arch import ConfigError
from orchestrator.core import eval_names
from orchestrator.core.status import TrialStatus
from orchestrator.evaluation.checks import resolve
from orchestrator.evaluation.loading import text_tokenizer_check
from orchestrator.evaluation.run import evaluate_checkpoint
from orchestrator.evaluation.settings import EvalSettings, settings_hash
from orchestrator.sweep.checkpoints import trial_checkpoint
from orchestrator.sweep.mlflow_runs import child_runs
from orchestrator.sweep.schema import SweepSpec
from orchestrator.sweep.spec import trial_dirname
from orchestrator.sweep.tune_report import output_to

EVAL_LOG = "eval.log"


def preflight(spec: SweepSpec) -> None:
    """ConfigError when the block cannot run (see the module), before anything starts."""
    if spec.eval is None:
        return
    trials = spec.trials() or [None]  # a search: its base config stands for its trials
    for t in trials:
        cfg = t.config if t is not None else spec.trial_config({})
        try:
            text_tokenizer_check(cfg.data)
        except ConfigError as e:
            where = f"trial {t.trial_id}" if t is not None else "base"
            raise ConfigError(f"{spec.path or spec.name}: eval: {where}: {e}") from None
    try:
        resolve(spec.eval, key="eval")
    except ConfigError as e:
        raise ConfigError(f"{spec.path or spec.name}: {e}") from None


def pending(spec: SweepSpec, cl, exp_id: str, parent: str, exp_dir: Path) -> tuple[list[tuple], list[str]]:
    """The finished trials still to evaluate: ``(trial id, run id, checkpoint, settings tag)``; and
    notes on finished trials without a checkpoint."""
    todo, notes = [], []
    for run in sorted(child_runs(cl, exp_id, parent), key=lambda r: r.data.tags.get("trial_id", "")):
        tid = run.data.tags.get("trial_id", "")
        if run.data.tags.get("status") != TrialStatus.FINISHED.value:
            continue
        steps = int(float(run.data.params.get("train.steps", 0) or 0))
        tag = settings_hash(spec.eval, steps)
        if run.data.tags.get(eval_names.SETTINGS_TAG) == tag:
            continue
        ck = trial_checkpoint(exp_dir, tid)
        if ck is None:
            notes.append(f"{tid}: finished, but no checkpoint in {exp_dir / trial_dirname(tid)}; not evaluated")
            continue
        todo.append((tid, run.info.run_id, str(ck), tag))
    return todo, notes


@dataclass(frozen=True)
class Job:
    """One trial's evaluation, everything a Ray task needs (plain values)."""

    settings: EvalSettings
    threads: int
    uri: str  # the MLflow store
    cwd: str  # where the sweep was launched: relative include folders and data files are from there
    trial_id: str
    run_id: str
    checkpoint: str
    tag: str  # the eval/settings tag once complete
    log_dir: str  # the trial's Ray folder (eval.log)


def evaluate_trial(job: Job) -> dict:
    """One trial's evaluation (a Ray task, or in-process): its scores on its run, its output in
    ``eval.log``; returns a summary (``ok``, the number of metrics logged, or the error)."""
    os.environ["MLFLOW_TRACKING_URI"] = job.uri
    t0, before = time.monotonic(), os.getcwd()
    with output_to(Path(job.log_dir) / EVAL_LOG):
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} evaluating {job.trial_id} (MLflow run {job.run_id}) from "
              f"{job.checkpoint}", flush=True)
        try:
            os.chdir(job.cwd)
            torch.set_num_threads(job.threads)
            done = evaluate_checkpoint(job.checkpoint, job.settings, run_id=job.run_id, complete_tag=True)
            n = len(done.outcome.metrics())
            print(f"logged {n} metrics; skipped (scored before): {done.outcome.skipped}; "
                  f"requests: {done.outcome.requests}", flush=True)
            return {"trial": job.trial_id, "ok": True, "metrics": n, "seconds": time.monotonic() - t0}
        except Exception as e:  # noqa: BLE001 - one trial's evaluation never fails the sweep
            traceback.print_exc()
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return {"trial": job.trial_id, "ok": False, "error": why, "seconds": time.monotonic() - t0}
        finally:
            os.chdir(before)


def finished_trials(spec: SweepSpec, cl, exp_id: str, parent: str, exp_dir: Path, uri: str,
                    runner=None) -> list[dict]:
    """Evaluate the pending finished trials (``runner(spec, jobs)``: Ray tasks by default) and
    print what happened; returns the summaries."""
    if spec.eval is None:
        return []
    todo, notes = pending(spec, cl, exp_id, parent, exp_dir)
    for n in notes:
        print(f"eval: {n}", flush=True)
    if not todo:
        print("eval: every finished trial is evaluated already", flush=True)
        return []
    print(f"eval: {len(todo)} finished trial(s) to evaluate on {', '.join(spec.eval.tasks)}", flush=True)
    threads = max(1, int(spec.resources.cpu))
    jobs = [Job(spec.eval, threads, uri, os.getcwd(), tid, rid, ck, tag, str(exp_dir / trial_dirname(tid)))
            for tid, rid, ck, tag in todo]
    results = (runner or ray_runner)(spec, jobs)
    for r in results:
        state = f"{r['metrics']} metrics logged" if r["ok"] else f"FAILED ({r['error']}; see {EVAL_LOG})"
        print(f"eval: {r['trial']}: {state} in {r['seconds']:.0f}s", flush=True)
    failed = sum(not r["ok"] for r in results)
    if failed:
        print(f"eval: {failed} evaluation(s) failed; the next `lime sweep run` of the file tries them again",
              flush=True)
    return results


def in_process(spec: SweepSpec, jobs: list[tuple]) -> list[dict]:
    """The evaluations one after another in this process (tests; no Ray)."""
    return [evaluate_trial(job) for job in jobs]


def ray_runner(spec: SweepSpec, jobs: list[tuple]) -> list[dict]:
    """One Ray task per evaluation with a trial worker's resources, at most ``max_concurrent`` at once."""
    import ray

    r = spec.resources
    task = ray.remote(num_cpus=r.cpu, num_gpus=r.gpu, max_retries=0)(evaluate_trial)
    limit = spec.max_concurrent or len(jobs)
    waiting, running, done = list(jobs), [], []
    while waiting or running:
        while waiting and len(running) < limit:
            running.append(task.remote(waiting.pop(0)))
        ready, running = ray.wait(running, num_returns=1)
        done += ray.get(ready)
    return sorted(done, key=lambda d: d["trial"])
