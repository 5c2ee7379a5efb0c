"""Run a sweep file with Ray Tune (``lime sweep run``) and inspect it (``lime sweep status``).

- The sweep is parsed and validated completely (``orchestrator.sweep.spec``) before Ray or MLflow is
  touched; a mistake is one ``ConfigError`` line and exit code 2.
- One Ray Tune ``Tuner`` per sweep: grid axes become ``tune.grid_search``, a ``search`` block
  becomes ``OptunaSearch`` (seeded TPE) wrapped in a ``Repeater`` (seeds), optionally with ASHA.
  Results and checkpoints live in ``<results>/ray/<sweep>/`` (``$LIME_RESULTS``, default
  ``results``); each trial folder also holds the trial's own log (``trial.log``).
- Every trial calls ``orchestrator.engine.train.run_trial``. Metrics go to Ray through ``tune.report``
  with a ``tune.Checkpoint`` whenever the engine wrote one; a retried or resumed trial continues
  from its newest checkpoint, and the checkpoint carries the trial's MLflow run id, so the trial
  keeps one MLflow run for its whole life.
- MLflow: one parent run per sweep (its id is kept in ``<results>/ray/<sweep>/lime_sweep.json``
  so it survives driver restarts), one child run per trial (``mlflow.parentRunId``). Runs left
  ``RUNNING`` by a killed driver are closed on the next start and at the end.
- Running the same sweep again resumes it (``Tuner.restore``): finished trials are not run again,
  unfinished ones continue from their checkpoints, errored ones are retried.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from lime_arch import ConfigError
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.view import _largest, experiment_dir, fmt_time, ray_trials

STATE_FILE = "lime_sweep.json"
log = logging.getLogger(__name__)


def _metric_mode(metric: str) -> str:
    return "max" if any(w in metric for w in ("acc", "exact", "score")) else "min"


# -- sweep state (survives driver restarts) ------------------------------------------------------------
def read_state(exp_dir: Path) -> dict:
    p = exp_dir / STATE_FILE
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_state(exp_dir: Path, state: dict) -> None:
    exp_dir.mkdir(parents=True, exist_ok=True)
    tmp = exp_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, exp_dir / STATE_FILE)


def check_resumable(spec: SweepSpec, exp_dir: Path, uri: str) -> dict:
    """The saved state of an earlier launch, or a ConfigError if this launch cannot continue it."""
    state = read_state(exp_dir)
    if not state:
        return {}
    if state.get("fingerprint") != spec.fingerprint():
        raise ConfigError(f"{spec.path or spec.name}: the sweep's trials changed since {exp_dir} was started; "
                          f"restore the file, or delete {exp_dir} to start the sweep over")
    if state.get("tracking_uri") and state["tracking_uri"] != uri:
        raise ConfigError(f"MLFLOW_TRACKING_URI: {exp_dir} was started with the MLflow store "
                          f"{state['tracking_uri']}; set MLFLOW_TRACKING_URI to it to resume, or delete {exp_dir}")
    return state


def _check_local_resources(spec: SweepSpec) -> None:
    """A local Ray cannot give a trial more than this machine has: say so instead of waiting forever."""
    if spec.resources.gpu > 0:
        import torch

        ngpu = torch.cuda.device_count()
        if spec.resources.gpu > ngpu:
            raise ConfigError(f"resources.gpu: {spec.resources.gpu:g} per trial, but this machine has {ngpu} GPUs "
                              "(local Ray); use the sweep's -cpu version or connect to a GPU cluster "
                              "(--address or RAY_ADDRESS)")
    ncpu = os.cpu_count() or 1
    if spec.resources.cpu > ncpu:
        raise ConfigError(f"resources.cpu: {spec.resources.cpu:g} per trial, but this machine has {ncpu} CPUs "
                          "(local Ray); lower it or connect to a cluster (--address or RAY_ADDRESS)")


# -- MLflow: the parent run and stale runs -------------------------------------------------------------
def _parent_run(spec: SweepSpec, cl, exp_id: str, state: dict) -> str:
    from orchestrator.core.tracking import git_sha

    rid = state.get("parent_run_id")
    if rid:
        try:
            run = cl.get_run(rid)
            if run.info.lifecycle_stage == "active":
                cl.update_run(rid, status="RUNNING")
                cl.set_tag(rid, "status", "running")
                return rid
        except Exception:  # noqa: BLE001 - deleted or from another store: start a new parent
            pass
    tags = {"sweep": spec.name, "sweep_role": "parent", "git_sha": git_sha(), "status": "running",
            "mlflow.note.content": spec.description}
    run = cl.create_run(exp_id, run_name=spec.name, tags=tags)
    rid = run.info.run_id
    from mlflow.entities import Param

    r = spec.resources
    params = {"sweep.n_trials": spec.n_trials(), "sweep.axes": ",".join(spec.axes()),
              "sweep.resources.cpu": r.cpu, "sweep.resources.gpu": r.gpu, "sweep.max_failures": spec.max_failures,
              "sweep.max_concurrent": spec.max_concurrent, "sweep.report.metric": spec.report.metric,
              "sweep.report.axis": spec.report.axis, "sweep.report.baseline": spec.report.baseline,
              "sweep.fingerprint": spec.fingerprint()}
    if spec.search is not None:
        params.update({"sweep.search.metric": spec.search.metric, "sweep.search.mode": spec.search.mode,
                       "sweep.search.num_samples": spec.search.num_samples, "sweep.search.seed": spec.search.seed,
                       "sweep.search.repeat": spec.search.repeat})
    cl.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()])
    if spec.path and Path(spec.path).is_file():
        cl.log_artifact(rid, str(spec.path), "sweep")
    return rid


def child_runs(cl, exp_id: str, parent: str, trial_id: str | None = None, status: str | None = None) -> list:
    filt = [f"tags.`mlflow.parentRunId` = '{parent}'"]
    if trial_id is not None:
        q = '"' if "'" in trial_id else "'"
        filt.append(f"tags.trial_id = {q}{trial_id}{q}")
    if status:
        filt.append(f"attributes.status = '{status}'")
    return list(cl.search_runs([exp_id], " and ".join(filt), max_results=5000))


def close_stale_runs(cl, exp_id: str, parent: str, reason: str = "killed",
                     ray_status: dict[str, str] | None = None) -> int:
    """Runs of this sweep still RUNNING while no trial runs (a killed driver, a stopped trial)."""
    n = 0
    for run in child_runs(cl, exp_id, parent, status="RUNNING"):
        tid = run.data.tags.get("trial_id", "")
        why = "stopped" if ray_status and ray_status.get(tid) == "TERMINATED" else reason
        cl.set_tag(run.info.run_id, "status", why)
        cl.set_terminated(run.info.run_id, status="KILLED")
        n += 1
    return n


# -- the driver -----------------------------------------------------------------------------------------
def _quiet_ray() -> None:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy engine is silent at verbose=0
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save the experiment state often
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "100000")
    import warnings

    warnings.filterwarnings("ignore", module=r"ray(\..*)?")
    for name in ("ray", "ray.tune", "ray.train", "ray.air", "ray.data", "ray._private"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _start_ray(address: str | None, uri: str, num_cpus: int | None) -> bool:
    """Connect to ``address`` or start a local Ray; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    env = {"MLFLOW_TRACKING_URI": uri, "RAY_AIR_NEW_OUTPUT": "0"}
    from orchestrator.sweep.trial import FAULT_ENV

    for k in (FAULT_ENV, "LIME_CACHE", "LIME_RESULTS", "HF_HOME", "HF_DATASETS_OFFLINE"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    common = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                  configure_logging=True)
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, **common)
    else:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)  # never a stray `ray start`
    return True


