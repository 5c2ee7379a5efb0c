"""The trial side of a sweep: the Ray Tune function trainable that runs in a Ray worker.

It rebuilds the trial's ``TrialConfig`` from the sweep and the trial's axis values, sends the
process's output to ``<trial folder>/trial.log``, continues from the newest checkpoint (which
carries the MLflow run id, so a retried or resumed trial keeps its run), and calls
``orchestrator.engine.train.run_trial`` with an ``on_log`` that reports every log point to Ray
(``tune.report``, with a ``tune.Checkpoint`` whenever the engine wrote one).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, experiment_id
from orchestrator.engine.train import CKPT_NAME, Tracking, load_checkpoint, run_trial
from orchestrator.sweep.runs import FAULT_ENV, child_runs, end_run
from orchestrator.sweep.spec import SweepSpec, trial_dirname


# -- the trial (runs in a Ray worker) -------------------------------------------------------------------
def make_trainable(spec: SweepSpec, ctx: dict):
    """The Ray Tune function trainable of a sweep. ``ctx``: tracking uri, parent run id, experiment dir."""

    def lime_trial(config: dict) -> None:
        _trial_main(spec, ctx, dict(config))

    return lime_trial


@contextlib.contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr (fd level: Python, C, warnings) to the trial's log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        f.close()


def _newest_checkpoint(ray_ck, trial_dir: Path, work: Path) -> tuple[Path | None, dict | None]:
    """The newest loadable checkpoint, copied into ``work``: the newest one in the trial folder
    (Ray saves its experiment state only every few seconds, so after a killed driver Ray's own
    ``tune.get_checkpoint()`` can be older), else Ray's (remote storage)."""
    def take(src: Path) -> tuple[Path, dict] | None:
        try:
            state = load_checkpoint(src)
        except Exception:  # noqa: BLE001 - a checkpoint cut short by a kill: try an older one
            return None
        dst = work / "resume"
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / CKPT_NAME, dst / CKPT_NAME)
        return dst, state

    for f in sorted(trial_dir.glob(f"checkpoint_*/{CKPT_NAME}"), reverse=True):
        got = take(f.parent)
        if got:
            return got
    if ray_ck is not None:
        with ray_ck.as_directory() as d:
            if (Path(d) / CKPT_NAME).is_file():
                got = take(Path(d))
                if got:
                    return got
    return None, None


def objective_key(metric: str) -> str:
    """The metric a trial reports to the scheduler before its end: a ``final/...`` metric exists
    only when the trial ends, so until then its validation counterpart stands in for it
    (``final/val_loss`` -> ``val/loss``, ``final/val_ppl`` -> ``val/ppl``, ``final/accuracy`` ->
    ``val/accuracy``)."""
    if not metric.startswith("final/"):
        return metric
    name = metric.split("/", 1)[1]
    return "val/" + (name[len("val_"):] if name.startswith("val_") else name)


def _objective(latest: dict, metric: str) -> float:
    for key in (metric, objective_key(metric)):
        if key in latest:
            return float(latest[key])
    return float("nan")


def _fault(step: int, trial_id: str) -> None:
    """Test hook: ``LIME_FAULT_ONCE=<marker>:<step>[:<trial substring>]`` crashes one trial once,
    right after a checkpoint at or past ``step`` was reported."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    marker, at = Path(parts[0]), int(parts[1])
    if len(parts) > 2 and parts[2] not in trial_id:
        return
    if step >= at and not marker.exists():
        marker.write_text(f"{trial_id} {step}\n")
        raise RuntimeError(f"injected fault at step {step} ({FAULT_ENV})")


def _trial_main(spec: SweepSpec, ctx: dict, config: dict) -> None:
    from ray import tune

    os.environ["MLFLOW_TRACKING_URI"] = ctx["uri"]
    trial_id = tune.get_context().get_trial_name()
    trial_dir = Path(ctx["exp_dir"]) / trial_dirname(trial_id)
    with _output_to(trial_dir / "trial.log"):
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} trial {trial_id} (pid {os.getpid()})", flush=True)
        try:
            _train(spec, ctx, config, trial_id, trial_dir, tune)
        except BaseException:
            traceback.print_exc()
            raise


def _train(spec: SweepSpec, ctx: dict, config: dict, trial_id: str, trial_dir: Path, tune) -> None:
    cfg = spec.trial_config(config)
    work = Path(tempfile.mkdtemp(prefix="lime-trial-"))
    cfg.train.checkpoint_dir = str(work / "ckpt")
    try:
        resume, ck_state = _newest_checkpoint(tune.get_checkpoint(), trial_dir, work)
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
        tags = {"sweep": spec.name, "trial_id": trial_id, "sweep_role": "trial",
                **{k: v for k, v in config.items() if not k.startswith("__")}}
        tracking = Tracking(experiment=spec.name, run_id=run_id, parent_run_id=ctx["parent_run_id"],
                            run_name=trial_id, tags=tags)
        latest: dict[str, float] = {}
        try:
            res = run_trial(cfg, tracking=tracking, resume=resume,
                            on_log=_reporter(base, latest, ctx["metric"], work, tune))
        except SystemExit:  # Ray stopped the trial (scheduler, or the sweep was interrupted)
            print("stopped by Ray", flush=True)
            for run in child_runs(cl, exp_id, ctx["parent_run_id"], trial_id):
                end_run(cl, run.info.run_id, TrialStatus.STOPPED)
            raise
        print(f"{res.status} at step {res.step}: final/val_loss={res.final_val_loss} MLflow run {res.run_id}",
              flush=True)
        tune.report({**base, "step": res.step, "status": str(res.status), "run_id": res.run_id or "", **latest,
                     "objective": _objective(latest, ctx["metric"])})
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
                 "run_id": run_id, "objective": _objective(m, metric)})
    return True


def _reporter(base: dict, latest: dict, metric: str, work: Path, tune):
    """The engine's ``on_log``: every log point to Ray, with a checkpoint when the engine wrote one."""
    def on_log(step: int, metrics: dict, ck_dir: str | None) -> None:
        latest.update(metrics)
        rep = {**base, "step": step, "status": TrialStatus.RUNNING.value, **latest,
               "objective": _objective(latest, metric)}
        print(f"step {step}: " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()
                                          if isinstance(v, (int, float))), flush=True)
        if ck_dir is None:
            tune.report(rep)
            return
        fresh = Path(tempfile.mkdtemp(prefix="ck-", dir=work))  # a new folder for every report
        shutil.copy2(Path(ck_dir) / CKPT_NAME, fresh / CKPT_NAME)
        tune.report(rep, checkpoint=tune.Checkpoint.from_directory(str(fresh)))
        shutil.rmtree(fresh, ignore_errors=True)
        _fault(step, base["trial"])

    return on_log
