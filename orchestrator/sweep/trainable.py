"""The trial side of a sweep: the Ray Tune function trainable that runs in a Ray worker.

It rebuilds the trial's ``TrialConfig`` from the sweep and the trial's axis values, sends the
process's output to ``<trial folder>/trial.log``, continues from the newest checkpoint (which
carries the MLflow run id, so a retried or resumed trial keeps its run), and trains:

- one worker (``resources.workers: 1``): ``orchestrator.engine.trial.run_trial`` in this
  process, with an ``on_log`` that reports every log point to Ray Tune (``tune.report``, with a
  ``tune.Checkpoint`` whenever the engine wrote one);
- several workers: a Ray Train ``TorchTrainer`` started from here (``orchestrator.sweep.workers``),
  whose rank 0 logs to MLflow and whose reports reach Tune the same way.

The trial's MLflow run is tagged with the Ray node that ran it (``ray_node_id``, ``host``).

Worker reuse (``reuse_actors``, ``orchestrator.sweep.workers.reuse_workers``): one process runs
several trials in turn. Each attempt first resets what a trial changes in the process
(``orchestrator.engine.startup.prepare_process``) and reuses the data object of the last trial
with the same data config; everything else is built again. The attempt's start-up phases go to
its MLflow run as ``startup/*`` metrics, and ``trial/wall_s`` (the seconds the trial's attempts
spent in their workers, a fresh worker's start included) when the attempt ends.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
import traceback
from pathlib import Path

from lime_arch import ConfigError
from orchestrator.core import outbox, record
from orchestrator.core.record import child_runs, end_run
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, experiment_id
from orchestrator.engine.startup import StartupClock, StartupHook, prepare_process, shared_data, worker_clock
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.sweep import IMPORT_T0
from orchestrator.sweep.mlflow_runs import RESUMED, lost_worker, report_config_error, report_own_error, trial_extras
from orchestrator.sweep.spec import SweepSpec, trial_dirname
from orchestrator.sweep.tune_report import newest_checkpoint, objective, output_to, reporter
from orchestrator.sweep.workers import fit_workers

IMPORT_S = time.perf_counter() - IMPORT_T0  # what importing the project cost this process
WALL = record.TRIAL_WALL
ATTEMPT_DIR = "attempt"  # an attempt's working folder inside the trial's folder (attempt_dir)
SPOOL_DIR = "outbox"  # what a trial that ended during an outage left to its background sender
# Ray waits this long for a trial's thread to end before it reuses the process (default 2 s); a
# trial that Ray stops closes its MLflow run first, which can take longer on a busy machine
THREAD_TIMEOUT_ENV = "TUNE_FUNCTION_THREAD_TIMEOUT_S"


# -- the trial (runs in a Ray worker) -------------------------------------------------------------------
def make_trainable(spec: SweepSpec, ctx: dict):
    """The Ray Tune function trainable of a sweep. ``ctx``: tracking uri, parent run id, experiment dir."""

    def lime_trial(config: dict) -> None:
        _trial_main(spec, ctx, dict(config))

    return lime_trial


def _trial_main(spec: SweepSpec, ctx: dict, config: dict) -> None:
    from ray import tune

    clock = worker_clock(ctx.get("launched"), IMPORT_S)
    os.environ.setdefault(THREAD_TIMEOUT_ENV, "60")  # read in this process when Ray reuses it
    # a grid trial's id follows from its axis values; a search trial's sample number only Ray knows
    grid_trial = spec.search is None and spec.grid and all(a in config for a in spec.grid)
    trial_id = spec.trial_id({a: config[a] for a in spec.grid}) if grid_trial else tune.get_context().get_trial_name()
    run_attempt(spec, ctx, config, trial_id, tune, clock)


def run_attempt(spec: SweepSpec, ctx: dict, config: dict, trial_id: str, tune, clock: StartupClock) -> None:
    """One attempt of a trial in this process (``tune``: Ray Tune's API, or a stand-in in tests)."""
    os.environ["MLFLOW_TRACKING_URI"] = ctx["uri"]
    trial_dir = Path(ctx["exp_dir"]) / trial_dirname(trial_id)
    with output_to(trial_dir / "trial.log"):
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} trial {trial_id} (pid {os.getpid()}, Ray node "
              f"{_node_id()} on {socket.gethostname()}; trial {clock.worker_trial} of this worker process)",
              flush=True)
        try:
            with clock.phase("prepare"):
                prepare_process(clock.worker_trial)
            _train(spec, ctx, config, trial_id, trial_dir, tune, clock)
        except BaseException as e:
            traceback.print_exc()
            if isinstance(e, ConfigError):  # the config's mistake: no retry can help
                report_config_error(tune, trial_id, e)
            elif isinstance(e, Exception) and not lost_worker(e):  # not Ray's stop (SystemExit) or a lost worker
                report_own_error(tune, trial_id, e)
            raise