def run_sweep(spec: SweepSpec, *, address: str | None = None, results: str | Path | None = None,
              num_cpus: int | None = None, status_every: float = 15.0) -> dict:
    """Run (or resume) a validated sweep; returns a summary dict (``ok``, counts, parent run, best)."""
    from orchestrator.core.tracking import client, experiment_id, init_store, tracking_uri

    uri = tracking_uri()
    exp_dir = experiment_dir(spec.name, results)
    state = check_resumable(spec, exp_dir, uri)
    if not address:
        _check_local_resources(spec)
    init_store(uri)
    cl = client(uri)
    exp_id = experiment_id(spec.name, cl)
    parent = _parent_run(spec, cl, exp_id, state)
    resumed = bool(state)
    write_state(exp_dir, {"name": spec.name, "fingerprint": spec.fingerprint(), "parent_run_id": parent,
                          "tracking_uri": uri, "experiment_id": exp_id, "file": spec.path,
                          "launches": int(state.get("launches", 0)) + 1})
    stale = close_stale_runs(cl, exp_id, parent, "killed")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    if address and uri.startswith("sqlite:"):
        print(f"note: MLflow store {uri} is a local file; workers on other machines need the same path "
              "(a shared filesystem) or an `mlflow server` (MLFLOW_TRACKING_URI=http://...)")

    _quiet_ray()
    started = _start_ray(address, uri, num_cpus)
    from ray import tune

    from orchestrator.sweep.console import LiveView
    from orchestrator.sweep.trial import make_trainable

    metric = spec.search.metric if spec.search else spec.report.metric
    mode = spec.search.mode if spec.search else _metric_mode(metric)
    ctx = {"uri": uri, "parent_run_id": parent, "exp_dir": str(exp_dir), "metric": metric}
    trainable = tune.with_resources(make_trainable(spec, ctx), {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu})
    grid_trials = spec.trials()
    steps = {t.trial_id: t.config.train.steps for t in grid_trials}
    base_steps = spec.trial_config({}).train.steps if spec.search is None else \
        max(spec.trial_config({n: v for n, v in _corner(spec).items()}).train.steps, 1)
    view = LiveView(total=spec.n_trials(), steps=steps, default_steps=base_steps, metric=metric, mode=mode,
                    every=status_every)
    print(f"sweep {spec.name}: {spec.n_trials()} trials, {spec.resources.cpu:g} CPU / {spec.resources.gpu:g} GPU "
          f"each, Ray {'at ' + address if address else 'local'}; results {exp_dir}; MLflow {uri} "
          f"(experiment {spec.name}, parent run {parent})" + (f"; resuming (closed {stale} stale runs)"
                                                              if resumed else ""), flush=True)
    try:
        if tune.Tuner.can_restore(str(exp_dir)):
            try:
                tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True,
                                           resume_errored=True)
            except (AttributeError, ImportError, EOFError, ValueError) as e:  # state of another version
                raise ConfigError(f"{exp_dir}: cannot resume this Ray experiment ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}); delete the folder to start "
                                  "the sweep over") from None
            with contextlib.suppress(AttributeError):  # the view stored in tuner.pkl is replaced by this one
                tuner._local_tuner._run_config.callbacks = [view]
        else:
            tuner = _new_tuner(spec, trainable, exp_dir, view, tune)
        t0 = time.monotonic()
        grid = tuner.fit()
        elapsed = time.monotonic() - t0
    except BaseException as e:  # nothing may stay RUNNING: the parent and any started trial
        interrupted = isinstance(e, KeyboardInterrupt)
        cl.set_tag(parent, "status", "killed" if interrupted else "failed")
        cl.set_terminated(parent, status="KILLED" if interrupted else "FAILED")
        close_stale_runs(cl, exp_id, parent, "killed")
        raise
    finally:
        if started:
            import ray

            ray.shutdown()
    return _finish(spec, cl, exp_id, parent, grid, elapsed, metric, mode, exp_dir, dict(view.final_status))


