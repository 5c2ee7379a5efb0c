"""Reading a sweep's runs from MLflow for the report: sweep files, trial runs, key columns.

``resolve_sweep`` finds the sweep file (a path, ``sweeps/<name>.yaml`` or, via
``sweep_file_from_parent``, the file logged on the parent run) and what it says about the report;
``load_runs`` turns the sweep's MLflow runs into one frame row per trial plus per-step histories;
``add_key_columns`` adds a column per axis the frame lacks.

- The sweep's experiment is the one named after it (else runs tagged ``sweep=<name>`` anywhere).
  The parent run is a run another run points to with ``mlflow.parentRunId``, or one without a
  ``trial_id`` tag and without training params; trial runs are all the others.
- A trial is its ``trial_id`` tag (the run id without one). Re-attempts continue one MLflow run,
  so two runs of one trial are unusual; the most complete is kept (finished, then with the
  metric, then the latest end/start), and the report lists what was dropped.
- Params come back as strings and are cast (``"12"`` -> 12, ``"None"`` -> None, ...).
  ``step_time_ms`` is the median of ``perf/step_time_ms`` over the run, ``peak_mem_mb`` the max of
  ``perf/peak_mem_mb``; tokens = steps x batch x seq_len x grad_accum (steps reached, for runs
  that stopped early), FLOPs = 3 x ``model/flops_per_token`` x tokens, wall time = end - start.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from lime_arch.errors import ConfigError
from orchestrator.core.keys import ALIASES, FACTORS, canonical
from orchestrator.report import stats
from orchestrator.report.plots import norm_value as _norm
from orchestrator.report.plots import quiet_downloads as _quiet_downloads

REPORT_DEFAULTS = {"metric": "final/val_loss", "axis": "router", "baseline": "none"}
HISTORY_KEYS = ("train/loss", "val/loss", "perf/step_time_ms", "perf/peak_mem_mb")
MLFLOW_STATUS = {"RUNNING": "running", "SCHEDULED": "running", "FINISHED": "finished",
                 "FAILED": "failed", "KILLED": "killed"}


def cast_param(s: Any) -> Any:
    """An MLflow param string back to a Python value (int, float, bool, None, else the string)."""
    if not isinstance(s, str):
        return s
    t = s.strip()
    if t == "None":
        return None
    if t in ("True", "False"):
        return t == "True"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return s


# ------------------------------------------------------------------------------ sweep files

@dataclass
class SweepFile:
    """The sweep file of a report: its text (shown verbatim) and what it says about the report.

    Read with ``orchestrator.sweep.spec.parse_spec`` (the same rules as ``lime sweep run``); a file that
    no longer validates (e.g. a data file moved) is read as plain YAML, with a note.
    """

    name: str
    path: Path | None = None  # local file, when one was found
    text: str | None = None
    source: str = "not found"
    report: dict[str, Any] = field(default_factory=dict)  # metric, axis, baseline
    explicit: set[str] = field(default_factory=set)  # which of them the file states
    grid_keys: list[str] = field(default_factory=list)  # canonical axis names
    notes: list[str] = field(default_factory=list)
    given_as_path: bool = False  # `lime report path/to/file.yaml`: that file, not the parent's

    def absorb(self, text: str, source: str, stem: str | None = None) -> None:
        self.text, self.source = text, source
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"report: sweep file {source} is not valid YAML: "
                              f"{getattr(e, 'problem', None) or 'parse error'}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"report: sweep file {source} must be a mapping")
        rep = data.get("report") if isinstance(data.get("report"), dict) else {}
        self.explicit = {k for k in REPORT_DEFAULTS if k in rep}
        try:
            from orchestrator.sweep.spec import parse_spec
        except ImportError:  # the sweep parser is optional for reports
            parse_spec = None
        if parse_spec is not None:
            try:
                sp = parse_spec(data, stem=stem, path=source, text=text)
            except ConfigError as e:
                self.notes.append(f"the sweep file does not validate with this code ({e}); "
                                  "it is read as written")
            else:
                self.name = sp.name
                self.report = {"metric": sp.report.metric, "axis": sp.report.axis,
                               "baseline": sp.report.baseline}
                self.grid_keys = list(dict.fromkeys(canonical(sp.key(a)) for a in sp.axes()))
                return
        if isinstance(data.get("name"), str):
            self.name = data["name"]
        self.report = {k: rep[k] for k in self.explicit}
        grid = data.get("grid") if isinstance(data.get("grid"), dict) else {}
        search = data.get("search") if isinstance(data.get("search"), dict) else {}
        space = search.get("space") if isinstance(search.get("space"), dict) else {}
        self.grid_keys = list(dict.fromkeys(canonical(str(k)) for k in [*grid, *space]))


def resolve_sweep(arg: str) -> SweepFile:
    """A sweep name or a sweep file path -> its name and local file (if any)."""
    p = Path(arg)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise ConfigError(f"report: sweep file {arg} does not exist")
        sf = SweepFile(name=p.stem, path=p, given_as_path=True)
        sf.absorb(p.read_text(), p.name, stem=p.stem)
        return sf
    for folder in (Path.cwd() / "sweeps", Path(__file__).resolve().parents[1] / "sweeps"):
        f = folder / f"{arg}.yaml"
        if f.is_file():
            sf = SweepFile(name=arg, path=f)
            sf.absorb(f.read_text(), f"sweeps/{arg}.yaml", stem=arg)
            return sf
    return SweepFile(name=arg)


def sweep_file_from_parent(cl, parent_id: str, sf: SweepFile) -> None:
    """Fill ``sf`` from the sweep file logged on the parent run, if there is one."""
    try:
        arts = [a for a in cl.list_artifacts(parent_id) if not a.is_dir]
        arts += [a for d in cl.list_artifacts(parent_id) if d.is_dir and d.path in ("sweep", "spec")
                 for a in cl.list_artifacts(parent_id, d.path) if not a.is_dir]
    except Exception:  # noqa: BLE001
        return
    yamls = sorted((a.path for a in arts if a.path.endswith((".yaml", ".yml"))),
                   key=lambda p: (Path(p).stem != sf.name, Path(p).stem != "sweep", p))
    if not yamls:
        return
    with tempfile.TemporaryDirectory() as tmp:
        with _quiet_downloads():
            p = cl.download_artifacts(parent_id, yamls[0], tmp)
        sf.absorb(Path(p).read_text(), f"artifact {yamls[0]} of the parent run")


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


def _lookup(params: dict[str, Any], tags: dict[str, str], key: str) -> Any:
    dotted = ALIASES.get(key, key)
    cands = []
    if dotted.startswith("model."):
        cands.append("resolved.model." + dotted[len("model."):])
    cands.append(dotted)
    if "." not in dotted:
        cands.append("resolved.model." + dotted)
    for c in cands:
        if c in params:
            return _norm(params[c])
    if key in tags:
        return _norm(cast_param(tags[key]))
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
    return (_status(run) == stats.FINISHED, math.isfinite(value), run.info.end_time or 0,
            run.info.start_time or 0, run.info.run_id)


def load_runs(name: str, metric: str = REPORT_DEFAULTS["metric"], cl=None) -> SweepRuns:
    """The sweep's trial runs as a frame (one row per trial) plus per-step histories.

    Columns: ``trial_id run_id run_name status mlflow_status git_sha``, the aliases of FACTORS and
    ``seed`` (cast values), ``wall_time_s step_time_ms peak_mem_mb steps_done tokens
    flops_per_step flops``, every param as ``params.<key>`` (cast), every non-MLflow tag as
    ``tags.<key>`` (string) and every metric's last value under its own key. ``metric`` decides
    which run of a trial is kept when there are several.
    """
    from orchestrator.core import tracking

    cl = cl or tracking.client()
    uri = tracking.tracking_uri()
    notes: list[str] = []
    exp = cl.get_experiment_by_name(name)
    quoted = name.replace("'", "\\'")
    if exp is not None:
        exp_ids = [exp.experiment_id]
        runs = _search(cl, exp_ids, "")
        other = [r for r in runs if r.data.tags.get("sweep") not in (None, name)]
        if other:
            notes.append(f"{len(other)} run(s) of experiment {name!r} carry another sweep tag "
                         "and were left out")
        runs = [r for r in runs if r not in other]
    else:
        exp_ids = [e.experiment_id for e in cl.search_experiments()]
        runs = _search(cl, exp_ids, f"tags.sweep = '{quoted}'") if exp_ids else []
        exp_ids = sorted({r.info.experiment_id for r in runs})
        if not runs:
            raise ConfigError(f"report: no MLflow experiment or runs for sweep {name!r} in {uri}")

    ids = {r.info.run_id for r in runs}
    referenced = {r.data.tags.get("mlflow.parentRunId") for r in runs} & ids

    def is_parent(r) -> bool:
        t = r.data.tags
        role = (t.get("sweep_role") or t.get("lime.role") or t.get("role") or "").lower()
        if r.info.run_id in referenced or role in ("parent", "sweep"):
            return True
        if "trial_id" in t or role == "trial":
            return False
        return not any(k.startswith("train.") for k in r.data.params)

    parents = sorted((r for r in runs if is_parent(r)),
                     key=lambda r: (r.info.start_time or 0, r.info.run_id))
    trials = [r for r in runs if not is_parent(r)]
    if not trials:
        raise ConfigError(f"report: sweep {name!r} has no trial runs yet in {uri}")
    parent_id = parents[-1].info.run_id if parents else None
    if len(parents) > 1:
        notes.append(f"{len(parents)} parent runs (one per launch); the report is logged to the "
                     f"latest, {parent_id}")

    groups: dict[str, list] = {}
    for r in trials:
        groups.setdefault(r.data.tags.get("trial_id") or r.info.run_id, []).append(r)
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
            frame[col] = pd.Series([_norm(v) for v in frame[col]], dtype=object, index=frame.index)
    frame = frame.sort_values(["trial_id", "run_id"], kind="stable").reset_index(drop=True)
    return SweepRuns(name, uri, exp_ids, parent_id, [p.info.run_id for p in parents], frame,
                     histories, duplicates, notes)


def _status(r) -> str:
    return r.data.tags.get("status") or MLFLOW_STATUS.get(r.info.status, "unknown")


def _row(r, hist: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    params = {k: cast_param(v) for k, v in r.data.params.items()}
    tags = r.data.tags
    row: dict[str, Any] = {
        "trial_id": tags.get("trial_id") or r.info.run_id, "run_id": r.info.run_id,
        "run_name": r.info.run_name, "status": _status(r), "mlflow_status": r.info.status,
        "git_sha": tags.get("git_sha"),
    }
    for k in FACTORS + ("seed",):
        row[k] = _lookup(params, tags, k)
    start, end = r.info.start_time, r.info.end_time
    row["wall_time_s"] = (end - start) / 1000.0 if start and end and end >= start else math.nan

    def finite(key):
        v = hist.get(key, (np.zeros(0), np.zeros(0)))[1]
        return v[np.isfinite(v)]

    st_ms, mem = finite("perf/step_time_ms"), finite("perf/peak_mem_mb")
    row["step_time_ms"] = float(np.median(st_ms)) if len(st_ms) else math.nan
    row["peak_mem_mb"] = float(np.max(mem)) if len(mem) else math.nan
    tps = math.prod(_as_float(params.get(f"train.{k}")) for k in ("batch_size", "seq_len", "grad_accum"))
    planned = _as_float(params.get("train.steps"))
    reached = max((float(s.max()) for s, _ in hist.values() if len(s)), default=0.0)
    steps_done = planned if row["status"] == stats.FINISHED and not math.isnan(planned) else reached
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