def attempt_dir(trial_dir: Path) -> Path:
    """This attempt's working folder (its checkpoints, the copy it resumes from), in the trial's
    folder of the results: removed when the attempt ends; one a killed attempt left is removed
    when the next attempt of the trial starts (one attempt of a trial runs at a time)."""
    work = trial_dir / ATTEMPT_DIR
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def _train(spec: SweepSpec, ctx: dict, config: dict, trial_id: str, trial_dir: Path, tune,
           clock: StartupClock) -> None:
    cfg = spec.config_of(config)
    work = attempt_dir(trial_dir)
    cfg.train.checkpoint_dir = str(work / "ckpt")
    cl, run_id, step = None, None, 0
    health = outbox.health()
    health.uri = ctx["uri"]
    try:
        with clock.phase("resume"):
            resume, ck_state, ck_src = newest_checkpoint(tune.get_checkpoint(), trial_dir, work)
        with clock.phase("mlflow"):  # an absent server: the trial starts without it (its run is opened late)
            cl = client(ctx["uri"])

            def lookup():
                eid = experiment_id(spec.name, cl)
                return eid, child_runs(cl, eid, ctx["parent_run_id"], trial_id)

            answered, found = outbox.try_once(lookup, "finding the trial's run", health)
            exp_id, runs = found if answered else (None, [])
            run = recorded_run(runs, ck_state)
        base = {"trial": trial_id, "steps_total": cfg.train.steps}
        if run is not None and _report_finished(cl, run, {**base, "start_step": 0, "step": cfg.train.steps},
                                                ctx["metric"], tune):
            return  # nothing ran: no wall time to add
        if resume and run is None and answered and ck_state.get("run_id"):
            # the record is the truth: the run the checkpoint names is not in it, nothing to continue
            # (a checkpoint that names none was trained while the server was away: its run is created now)
            print("the checkpoint's trial has no MLflow run in the sweep's record: starting over", flush=True)
            resume, ck_state, ck_src = None, None, None
        # without the server: the checkpoint's run, if it names one; else the late opening reads the record
        run_id = (run.info.run_id if run is not None else ck_state.get("run_id")) if resume else None
        step = start = int(ck_state["step"]) if resume else 0
        base["start_step"] = start
        if run_id is None and answered:  # a fresh start: a run left by an attempt that never checkpointed
            with clock.phase("mlflow"):  # would duplicate steps
                for old in child_runs(cl, exp_id, ctx["parent_run_id"], trial_id):
                    print(f"deleting MLflow run {old.info.run_id} of an attempt without a checkpoint", flush=True)
                    outbox.patient(lambda old=old: cl.delete_run(old.info.run_id), "deleting a run", health)
        # the console says which, from the attempt's own word: 1 from a checkpoint, -1 from step 0
        # although an earlier attempt recorded a run (it left no checkpoint), 0 a first start
        base[RESUMED] = 1 if resume else (-1 if run is not None else 0)
        print(f"{'resuming from step ' + str(start) if resume else 'starting'}; config: "  # from a checkpoint, or 0
              f"{json.dumps(cfg.to_dict(), sort_keys=True, default=str)}", flush=True)
        tags = record.trial_tags(spec.name, trial_id, config, **{record.RAY_NODE: _node_id(),
                                                                  record.HOST: socket.gethostname()})
        if spec.resources.workers > 1:
            tags.update(workers=spec.resources.workers, parallel=spec.resources.parallel)
        colour, params = trial_extras(spec, config)  # the dashboard's run colour, the variant as a param
        tracking = Tracking(experiment=spec.name, run_id=run_id, parent_run_id=ctx["parent_run_id"],
                            run_name=trial_id, tags={**tags, **colour}, params=params,
                            trial_id=None if answered else trial_id, spool=str(trial_dir / SPOOL_DIR))
        latest: dict[str, float] = {}
        if spec.resources.workers > 1:  # Ray Train's workers report to Tune themselves, the last time too
            res = fit_workers(spec, ctx, cfg, tracking, base, trial_dir, (ck_src or resume) if resume else None)
            run_id, step = res["run_id"] or run_id, res["step"]
            print(f"{res['status']} at step {res['step']}: final/val_loss={res.get('final/val_loss')} "
                  f"MLflow run {res['run_id']}", flush=True)
            return
        with clock.phase("data"):
            data = shared_data(cfg.data)
        hook = StartupHook(clock)
        try:
            res = run_trial(cfg, tracking=tracking, resume=resume, data=data, hooks=[hook],
                            on_log=reporter(base, latest, ctx["metric"], work, tune))
        except SystemExit:  # Ray stopped the trial (scheduler, or the sweep was interrupted)
            print("stopped by Ray", flush=True)
            try:
                for run in child_runs(cl, exp_id, ctx["parent_run_id"], trial_id) if exp_id else []:
                    end_run(cl, run.info.run_id, TrialStatus.STOPPED)
            except Exception as e:  # noqa: BLE001 - the server is away: the driver closes what stays RUNNING
                print(f"note: the run's stop was not recorded ({type(e).__name__})", flush=True)
            raise
        finally:
            run_id, step = hook.run_id or run_id, max(step, hook.step)
        print(f"{res.status} at step {res.step}: final/val_loss={res.final_val_loss} MLflow run "
              f"{res.run_id or 'not created yet (the server is away)'}",
              flush=True)
        tune.report({**base, "step": res.step, "status": str(res.status), "run_id": res.run_id or "", **latest,
                     **health.report(), "objective": objective(latest, ctx["metric"])})
    finally:
        log_wall(cl, run_id, clock, step)
        shutil.rmtree(work, ignore_errors=True)