def _corner(spec: SweepSpec) -> dict:
    s = spec.search
    return {n: (p.values[-1] if p.kind != "choice" else _largest(p.values)) for n, p in s.space.items()} | \
        {"__trial_index__": 0}


def _new_tuner(spec: SweepSpec, trainable, exp_dir: Path, view, tune):
    from orchestrator.sweep.console import TrialNamer

    tc: dict[str, Any] = dict(trial_name_creator=TrialNamer(spec), trial_dirname_creator=TrialNamer(spec, True),
                              max_concurrent_trials=spec.max_concurrent)
    if spec.search is None:
        space = {a: tune.grid_search(list(v)) for a, v in spec.grid.items()}
        tc["num_samples"] = 1
    else:
        from optuna.samplers import TPESampler
        from ray.tune.search import Repeater
        from ray.tune.search.optuna import OptunaSearch

        s = spec.search
        space = {}
        for n, p in s.space.items():
            lo, hi = p.values[0], p.values[-1]
            space[n] = {"loguniform": lambda: tune.loguniform(lo, hi), "uniform": lambda: tune.uniform(lo, hi),  # noqa: B023
                        "int": lambda: tune.randint(lo, hi + 1),  # noqa: B023 (called at once)
                        "choice": lambda: tune.choice(list(p.values))}[p.kind]()  # noqa: B023
        searcher = OptunaSearch(sampler=TPESampler(seed=s.seed))
        tc.update(search_alg=Repeater(searcher, repeat=s.repeat, set_index=True), num_samples=s.num_samples * s.repeat,
                  metric="objective", mode=s.mode)
        if s.asha:
            from ray.tune.schedulers import ASHAScheduler

            # above the longest trial: a trial that reaches its last step finishes on its own
            max_t = max(spec.trial_config(_corner(spec)).train.steps, s.asha.grace_period) + 1
            tc["scheduler"] = ASHAScheduler(time_attr="step", max_t=max_t, grace_period=s.asha.grace_period,
                                            reduction_factor=s.asha.reduction_factor)
    run_config = tune.RunConfig(
        name=spec.name, storage_path=str(exp_dir.parent), verbose=0, callbacks=[view],
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2))
    return tune.Tuner(trainable, param_space=space, tune_config=tune.TuneConfig(**tc), run_config=run_config)


