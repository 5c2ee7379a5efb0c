"""The MLflow runs of a sweep, shared by the driver and its Ray trials: the parent run (one per
sweep, with the sweep file as written and as resolved), the child runs (one per trial), and
closing runs that a killed driver or a stopped trial left ``RUNNING``. Also the environment the
driver hands to its Ray workers.

A run's state is a ``TrialStatus``: its value is the run's ``status`` tag, its ``.mlflow`` the
run's MLflow status.

The dashboard (``orchestrator.core.dashboard``): the parent run marks the experiment as a model
training experiment and stores the saved comparison view on it; each trial's run is coloured by
its value of the compared axis, and a named variant is a param (``variant``) beside its tag.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from orchestrator.core import dashboard, record
from orchestrator.core.exposure import TELEMETRY_ENV
from orchestrator.core.keys import VARIANT, canonical
from orchestrator.core.outbox import BUFFER_ENV, RETRY_ENV, WAIT_ENV
from orchestrator.core.record import child_runs, end_run
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import git_sha
from orchestrator.decide.costs import Budget
from orchestrator.sweep.files import resolved_yaml
from orchestrator.sweep.limits import PARAMS_ENV
from orchestrator.sweep.schema import SweepSpec

FAULT_ENV = "LIME_FAULT_ONCE"  # "<marker file>:<step>[:<trial id substring>]": crash one trial once (tests)
# passed on to Ray workers started by ``ray.init(address=...)`` (a local Ray inherits the environment)
WORKER_ENV = (FAULT_ENV, "LIME_CACHE", "LIME_RESULTS", "HF_HOME", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE",
              "HF_ENDPOINT", RETRY_ENV, WAIT_ENV, BUFFER_ENV, PARAMS_ENV, TELEMETRY_ENV)
RAY_DONE, RAY_ERROR = "TERMINATED", "ERROR"  # Ray's trial states that end a trial


CONFIG_ERROR = "config_error"  # the result key that says a trial failed on a mistake of its config
# in every report of an attempt: 1 it continued from a checkpoint; -1 it started over at step 0
# after an earlier attempt (which left no checkpoint); 0 a first start
RESUMED = "resumed"


OWN_ERROR = "own_error"  # the result key that says an attempt fails on an error of its own (not a lost worker)
# Ray's errors of a process or node that went away: the chaos of a cluster, not the trial's doing
LOST_WORKER_ERRORS = frozenset({"RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                                "NodeDiedError", "OwnerDiedError", "ObjectLostError", "LocalRayletDiedError"})


def lost_worker(exc: BaseException) -> bool:
    """Whether an attempt's error is a lost Ray worker or node (a multi-worker trial's Ray Train
    worker, say), anywhere in its chain of causes."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if {c.__name__ for c in type(e).__mro__} & LOST_WORKER_ERRORS:
            return True
        e = e.__cause__ or e.__context__
    return False


def report_own_error(tune, trial_id: str, exc: BaseException) -> None:
    """An attempt that fails on an error of its own says so to the driver before it raises: only
    such errors spend the trial's retries (``max_failures``); an attempt whose process or node is
    lost cannot say anything, and is retried without spending one (``orchestrator.sweep.console``)."""
    try:
        tune.report({OWN_ERROR: f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300],
                     "trial": trial_id, "step": 0, "status": TrialStatus.FAILED.value, "objective": float("nan")})
    except Exception:  # noqa: BLE001 - outside Tune (tests call the trial directly): nothing to tell
        pass


def report_config_error(tune, trial_id: str, exc: BaseException) -> None:
    """A trial that fails on a ``ConfigError`` (the hub unreachable, a dataset that is not there)
    says so to the driver before it raises: retrying cannot help, so the driver's live view sets
    the trial's retries to none (``orchestrator.sweep.console``) and the trial fails at once, its
    traceback in its ``trial.log``."""
    try:
        tune.report({CONFIG_ERROR: str(exc), "trial": trial_id, "step": 0, "status": TrialStatus.FAILED.value,
                     "objective": float("nan")})
    except Exception:  # noqa: BLE001 - outside Tune (tests call the trial directly): nothing to tell
        pass


def close_stale_runs(cl, exp_id: str, parent: str, reason: TrialStatus = TrialStatus.KILLED,
                     ray_status: dict[str, str] | None = None) -> int:
    """Runs of this sweep still RUNNING while no trial runs (a killed driver, a stopped trial)."""
    n = 0
    for run in child_runs(cl, exp_id, parent, status=TrialStatus.RUNNING.mlflow):
        tid = run.data.tags.get(record.TRIAL_ID, "")
        stopped = ray_status and ray_status.get(tid) == RAY_DONE
        end_run(cl, run.info.run_id, TrialStatus.STOPPED if stopped else reason)
        n += 1
    return n


