"""The trial side of a sweep: the Ray Tune function trainable that runs in a Ray worker.

It rebuilds the trial's ``TrialConfig`` from the sweep and the trial's axis values, sends the
process's output to ``<trial folder>/trial.log``, continues from the newest checkpoint (which
carries the MLflow run id, so a retried or resumed trial keeps its run), and trains:

- one worker (``resources.workers: 1``): ``orchestrator.engine.train.run_trial`` in this
  process, with an ``on_log`` that reports every log point to Ray Tune (``tune.report``, with a
  ``tune.Checkpoint`` whenever the engine wrote one);
- several workers: a Ray Train ``TorchTrainer`` started from here (``orchestrator.sweep.workers``),
  whose rank 0 logs to MLflow and whose reports reach Tune the same way.

The trial's MLflow run is tagged with the Ray node that ran it (``ray_node_id``, ``host``).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import traceback
from pathlib import Path

from lime_arch import ConfigError
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, experiment_id
from orchestrator.engine.train import Tracking, run_trial
from orchestrator.sweep.reporting import newest_checkpoint, objective, output_to, reporter
from orchestrator.sweep.runs import child_runs, end_run, report_config_error, trial_extras
from orchestrator.sweep.spec import SweepSpec, trial_dirname
from orchestrator.sweep.workers import fit_workers


# -- the trial (runs in a Ray worker) -------------------------------------------------------------------
def make_trainable(spec: SweepSpec, ctx: dict):
    """The Ray Tune function trainable of a sweep. ``ctx``: tracking uri, parent run id, experiment dir."""

    def lime_trial(config: dict) -> None:
        _trial_main(spec, ctx, dict(config))

    return lime_trial


def _trial_main(spec: SweepSpec, ctx: dict, config: dict) -> None:
    from ray import tune

    os.environ["MLFLOW_TRACKING_URI"] = ctx["uri"]
    trial_id = tune.get_context().get_trial_name()
    trial_dir = Path(ctx["exp_dir"]) / trial_dirname(trial_id)
    with output_to(trial_dir / "trial.log"):
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} trial {trial_id} (pid {os.getpid()}, Ray node "
              f"{_node_id()} on {socket.gethostname()})", flush=True)
        try:
            _train(spec, ctx, config, trial_id, trial_dir, tune)
        except BaseException as e:
            traceback.print_exc()
            if isinstance(e, ConfigError):  # the config's mistake: no retry can help
                report_config_error(tune, trial_id, e)
            raise


def _train(spec: SweepSpec, ctx: dict, config: dict, trial_id: str, trial_dir: Path, tune) -> None:
    cfg = spec.trial_config(config)
    work = Path(tempfile.mkdtemp(prefix="lime-trial-"))
    cfg.train.checkpoint_dir = str(work / "ckpt")
    try:
        resume, ck_state, ck_src = newest_checkpoint(tune.get_checkpoint(), trial_dir, work)
        cl = client(ctx["uri"])
        exp_id = experiment_id(spec.name, cl)
        run_id = ck_state.get("run_id") if ck_state else None
        start = int(ck_state["step"]) if ck_state else 0
        base = {"start_step": start, "trial": trial_id, "steps_total": cfg.train.steps}
        if run_id is not None and _report_finished(cl, run_id, {**base, "step": start}, ctx["metric"], tune):
            return
        if run_id is None:  # a fresh start: a run left by an attempt that never checkpointed would duplicate steps
            for old in child_runs(cl, exp_id, ctx["parent_run_id"], trial_id):
                print(f"deleting MLflow run {old.info.run_id} of an attempt without a checkpoint", flush=True)
                cl.delete_run(old.info.run_id)
        print(f"{'resuming from step ' + str(start) if resume else 'starting'}; config: "
              f"{json.dumps(cfg.to_dict(), sort_keys=True, default=str)}", flush=True)
        tags = {"sweep": spec.name, "trial_id": trial_id, "sweep_role": "trial", "ray_node_id": _node_id(),
                "host": socket.gethostname(), **{k: v for k, v in config.items() if not k.startswith("__")}}
        if spec.resources.workers > 1:
            tags.update(workers=spec.resources.workers, parallel=spec.resources.parallel)
        colour, params = trial_extras(spec, config)  # the dashboard's run colour, the variant as a param
        tracking = Tracking(experiment=spec.name, run_id=run_id, parent_run_id=ctx["parent_run_id"],
                            run_name=trial_id, tags={**tags, **colour}, params=params)
        latest: dict[str, float] = {}
        if spec.resources.workers > 1:  # Ray Train's workers report to Tune themselves, the last time too
            res = fit_workers(spec, ctx, cfg, tracking, base, trial_dir, (ck_src or resume) if resume else None)
            print(f"{res['status']} at step {res['step']}: final/val_loss={res.get('final/val_loss')} "
                  f"MLflow run {res['run_id']}", flush=True)
            return
        try:
            res = run_trial(cfg, tracking=tracking, resume=resume,
                            on_log=reporter(base, latest, ctx["metric"], work, tune))
        except SystemExit:  # Ray stopped the trial (scheduler, or the sweep was interrupted)
            print("stopped by Ray", flush=True)
            for run in child_runs(cl, exp_id, ctx["parent_run_id"], trial_id):
                end_run(cl, run.info.run_id, TrialStatus.STOPPED)
            raise
        print(f"{res.status} at step {res.step}: final/val_loss={res.final_val_loss} MLflow run {res.run_id}",
              flush=True)
        tune.report({**base, "step": res.step, "status": str(res.status), "run_id": res.run_id or "", **latest,
                     "objective": objective(latest, ctx["metric"])})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _report_finished(cl, run_id: str, base: dict, metric: str, tune) -> bool:
    """A run that finished before the driver learnt it: report its result (never train again)."""
    run = cl.get_run(run_id)
    try:
        status = TrialStatus(run.data.tags.get("status"))
    except ValueError:  # no status tag (or another version's): not known to be finished
        return False
    if run.info.status != TrialStatus.FINISHED.mlflow or not status.done:
        return False
    m = dict(run.data.metrics)
    print(f"already finished in MLflow run {run_id}; reporting its result", flush=True)
    tune.report({**m, **{k: v for k, v in base.items() if k != "steps_total"}, "status": status.value,
                 "run_id": run_id, "objective": objective(m, metric)})
    return True


def _node_id() -> str:
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (tests call the trial function directly)
        return "-"