def _finish(spec: SweepSpec, cl, exp_id: str, parent: str, grid, elapsed: float, metric: str, mode: str,
            exp_dir: Path, final_status: dict[str, str]) -> dict:
    """Close stale runs, mark the parent, log and print the best trial, print the table."""
    # Ray's saved state is the truth for a resume: RUNNING/PENDING there means unfinished (an
    # interrupted sweep reports its stopped trials as terminated in memory, but saves them as running)
    saved = ray_trials(exp_dir)
    ray_status: dict[str, str] = {}
    for r in grid:
        m = r.metrics or {}
        name = m.get("trial") or _trial_name(r)
        if r.error is not None:
            ray_status[name] = "ERROR"
        elif m.get("status") in ("finished", "diverged"):
            ray_status[name] = "TERMINATED"
        else:
            ray_status[name] = saved.get(name) or final_status.get(name) or "UNFINISHED"
    for name, st in {**final_status, **saved}.items():
        ray_status.setdefault(name, st)
    for name, st in saved.items():
        if st not in ("TERMINATED", "ERROR") and ray_status.get(name) != "ERROR":
            ray_status[name] = st
    errors = sum(1 for v in ray_status.values() if v == "ERROR")
    unfinished = sum(1 for v in ray_status.values() if v not in ("ERROR", "TERMINATED"))
    unfinished += max(0, spec.n_trials() - len(ray_status))
    close_stale_runs(cl, exp_id, parent, "killed", ray_status)
    for run in child_runs(cl, exp_id, parent):  # interrupted trials: killed (they resume next time)
        tid = run.data.tags.get("trial_id", "")
        if ray_status.get(tid) not in ("ERROR", "TERMINATED") and run.data.tags.get("status") not in \
                ("finished", "diverged", "killed"):
            cl.set_tag(run.info.run_id, "status", "killed")
            cl.set_terminated(run.info.run_id, status="KILLED")
    runs = child_runs(cl, exp_id, parent)
    rows = sorted(runs, key=lambda r: r.data.tags.get("trial_id", ""))
    best = None
    for r in rows:
        v = r.data.metrics.get(metric)
        if v is None or not math.isfinite(v) or r.data.tags.get("status") not in ("finished",):
            continue
        if best is None or (v < best[0] if mode == "min" else v > best[0]):
            best = (v, r)
    ok = errors == 0 and unfinished == 0
    parent_status = "finished" if ok else ("failed" if errors else "killed")
    if best is not None:
        v, r = best
        cl.set_tag(parent, "best_trial_id", r.data.tags.get("trial_id", ""))
        cl.set_tag(parent, "best_run_id", r.info.run_id)
        cl.log_metric(parent, f"best/{metric}", v)
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "best_config.json"
            p.write_text(json.dumps({"trial_id": r.data.tags.get("trial_id"), "run_id": r.info.run_id,
                                     metric: v, "params": dict(sorted(r.data.params.items()))}, indent=2))
            cl.log_artifact(parent, str(p))
    cl.log_metric(parent, "sweep/trials_finished", sum(1 for r in rows if r.data.tags.get("status") == "finished"))
    cl.log_metric(parent, "sweep/trials_failed", errors)
    cl.set_tag(parent, "status", parent_status)
    cl.set_terminated(parent, status={"finished": "FINISHED", "killed": "KILLED"}.get(parent_status, "FAILED"))

    print(f"\n{'trial':<40} {'status':<9} {metric:>16}  MLflow run")
    for r in rows:
        v = r.data.metrics.get(metric)
        print(f"{r.data.tags.get('trial_id', '?')[:40]:<40} {r.data.tags.get('status', '?'):<9} "
              f"{(f'{v:.4f}' if v is not None else '-'):>16}  {r.info.run_id}")
    if best is not None:
        print(f"best: {best[1].data.tags.get('trial_id')} {metric}={best[0]:.4f} (MLflow run {best[1].info.run_id})")
    print(f"sweep {spec.name}: {parent_status} in {fmt_time(elapsed)}; {len(rows)} runs, {errors} failed"
          + (f", {unfinished} unfinished (run the same command again to resume)" if unfinished else "")
          + f"; parent MLflow run {parent}; Ray results {exp_dir}")
    return {"ok": ok, "errors": errors, "unfinished": unfinished, "parent_run_id": parent, "elapsed_s": elapsed,
            "best": (best[1].data.tags.get("trial_id"), best[0], best[1].info.run_id) if best else None,
            "runs": {r.data.tags.get("trial_id"): r.info.run_id for r in rows}}


def _trial_name(result) -> str:
    try:
        return Path(result.path).name
    except Exception:  # noqa: BLE001
        return "?"


