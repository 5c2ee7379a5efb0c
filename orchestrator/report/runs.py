"""Reading a sweep's runs from MLflow for the report.

``find_runs`` finds the sweep's experiment, its parent run(s) and its trial runs;
``collect_runs`` turns the trial runs into one frame row per trial plus per-step histories
(``load_runs`` does both); ``add_key_columns`` adds a column per axis the frame lacks.

- The sweep's experiment is the one named after it (else runs tagged ``sweep=<name>`` anywhere).
  The parent run is a run another run points to with ``mlflow.parentRunId``, or one without a
  ``trial_id`` tag and without training params; trial runs are all the others.
- A trial is its ``trial_id`` tag (the run id without one). Re-attempts continue one MLflow run,
  so two runs of one trial are unusual; the most complete is kept (finished, then with the
  metric, then the latest end/start), and the report lists what was dropped.
- A run's status is ``TrialStatus.of_run``: its ``status`` tag, else derived from MLflow's.
- Params come back as strings and are cast (``"12"`` -> 12, ``"None"`` -> None, ...).
  ``step_time_ms`` is the median of ``perf/step_time_ms`` over the run, ``peak_mem_mb`` the max of
  ``perf/train_mem_mb`` (the model's training memory: saved activations, parameters, gradients and
  optimizer state), or of ``perf/peak_mem_mb`` (the process's RSS on CPU, the allocator's peak on
  CUDA) for runs logged before ``perf/train_mem_mb`` existed (``mem_metric`` says which);
  tokens = steps x batch x seq_len x grad_accum (steps reached, for runs
  that stopped early), FLOPs = 3 x ``model/flops_per_token`` x tokens, wall time = end - start.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core import record, tracking
from orchestrator.core.fmt import norm_value
from orchestrator.core.keys import FACTORS, dotted
from orchestrator.core.record import FINAL_VAL_LOSS, cast_param
from orchestrator.core.status import TrialStatus

DEFAULT_METRIC = FINAL_VAL_LOSS
HISTORY_KEYS = ("train/loss", "val/loss", "perf/step_time_ms", "perf/peak_mem_mb", "perf/train_mem_mb")
MEMORY_KEYS = ("perf/train_mem_mb", "perf/peak_mem_mb")  # the report's memory column: the first a run has


# ------------------------------------------------------------------------------ reading MLflow

@dataclass
class SweepRuns:
    name: str
    tracking_uri: str
    experiment_ids: list[str]
    parent_run_id: str | None
    parent_run_ids: list[str]
    frame: pd.DataFrame  # one row per trial, sorted by trial id
    histories: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]  # run id -> key -> (steps, values)
    duplicates: list[dict[str, Any]]
    notes: list[str]
    parent_metrics: dict[str, float] = field(default_factory=dict)  # the latest parent run's numbers (sweep/wall_s...)


def _lookup(params: dict[str, Any], tags: dict[str, str], key: str) -> Any:
    full = dotted(key)
    cands = []
    if full.startswith("model."):
        cands.append("resolved.model." + full[len("model."):])
    cands.append(full)
    if "." not in full:
        cands.append("resolved.model." + full)
    for c in cands:
        if c in params:
            return norm_value(params[c])
    if key in tags:
        return norm_value(cast_param(tags[key]))
    return None


def add_key_columns(frame: pd.DataFrame, keys: list[str]) -> None:
    """Add a column per key (alias, dotted config key or model field) that the frame lacks."""
    for key in keys:
        if key in frame.columns:
            continue
        values = []
        for _, r in frame.iterrows():
            params = {c[len("params."):]: r[c] for c in frame.columns
                      if isinstance(c, str) and c.startswith("params.")}
            tags = {c[len("tags."):]: r[c] for c in frame.columns
                    if isinstance(c, str) and c.startswith("tags.") and isinstance(r[c], str)}
            values.append(_lookup({k: v for k, v in params.items() if not _missing(v)}, tags, key))
        frame[key] = pd.Series(values, dtype=object, index=frame.index)


def _missing(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _search(cl, experiment_ids: list[str], filter_string: str) -> list:
    out, token = [], None
    while True:
        page = cl.search_runs(experiment_ids, filter_string=filter_string, max_results=1000,
                              page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _history(cl, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-step values; a step logged twice (a resumed attempt) keeps the latest value."""
    by_step: dict[int, tuple[int, float]] = {}
    for m in sorted(cl.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp, m.value)):
        by_step[int(m.step)] = (m.timestamp, float(m.value))
    steps = np.array(sorted(by_step), dtype=np.float64)
    return steps, np.array([by_step[int(s)][1] for s in steps], dtype=np.float64)