def parent_run(spec: SweepSpec, cl, exp_id: str, state: dict) -> str:
    """The sweep's parent run: the one of an earlier launch if it still exists (``state``'s, else the
    record's parent with the fingerprint of its first launch: ``lime_sweep.json`` is only a cache), else
    new."""
    for rid in (state.get("parent_run_id"), record.find_parent(cl, exp_id, state.get("base_fingerprint")
                                                                      or spec.fingerprint())):
        if not rid:
            continue
        try:
            run = cl.get_run(rid)
        except Exception:  # noqa: BLE001 - deleted or from another store: try the next, else start a new parent
            continue
        if run.info.lifecycle_stage == "active":
            cl.update_run(rid, status=TrialStatus.RUNNING.mlflow)
            cl.set_tag(rid, record.STATUS, TrialStatus.RUNNING.value)
            set_view(spec, cl, exp_id, rid)
            return rid
    rid = cl.create_run(exp_id, run_name=spec.name,
                        tags=record.parent_tags(spec.name, spec.description, git_sha())).info.run_id
    _log_sweep(spec, cl, rid)
    set_view(spec, cl, exp_id, rid)
    return rid


def view_axes(spec: SweepSpec) -> list[str]:
    """The param names of the sweep's axes, the compared one first and the seed last."""
    axes = [canonical(spec.key(a)) if a != VARIANT else a for a in spec.axes()]
    if spec.search is not None or spec.seed_axis() is None:
        axes.append("seed")
    compared = canonical(spec.key(spec.report.axis)) if spec.report.axis not in (None, VARIANT) else spec.report.axis
    return sorted(dict.fromkeys(axes), key=lambda a: (a != compared, a == "seed"))


def set_view(spec: SweepSpec, cl, exp_id: str, parent: str) -> None:
    """The experiment opens on its runs (a model training experiment) with the saved comparison
    view of this launch's parent run (``orchestrator.core.dashboard``)."""
    metric = spec.search.metric if spec.search else spec.report.metric
    mode = spec.search.mode if spec.search else spec.report.mode
    axis = "configurations" if spec.search is not None else spec.report.axis
    cl.set_experiment_tag(exp_id, dashboard.KIND_TAG, dashboard.TRAINING_KIND)
    cl.set_experiment_tag(exp_id, dashboard.VIEW_TAG, dashboard.compare_view(
        axes=view_axes(spec), metric=metric, mode=mode, parent_run_id=parent, title=f"compare {axis}"))


def trial_extras(spec: SweepSpec, config: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(tags, params) a trial's run gets besides the engine's: its colour by the compared axis
    (the same colour for every seed of a value), and the named variant as a param."""
    tags, params = {}, {}
    axis = spec.report.axis
    if spec.search is None and axis in config and axis in spec.grid:
        color = dashboard.run_color(config[axis], list(spec.grid[axis]))
        if color:
            tags[dashboard.RUN_COLOR_TAG] = color
    if VARIANT in config:
        params[VARIANT] = str(config[VARIANT])
    return tags, params


def sweep_record(spec: SweepSpec) -> record.SweepRecord:
    """What the parent run records of the sweep (``orchestrator.core.record``): the one mapping of a
    sweep file to its record, used by the driver and by ``lime report FILE``."""
    r, rep, s = spec.resources, spec.report, spec.search
    search = None if s is None else record.SearchRecord(metric=s.metric, mode=s.mode, num_samples=s.num_samples,
                                                        seed=s.seed, repeat=s.repeat)
    dec = spec.decide
    margin = dec.margin if dec is not None and dec.margin is not None else rep.margin  # decide's wins
    report = record.ReportRecord(metric=rep.metric, axis=rep.axis, baseline=rep.baseline, alpha=rep.alpha,
                                 mode=rep.mode, stated=spec.report_stated, tune=rep.tune, paper=rep.paper,
                                 margin=margin, final_evals=rep.final_evals)
    decide = None if dec is None else record.DecideRecord(max_seeds=dec.max_seeds, wave=dec.wave,
                                                          budget=budget_text(dec))
    return record.SweepRecord(n_trials=spec.n_trials(), axes=tuple(spec.axes()), cpu=r.cpu, gpu=r.gpu,
                              max_failures=spec.max_failures, max_concurrent=spec.max_concurrent,
                              fingerprint=spec.fingerprint(), report=report, extends=spec.extends, search=search,
                              decide=decide)


def _log_sweep(spec: SweepSpec, cl, rid: str) -> None:
    """Params, the sweep file as written and, resolved (its ``extends`` applied), what ran."""
    from mlflow.entities import Param

    cl.log_batch(rid, params=[Param(k, v) for k, v in sweep_record(spec).to_params().items()])
    if spec.path and Path(spec.path).is_file():
        cl.log_artifact(rid, str(spec.path), "sweep")
    if spec.resolved:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / f"{spec.name}.resolved.yaml"
            p.write_text(f"# {spec.name}: the sweep file with its extends chain applied (what ran)\n"
                         + resolved_yaml(spec.resolved))
            cl.log_artifact(rid, str(p), "sweep")


def budget_text(dec) -> str | None:
    """A ``decide:`` block's budget as the parent records it (``sweep.decide.budget``), or None."""
    b = Budget.of(dec.budget)
    return b.to_text() if b is not None else None
