"""The MLflow runs of a sweep, shared by the driver and its Ray trials: the parent run (one per
sweep, with the sweep file as written and as resolved), the child runs (one per trial), and
closing runs that a killed driver or a stopped trial left ``RUNNING``. Also the environment the
driver hands to its Ray workers.

A run's state is a ``TrialStatus``: its value is the run's ``status`` tag, its ``.mlflow`` the
run's MLflow status.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import git_sha
from orchestrator.sweep.files import resolved_yaml
from orchestrator.sweep.schema import SweepSpec

FAULT_ENV = "LIME_FAULT_ONCE"  # "<marker file>:<step>[:<trial id substring>]": crash one trial once (tests)
# passed on to Ray workers started by ``ray.init(address=...)`` (a local Ray inherits the environment)
WORKER_ENV = (FAULT_ENV, "LIME_CACHE", "LIME_RESULTS", "HF_HOME", "HF_DATASETS_OFFLINE")
RAY_DONE, RAY_ERROR = "TERMINATED", "ERROR"  # Ray's trial states that end a trial


def end_run(cl, run_id: str, status: TrialStatus) -> None:
    """Close a run: what happened as its ``status`` tag, MLflow's status from it."""
    cl.set_tag(run_id, "status", status.value)
    cl.set_terminated(run_id, status=status.mlflow)


def child_runs(cl, exp_id: str, parent: str, trial_id: str | None = None, status: str | None = None) -> list:
    """The trial runs of a sweep's parent run (one trial's, with ``trial_id``; by MLflow status)."""
    filt = [f"tags.`mlflow.parentRunId` = '{parent}'"]
    if trial_id is not None:
        q = '"' if "'" in trial_id else "'"
        filt.append(f"tags.trial_id = {q}{trial_id}{q}")
    if status:
        filt.append(f"attributes.status = '{status}'")
    return list(cl.search_runs([exp_id], " and ".join(filt), max_results=5000))


def close_stale_runs(cl, exp_id: str, parent: str, reason: TrialStatus = TrialStatus.KILLED,
                     ray_status: dict[str, str] | None = None) -> int:
    """Runs of this sweep still RUNNING while no trial runs (a killed driver, a stopped trial)."""
    n = 0
    for run in child_runs(cl, exp_id, parent, status=TrialStatus.RUNNING.mlflow):
        tid = run.data.tags.get("trial_id", "")
        stopped = ray_status and ray_status.get(tid) == RAY_DONE
        end_run(cl, run.info.run_id, TrialStatus.STOPPED if stopped else reason)
        n += 1
    return n


def parent_run(spec: SweepSpec, cl, exp_id: str, state: dict) -> str:
    """The sweep's parent run: the one of an earlier launch (``state``) if it still exists, else new."""
    rid = state.get("parent_run_id")
    if rid:
        try:
            run = cl.get_run(rid)
            if run.info.lifecycle_stage == "active":
                cl.update_run(rid, status=TrialStatus.RUNNING.mlflow)
                cl.set_tag(rid, "status", TrialStatus.RUNNING.value)
                return rid
        except Exception:  # noqa: BLE001 - deleted or from another store: start a new parent
            pass
    tags = {"sweep": spec.name, "sweep_role": "parent", "git_sha": git_sha(), "status": TrialStatus.RUNNING.value,
            "mlflow.note.content": spec.description}
    rid = cl.create_run(exp_id, run_name=spec.name, tags=tags).info.run_id
    _log_sweep(spec, cl, rid)
    return rid


def sweep_params(spec: SweepSpec) -> dict[str, object]:
    """What a report needs to know about the sweep, as the parent run's params."""
    r = spec.resources
    params: dict[str, object] = {
        "sweep.n_trials": spec.n_trials(), "sweep.axes": ",".join(spec.axes()),
        "sweep.resources.cpu": r.cpu, "sweep.resources.gpu": r.gpu, "sweep.max_failures": spec.max_failures,
        "sweep.max_concurrent": spec.max_concurrent, "sweep.report.metric": spec.report.metric,
        "sweep.report.axis": spec.report.axis, "sweep.report.baseline": spec.report.baseline,
        "sweep.report.explicit": ",".join(spec.report_stated), "sweep.fingerprint": spec.fingerprint(),
        "sweep.report.alpha": spec.report.alpha, "sweep.report.mode": spec.report.mode}
    for key in ("tune", "paper"):  # only when the file sets them (the report reads their absence as unset)
        if getattr(spec.report, key) is not None:
            params[f"sweep.report.{key}"] = getattr(spec.report, key)
    if spec.extends:
        params["sweep.extends"] = spec.extends
    if spec.search is not None:
        s = spec.search
        params.update({"sweep.search.metric": s.metric, "sweep.search.mode": s.mode,
                       "sweep.search.num_samples": s.num_samples, "sweep.search.seed": s.seed,
                       "sweep.search.repeat": s.repeat})
    return params


def _log_sweep(spec: SweepSpec, cl, rid: str) -> None:
    """Params, the sweep file as written and, resolved (its ``extends`` applied), what ran."""
    from mlflow.entities import Param

    cl.log_batch(rid, params=[Param(k, str(v)) for k, v in sweep_params(spec).items()])
    if spec.path and Path(spec.path).is_file():
        cl.log_artifact(rid, str(spec.path), "sweep")
    if spec.resolved:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / f"{spec.name}.resolved.yaml"
            p.write_text(f"# {spec.name}: the sweep file with its extends chain applied (what ran)\n"
                         + resolved_yaml(spec.resolved))
            cl.log_artifact(rid, str(p), "sweep")