def _rank(run, metric: str) -> tuple:
    value = run.data.metrics.get(metric, math.nan)
    return (_status(run) == TrialStatus.FINISHED, math.isfinite(value), run.info.end_time or 0,
            run.info.start_time or 0, run.info.run_id)


@dataclass
class FoundRuns:
    """A sweep's runs in MLflow, before they are read: parents sorted oldest first."""

    name: str
    tracking_uri: str
    experiment_ids: list[str]
    parents: list  # mlflow Run objects, one per launch
    trials: list
    notes: list[str]

    @property
    def parent(self):
        """The latest parent run (the report is logged to it), or None."""
        return self.parents[-1] if self.parents else None


def find_runs(name: str, cl) -> FoundRuns:
    """The sweep's experiment(s), parent runs and trial runs (ConfigError when there are none)."""
    uri = tracking.tracking_uri()
    notes: list[str] = []
    exp = cl.get_experiment_by_name(name)
    if exp is not None:
        exp_ids = [exp.experiment_id]
        runs = _search(cl, exp_ids, "")
        other = [r for r in runs if r.data.tags.get(record.SWEEP) not in (None, name)]
        if other:
            notes.append(f"{len(other)} run(s) of experiment {name!r} carry another sweep tag "
                         "and were left out")
        runs = [r for r in runs if r not in other]
    else:
        quoted = name.replace("'", "\\'")
        exp_ids = [e.experiment_id for e in cl.search_experiments()]
        runs = _search(cl, exp_ids, f"tags.{record.SWEEP} = '{quoted}'") if exp_ids else []
        exp_ids = sorted({r.info.experiment_id for r in runs})
        if not runs:
            raise ConfigError(f"report: no MLflow experiment or runs for sweep {name!r} in {uri}")
    referenced = {r.data.tags.get(record.PARENT_RUN) for r in runs} & {r.info.run_id for r in runs}
    parents = sorted((r for r in runs if _is_parent(r, referenced)),
                     key=lambda r: (r.info.start_time or 0, r.info.run_id))
    trials = [r for r in runs if not _is_parent(r, referenced)]
    if not trials:
        raise ConfigError(f"report: sweep {name!r} has no trial runs yet in {uri}")
    if len(parents) > 1:
        notes.append(f"{len(parents)} parent runs (one per launch); the report is logged to the "
                     f"latest, {parents[-1].info.run_id}")
    return FoundRuns(name, uri, exp_ids, parents, trials, notes)


def _is_parent(r, referenced: set) -> bool:
    t = r.data.tags
    role = record.role(t)
    if r.info.run_id in referenced or role in (record.PARENT, "sweep"):
        return True
    if record.TRIAL_ID in t or role == record.TRIAL:
        return False
    return not any(k.startswith("train.") for k in r.data.params)


