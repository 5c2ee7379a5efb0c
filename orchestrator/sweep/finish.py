"""The end of ``lime sweep run``: each trial's final state, the MLflow runs closed accordingly,
the best trial logged on the parent run, and the table printed.

The parent's summary is tags (``best_trial_id``, ``best_run_id``, ``best_metric``, ``best_value``,
``trials_finished``, ``trials_failed``, ``trials_unfinished``) and ``best_config.json``, not metrics:
a metric of the parent would be a chart of its own beside the trials' charts (one bar, the parent's)
in every chart view of the experiment, and params cannot change when a later launch finishes the
sweep. Tags are shown on the parent's page, searchable (``tags.best_trial_id``) and updated by
each launch; so are the sweep's wall time and slots (``sweep/*``, ``orchestrator.sweep.driver``).
The report's ``scaling/*`` and ``isoflop/*`` numbers are metrics of the parent (the scaling fits as
metrics) under names no trial logs, so none is a bar in a trial chart (``make dashboard-check``).

Which trials this launch ended comes from Ray's saved experiment state, corrected by the record
(``orchestrator.sweep.history.reconcile``: a trial whose run finished is done, though Ray's folder
is gone): a trial RUNNING or PENDING there is unfinished (an interrupted sweep reports its stopped
trials as terminated in memory, but saves them as running), and its MLflow run is marked killed: it
continues on the next launch. What a sweep has recorded (and so how it resumes) is the MLflow
record (``orchestrator.core.record``).
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from orchestrator.core import dashboard, record
from orchestrator.core.fmt import num
from orchestrator.core.record import child_runs, end_run, run_status
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import tracking_uri
from orchestrator.sweep import history
from orchestrator.sweep.mlflow_runs import RAY_DONE, RAY_ERROR, close_stale_runs
from orchestrator.sweep.view import fmt_time, ray_trials


def finish(launch, cl, grid, *, elapsed: float, metric: str, mode: str, final_status: dict[str, str]) -> dict:
    """Close stale runs, mark the parent, log and print the best trial, print the table
    (``launch``: the ``orchestrator.sweep.extend.Launch`` that ran, its parent run open)."""
    spec, exp_id, parent, exp_dir = launch.spec, launch.exp_id, launch.parent, launch.exp_dir
    done = history.done_trials(child_runs(cl, exp_id, parent))
    ray_status = history.reconcile(trial_states(grid, ray_trials(exp_dir), final_status), done)
    errors = sum(1 for v in ray_status.values() if v == RAY_ERROR)
    unfinished = sum(1 for v in ray_status.values() if v not in (RAY_ERROR, RAY_DONE))
    unfinished += max(0, spec.n_trials() - len(ray_status))
    _close_interrupted(cl, exp_id, parent, ray_status)
    rows = sorted(child_runs(cl, exp_id, parent), key=lambda r: r.data.tags.get(record.TRIAL_ID, ""))
    best = best_run(rows, metric, mode)
    ok = errors == 0 and unfinished == 0
    status = TrialStatus.FINISHED if ok else (TrialStatus.FAILED if errors else TrialStatus.KILLED)
    if best is not None:
        _log_best(cl, parent, metric, *best)
    finished = sum(1 for r in rows if run_status(r) is TrialStatus.FINISHED)
    record.ParentTags(counts=dict(zip(record.ParentTags.COUNTS, (finished, errors, unfinished)))).write(cl, parent)
    end_run(cl, parent, status)
    _print_table(rows, metric, best)
    print(f"sweep {spec.name}: {status} in {fmt_time(elapsed)}; {len(rows)} runs, {errors} failed"
          + (f", {unfinished} unfinished (run the same command again to resume)" if unfinished else "")
          + f"; parent MLflow run {parent}; Ray results {exp_dir}")
    print("\n".join(dashboard.ui_lines(getattr(cl, "tracking_uri", None) or tracking_uri(), exp_id, view=True)))
    return {"ok": ok, "errors": errors, "unfinished": unfinished, "parent_run_id": parent, "elapsed_s": elapsed,
            "best": (best[1].data.tags.get(record.TRIAL_ID), best[0], best[1].info.run_id) if best else None,
            "runs": {r.data.tags.get(record.TRIAL_ID): r.info.run_id for r in rows}}


def trial_states(grid, saved: dict[str, str], final_status: dict[str, str]) -> dict[str, str]:
    """Trial name -> Ray state at the end of this launch: the results, corrected by the saved state."""
    states: dict[str, str] = {}
    for r in grid:
        m = r.metrics or {}
        name = m.get("trial") or _trial_name(r)
        if r.error is not None:
            states[name] = RAY_ERROR
        elif _done(m.get("status")):
            states[name] = RAY_DONE
        else:
            states[name] = saved.get(name) or final_status.get(name) or "UNFINISHED"
    for name, st in {**final_status, **saved}.items():
        states.setdefault(name, st)
    for name, st in saved.items():
        if st not in (RAY_DONE, RAY_ERROR) and states.get(name) != RAY_ERROR:
            states[name] = st
    return states


def _close_interrupted(cl, exp_id: str, parent: str, ray_status: dict[str, str]) -> None:
    """Interrupted trials: killed (they resume next time); trials Ray stopped: stopped."""
    close_stale_runs(cl, exp_id, parent, TrialStatus.KILLED, ray_status)
    keep = (TrialStatus.FINISHED, TrialStatus.DIVERGED, TrialStatus.KILLED)
    for run in child_runs(cl, exp_id, parent):
        ray_state = ray_status.get(run.data.tags.get(record.TRIAL_ID, ""))
        if ray_state not in (RAY_ERROR, RAY_DONE) and run_status(run) not in keep:
            end_run(cl, run.info.run_id, TrialStatus.KILLED)


def best_run(rows: list, metric: str, mode: str) -> tuple[float, object] | None:
    """(value, run) of the best finished trial by ``metric``."""
    best = None
    for r in rows:
        v = r.data.metrics.get(metric)
        if v is None or not math.isfinite(v) or run_status(r) is not TrialStatus.FINISHED:
            continue
        if best is None or (v < best[0] if mode == "min" else v > best[0]):
            best = (v, r)
    return best


def _log_best(cl, parent: str, metric: str, value: float, run) -> None:
    tid = run.data.tags.get(record.TRIAL_ID, "")
    best = dict(zip(record.ParentTags.BEST, (tid, run.info.run_id, metric, num(value, 6))))
    record.ParentTags(best=best).write(cl, parent)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "best_config.json"
        p.write_text(json.dumps({"trial_id": tid, "run_id": run.info.run_id,
                                 metric: value, "params": dict(sorted(run.data.params.items()))}, indent=2))
        cl.log_artifact(parent, str(p))


def _print_table(rows: list, metric: str, best) -> None:
    if not rows:
        return
    print(f"\n{'trial':<40} {'status':<9} {metric:>16}  MLflow run")
    for r in rows:
        v = r.data.metrics.get(metric)
        print(f"{r.data.tags.get(record.TRIAL_ID, '?')[:40]:<40} {r.data.tags.get(record.STATUS, '?'):<9} "
              f"{(f'{v:.4f}' if v is not None else '-'):>16}  {r.info.run_id}")
    if best is not None:
        value, run = best
        print(f"best: {run.data.tags.get(record.TRIAL_ID)} {metric}={value:.4f} (MLflow run {run.info.run_id})")


def _done(value) -> bool:
    try:
        return TrialStatus(value).done
    except ValueError:
        return False


def _trial_name(result) -> str:
    try:
        return Path(result.path).name
    except Exception:  # noqa: BLE001
        return "?"