def log_wall(cl, run_id: str | None, clock: StartupClock, step: int) -> None:
    """Add this attempt's seconds (a fresh worker's start included) to the run's ``trial/wall_s``."""
    if cl is None or not run_id:
        return
    if outbox.health().since is not None:  # the server is away: no call's retry window spent on a timing
        print(f"note: {WALL} not logged (MLflow unreachable)", flush=True)
        return
    try:
        prior = cl.get_run(run_id).data.metrics.get(WALL, 0.0)  # the trial's earlier attempts
        cl.log_metric(run_id, WALL, prior + clock.before + clock.elapsed(), step=step)
    except Exception as e:  # noqa: BLE001 - a timing metric never fails a trial
        print(f"note: {WALL} not logged ({type(e).__name__}: {e})", flush=True)


def recorded_run(runs: list, ck_state: dict | None):
    """The trial's run in the record (``orchestrator.core.record``): the one its checkpoint names when
    the record has it, else the newest; None when the record has none."""
    if not runs:
        return None
    named = ck_state.get("run_id") if ck_state else None
    for r in runs:
        if r.info.run_id == named:
            return r
    newest = max(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))
    if named:
        print(f"the checkpoint names MLflow run {named}, the record has {newest.info.run_id}: continuing the "
              "record's", flush=True)
    return newest


def _report_finished(cl, run, base: dict, metric: str, tune) -> bool:
    """A run that finished before the driver learnt it: report its result (never train again)."""
    status = record.run_status(run)
    if status is None or run.info.status != TrialStatus.FINISHED.mlflow or not status.done:
        return False  # no status tag (or another version's): not known to be finished
    m = dict(run.data.metrics)
    print(f"already finished in MLflow run {run.info.run_id}; reporting its result", flush=True)
    tune.report({**m, **{k: v for k, v in base.items() if k != "steps_total"}, "status": status.value,
                 "run_id": run.info.run_id, "objective": objective(m, metric)})
    return True


def _node_id() -> str:
    import ray

    if not ray.is_initialized():  # outside Ray (tests call the trial directly): asking would start one
        return "-"
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (tests call the trial function directly)
        return "-"