def collect_runs(found: FoundRuns, metric: str, cl) -> SweepRuns:
    """One frame row per trial (``metric`` decides which run of a trial is kept), histories."""
    groups: dict[str, list] = {}
    for r in found.trials:
        groups.setdefault(r.data.tags.get(record.TRIAL_ID) or r.info.run_id, []).append(r)
    kept, duplicates = [], []
    for tid in sorted(groups):
        rs = sorted(groups[tid], key=lambda r: _rank(r, metric))
        kept.append(rs[-1])
        for r in rs[:-1]:
            duplicates.append({"trial_id": tid, "dropped": r.info.run_id, "kept": rs[-1].info.run_id,
                               "dropped_status": _status(r), "kept_status": _status(rs[-1])})
    rows, histories = [], {}
    for r in kept:
        hist = {k: _history(cl, r.info.run_id, k) for k in HISTORY_KEYS if k in r.data.metrics}
        histories[r.info.run_id] = hist
        rows.append(_row(r, hist))
    frame = pd.DataFrame(rows)
    for col in frame.columns:  # keep Python values (None, int, str) rather than NaN-floats
        if not frame[col].map(lambda v: isinstance(v, float) or v is None).all():
            frame[col] = pd.Series([norm_value(v) for v in frame[col]], dtype=object, index=frame.index)
    frame = frame.sort_values(["trial_id", "run_id"], kind="stable").reset_index(drop=True)
    parent = found.parent
    return SweepRuns(found.name, found.tracking_uri, found.experiment_ids,
                     parent.info.run_id if parent else None, [p.info.run_id for p in found.parents],
                     frame, histories, duplicates, list(found.notes),
                     record.parent_numbers(parent) if parent else {})


def load_runs(name: str, metric: str = DEFAULT_METRIC, cl=None) -> SweepRuns:
    """The sweep's trial runs as a frame (one row per trial) plus per-step histories.

    Columns: ``trial_id run_id run_name status mlflow_status git_sha``, the aliases of FACTORS and
    ``seed`` (cast values), ``wall_time_s start_ms end_ms step_time_ms peak_mem_mb mem_metric steps_done tokens
    flops_per_step flops``, every param as ``params.<key>`` (cast), every non-MLflow tag as
    ``tags.<key>`` (string) and every metric's last value under its own key. ``metric`` decides
    which run of a trial is kept when there are several.
    """
    cl = cl or tracking.client()
    return collect_runs(find_runs(name, cl), metric, cl)


def _status(r) -> str:
    return str(TrialStatus.of_run(r.data.tags, r.info.status))


def _row(r, hist: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    params = {k: cast_param(v) for k, v in r.data.params.items()}
    tags = r.data.tags
    row: dict[str, Any] = {
        "trial_id": tags.get(record.TRIAL_ID) or r.info.run_id, "run_id": r.info.run_id,
        "run_name": r.info.run_name, "status": _status(r), "mlflow_status": r.info.status,
        "git_sha": tags.get(record.GIT_SHA),
    }
    for k in FACTORS + ("seed",):
        row[k] = _lookup(params, tags, k)
    start, end = r.info.start_time, r.info.end_time
    row["wall_time_s"] = (end - start) / 1000.0 if start and end and end >= start else math.nan
    row["start_ms"], row["end_ms"] = (start or math.nan), (end or math.nan)  # who ran beside whom (``cosched``)

    def finite(key):
        v = hist.get(key, (np.zeros(0), np.zeros(0)))[1]
        return v[np.isfinite(v)]

    st_ms = finite("perf/step_time_ms")
    row["step_time_ms"] = float(np.median(st_ms)) if len(st_ms) else math.nan
    row["mem_metric"] = next((k for k in MEMORY_KEYS if len(finite(k))), None)
    mem = finite(row["mem_metric"]) if row["mem_metric"] else np.zeros(0)
    row["peak_mem_mb"] = float(np.max(mem)) if len(mem) else math.nan
    tps = math.prod(_as_float(params.get(f"train.{k}")) for k in ("batch_size", "seq_len", "grad_accum"))
    planned = _as_float(params.get("train.steps"))
    reached = max((float(s.max()) for s, _ in hist.values() if len(s)), default=0.0)
    steps_done = planned if row["status"] == TrialStatus.FINISHED and not math.isnan(planned) else reached
    if not math.isnan(planned):
        steps_done = min(steps_done, planned)
    row["steps_done"] = steps_done
    row["tokens"] = steps_done * tps
    fpt = float(r.data.metrics.get("model/flops_per_token", math.nan))
    row["flops_per_step"] = 3.0 * fpt * tps
    row["flops"] = 3.0 * fpt * row["tokens"]
    row.update({f"params.{k}": v for k, v in params.items()})
    row.update({f"tags.{k}": v for k, v in tags.items() if not k.startswith("mlflow.")})
    row.update(dict(r.data.metrics))
    return row


def _as_float(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
