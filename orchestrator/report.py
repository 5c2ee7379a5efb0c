"""Sweep reports: MLflow runs -> statistics -> ``results/<sweep>/report.md``, ``summary.csv``, PNGs.

``build_report(sweep)`` (and ``lime report SWEEP``) reads the sweep's runs from MLflow, one row per
trial, compares the metric across the values of one axis with ``orchestrator.stats`` and writes:

- a table like the paper's (variant, n, mean +- std, 95% CI, change vs baseline, step time, peak
  memory and parameter count with their change vs baseline), the Kruskal-Wallis line, the
  post-hoc table and the notes of ``stats.compare``;
- every trial that is not a sample (failed, diverged, killed, running, no final metric), and
  every duplicate MLflow run of a trial with the run that was kept;
- for depth sweeps (``n_layers`` varies) the same tables per depth (``stats.compare_by``) and the
  metric against depth;
- plots: loss curves by step and by FLOPs, the final metric per seed, router heatmaps (mean over
  seeds of each run's normalized mean-|w| source map, from the ``router_weights.npz`` artifacts);
- representation-analysis metrics (``analysis/...``) when runs have them;
- the compute each variant used, the sweep file, git commits, library versions and seeds.

Reading the runs:
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

Determinism: rows are sorted by trial, statistics are seeded, plots have fixed styles and no PNG
metadata, and the body has no timestamps, so the same runs give byte-identical files.
The files are also logged to the parent run under the artifact path ``report``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from lime_arch.errors import ConfigError

from . import stats
from .report_plots import cell_text as _cell
from .report_plots import finished as _finished
from .report_plots import make_plots, mean_router_map, router_map_from_npz  # noqa: F401 (API)
from .report_plots import norm_value as _norm
from .report_plots import order_key as _order
from .report_plots import quiet_downloads as _quiet_downloads
from .report_plots import same_value as _same

REPORT_DEFAULTS = {"metric": "final/val_loss", "axis": "router", "baseline": "none"}
# Sweep-file aliases (shared sweep format) -> dotted TrialConfig keys.
ALIASES = {"router": "model.router", "n_layers": "model.n_layers", "d_model": "model.d_model",
           "seed": "train.seed", "steps": "train.steps", "lr": "optim.lr",
           "router_lr": "optim.router_lr", "router_lr_mult": "optim.router_lr_mult",
           "preset": "preset", "router_init": "model.router_init"}
# Columns that can split a sweep into cells besides the compared axis (seed never does).
FACTORS = ("router", "n_layers", "d_model", "preset", "router_init", "lr", "router_lr",
           "router_lr_mult", "steps")
HISTORY_KEYS = ("train/loss", "val/loss", "perf/step_time_ms", "perf/peak_mem_mb")
MLFLOW_STATUS = {"RUNNING": "running", "SCHEDULED": "running", "FINISHED": "finished",
                 "FAILED": "failed", "KILLED": "killed"}
try:  # the sweep parser's table wins, so the report reads axes exactly as sweeps write them
    from .spec import ALIASES as _SPEC_ALIASES

    ALIASES = {**ALIASES, **_SPEC_ALIASES}
except ImportError:
    pass
_CANON = {v: k for k, v in ALIASES.items()}
LIBRARIES = ("torch", "numpy", "scipy", "pandas", "statsmodels", "matplotlib", "mlflow", "ray")


# ------------------------------------------------------------------------------ small helpers

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


def canonical(key: str) -> str:
    """A dotted key that has an alias -> the alias (``model.n_layers`` -> ``n_layers``)."""
    return _CANON.get(key, key)


def _num(x: Any, digits: int = 5) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if abs(x) >= 10**digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else ("0.00%" if x == 0 else f"{x:+.2f}%")


def _sci(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.3e}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def _change(x: float, base: float) -> float:
    if x is None or base is None or math.isnan(x) or math.isnan(base) or base == 0:
        return math.nan
    return 100.0 * (x - base) / abs(base)


def _mean(xs) -> float:
    a = np.asarray([x for x in xs if x is not None], np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if len(a) else math.nan


def _natural(s: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s))


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


# ------------------------------------------------------------------------------ sweep files

@dataclass
class SweepFile:
    """The sweep file of a report: its text (shown verbatim) and what it says about the report.

    Read with ``orchestrator.spec.parse_spec`` (the same rules as ``lime sweep run``); a file that
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
            from .spec import parse_spec
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
    status = run.data.tags.get("status") or MLFLOW_STATUS.get(run.info.status, "unknown")
    value = run.data.metrics.get(metric, math.nan)
    return (status == stats.FINISHED, math.isfinite(value), run.info.end_time or 0,
            run.info.start_time or 0, run.info.run_id)


def load_runs(name: str, metric: str = REPORT_DEFAULTS["metric"], cl=None) -> SweepRuns:
    """The sweep's trial runs as a frame (one row per trial) plus per-step histories.

    Columns: ``trial_id run_id run_name status mlflow_status git_sha``, the aliases of FACTORS and
    ``seed`` (cast values), ``wall_time_s step_time_ms peak_mem_mb steps_done tokens
    flops_per_step flops``, every param as ``params.<key>`` (cast), every non-MLflow tag as
    ``tags.<key>`` (string) and every metric's last value under its own key. ``metric`` decides
    which run of a trial is kept when there are several.
    """
    from . import tracking

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


# ------------------------------------------------------------------------------ tables

def _rows_of(df: pd.DataFrame, axis: str, value: Any) -> pd.DataFrame:
    return df[df[axis].map(lambda v: _same(v, value))]


def group_rows(comp: stats.Comparison, df: pd.DataFrame, scope: str) -> list[dict[str, Any]]:
    """The paper-style numbers per group: statistics plus step time, memory, params, compute."""
    fin = _finished(df)
    aux = {}
    for g in comp.groups:
        f, a = _rows_of(fin, comp.axis, g.value), _rows_of(df, comp.axis, g.value)
        aux[g.value] = {"step_time_ms": _mean(f["step_time_ms"]), "peak_mem_mb": _mean(f["peak_mem_mb"]),
                        "params": _mean(f["model/params"]) if "model/params" in f else math.nan,
                        "trials": len(a), "tokens": float(np.nansum(a["tokens"].astype(float))),
                        "flops": float(np.nansum(a["flops"].astype(float))),
                        "wall_time_s": float(np.nansum(a["wall_time_s"].astype(float)))}
    base = aux.get(comp.baseline, {}) if comp.baseline is not None else {}
    out = []
    for g in comp.groups:
        x = aux[g.value]
        out.append({"scope": scope, "metric": comp.metric, "axis": comp.axis, "variant": _norm(g.value),
                    "baseline": g.value == comp.baseline, "n": g.n, "n_excluded": g.n_excluded,
                    "mean": g.mean, "std": g.std, "median": g.median, "ci_low": g.ci_low,
                    "ci_high": g.ci_high, "change_pct": g.change_pct,
                    "step_time_ms": x["step_time_ms"],
                    "step_time_change_pct": _change(x["step_time_ms"], base.get("step_time_ms", math.nan)),
                    "peak_mem_mb": x["peak_mem_mb"],
                    "peak_mem_change_pct": _change(x["peak_mem_mb"], base.get("peak_mem_mb", math.nan)),
                    "params": x["params"], "params_change_pct": _change(x["params"], base.get("params", math.nan)),
                    "trials": x["trials"], "tokens": x["tokens"], "flops": x["flops"],
                    "wall_time_s": x["wall_time_s"]})
    return out


def paper_table(rows: list[dict[str, Any]], confidence: float = 0.95) -> list[str]:
    level = f"{confidence * 100:g}%"
    body = []
    for r in rows:
        name = _cell(r["variant"]) + (" (baseline)" if r["baseline"] else "")
        ms = f"{_num(r['mean'])} ± {_num(r['std'])}" if r["n"] > 1 else _num(r["mean"])
        body.append([name, str(r["n"]), ms, f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]",
                     _pct(r["change_pct"]), _num(r["step_time_ms"], 4), _pct(r["step_time_change_pct"]),
                     _num(r["peak_mem_mb"], 5), _pct(r["peak_mem_change_pct"]), _num(r["params"], 12),
                     _pct(r["params_change_pct"])])
    return _table(["variant", "n", "mean ± std", f"{level} CI", "change", "step ms", "step change",
                   "peak MB", "memory change", "params", "params change"], body)


def left_out(df: pd.DataFrame, metric: str, axis: str) -> list[dict[str, Any]]:
    """Trials that are not samples: not finished, or finished without a finite metric."""
    out = []
    for _, r in df.iterrows():
        value = r.get(metric, math.nan)
        value = math.nan if value is None else float(value)
        if str(r["status"]).strip().lower() != stats.FINISHED:
            reason = f"status {r['status']}"
        elif not math.isfinite(value):
            reason = f"no {metric}" if math.isnan(value) else f"{metric} is {value}"
        else:
            continue
        out.append({"trial_id": r["trial_id"], "variant": r.get(axis), "seed": r.get("seed"),
                    "status": r["status"], "reason": reason, "steps": r["steps_done"],
                    "run_id": r["run_id"]})
    return sorted(out, key=lambda e: (_order(e["variant"]), _order(e["seed"]), e["trial_id"]))


def _analysis_table(df: pd.DataFrame, labels: list[str]) -> list[str]:
    keys = sorted((c for c in df.columns if isinstance(c, str) and c.startswith("analysis/")), key=_natural)
    if not keys:
        return []
    fin = _finished(df)
    body = []
    for k in keys:
        row = [k]
        for lab in labels:
            v = np.asarray(fin.loc[fin["_cell"] == lab, k].astype(float))
            v = v[np.isfinite(v)]
            row.append("-" if not len(v) else _num(v.mean(), 4) + (
                f" ± {_num(v.std(ddof=1), 3)}" if len(v) > 1 else "") + f" (n={len(v)})")
        body.append(row)
    return _table(["metric"] + labels, body)


# ------------------------------------------------------------------------------ the report

def _pick_baseline(df: pd.DataFrame, axis: str, baseline: Any, explicit: bool) -> tuple[Any, str | None]:
    values = sorted({_norm(v) for v in df[axis] if _norm(v) is not None}, key=_order)
    if baseline is None or explicit or any(_same(v, baseline) for v in values):
        return baseline, None
    if not values:
        return None, None
    return values[0], (f"the default baseline {baseline!r} is not a value of {axis!r}; "
                       f"using the first value, {values[0]!r}")


def _factors(df: pd.DataFrame, axis: str, extra: list[str]) -> list[str]:
    out = []
    for c in dict.fromkeys(list(FACTORS) + extra):
        if c in (axis, "seed") or c not in df.columns:
            continue
        if len({str(_norm(v)) for v in df[c]}) > 1:
            out.append(c)
    return out


def build_report(sweep: str, out: str | Path = "results", metric: str | None = None,
                 axis: str | None = None, baseline: str | None = None, seed: int = 0,
                 log_to_mlflow: bool = True) -> Path:
    """Write ``<out>/<sweep>/report.md``, ``summary.csv`` and PNGs; returns the report.md path."""
    from . import tracking

    sf = resolve_sweep(sweep)
    cl = tracking.client()
    data = load_runs(sf.name, metric=metric or sf.report.get("metric", REPORT_DEFAULTS["metric"]),
                     cl=cl)
    if not sf.given_as_path and data.parent_run_id:
        # The file as launched (logged on the parent run) wins over today's sweeps/<name>.yaml.
        launched = SweepFile(name=sf.name)
        _sweep_file_from_parent(cl, data.parent_run_id, launched)
        if launched.text is not None:
            if sf.text is not None and sf.text != launched.text:
                launched.notes.append(f"{sf.source} has changed since the sweep was launched; "
                                      "the report shows and uses the launched file")
            sf = launched
    metric = str(metric or sf.report.get("metric", REPORT_DEFAULTS["metric"]))
    file_axis = canonical(str(sf.report.get("axis", REPORT_DEFAULTS["axis"])))
    axis = canonical(str(axis)) if axis else file_axis
    # The file's baseline belongs to the file's axis; another axis starts from the default.
    explicit_base = baseline is not None or (axis == file_axis and "baseline" in sf.explicit)
    if baseline is None:
        baseline = sf.report.get("baseline", REPORT_DEFAULTS["baseline"]) if axis == file_axis \
            else REPORT_DEFAULTS["baseline"]
    grid_cols = [g for g in sf.grid_keys if g not in ("seed", "train.seed")]
    add_key_columns(data.frame, [axis] + grid_cols)
    df = data.frame.copy()
    if metric not in df.columns:
        if (df["status"] == stats.FINISHED).any():
            known = sorted(c for c in df.columns if isinstance(c, str) and "/" in c)
            raise ConfigError(f"report.metric: {metric!r} is not logged by any run of sweep "
                              f"{sf.name!r}; metrics: {known}")
        df[metric] = math.nan
    if df[axis].map(lambda v: _norm(v) is None).all():
        raise ConfigError(f"report.axis: {axis!r} has no value in any run of sweep {sf.name!r}; "
                          f"use an alias ({', '.join(ALIASES)}) or a dotted config key")
    base, base_note = _pick_baseline(df, axis, baseline, explicit_base)
    comp = stats.compare(df, metric=metric, axis=axis, baseline=base, seed=seed)
    if base_note:
        comp.notes.insert(0, base_note)

    order = {str(_norm(g.value)): i for i, g in enumerate(comp.groups)}
    factors = _factors(df, axis, grid_cols)
    df["_cell"] = [", ".join([_cell(r[axis])] + [f"{f}={_cell(r[f])}" for f in factors])
                   for _, r in df.iterrows()]
    cell_key = {lab: (order.get(str(_norm(r[axis])), len(order)), _order(r[axis]),
                      tuple(_order(r[f]) for f in factors)) for lab, (_, r) in
                zip(df["_cell"], df.iterrows())}
    labels = sorted(dict.fromkeys(df["_cell"]), key=lambda lab: (cell_key[lab], lab))

    depth = "n_layers" in df.columns and len({str(_norm(v)) for v in df["n_layers"]}) > 1
    by_depth = {}
    if depth and axis != "n_layers":
        by_depth = stats.compare_by(df, metric=metric, axis=axis, by="n_layers", baseline=base, seed=seed)

    out_dir = Path(out) / sf.name
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("*.png"), out_dir / "report.md", out_dir / "summary.csv"]:
        old.unlink(missing_ok=True)

    rows = group_rows(comp, df, "all")
    for d, c in by_depth.items():
        rows += group_rows(c, df[df["n_layers"].map(lambda v: _same(v, d))], f"n_layers={_cell(d)}")
    pd.DataFrame(rows).to_csv(out_dir / "summary.csv", index=False, float_format="%.10g",
                              lineterminator="\n")

    plots, plot_notes = make_plots(cl, df, data.histories, labels, metric, axis,
                                   [g.value for g in comp.groups], out_dir, data.name)
    md = _markdown(sf, data, df, comp, rows, by_depth, labels, plots, plot_notes, metric, axis)
    (out_dir / "report.md").write_text(md)

    if log_to_mlflow:
        if data.parent_run_id:
            cl.log_artifacts(data.parent_run_id, str(out_dir), artifact_path="report")
        else:
            print(f"note: sweep {sf.name!r} has no parent run; the report is not logged to MLflow",
                  file=sys.stderr)
    return out_dir / "report.md"


def _sweep_file_from_parent(cl, parent_id: str, sf: SweepFile) -> None:
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


def _markdown(sf: SweepFile, data: SweepRuns, df, comp, rows, by_depth, labels, plots,
              plot_notes, metric, axis) -> str:
    fin_n = int((df["status"] == stats.FINISHED).sum())
    base = "none" if comp.baseline is None else f"`{_cell(comp.baseline)}`"
    L = [f"# Sweep report: {data.name}", "",
         f"- MLflow: experiment(s) {', '.join(f'`{e}`' for e in data.experiment_ids)}, parent run "
         f"{'`' + data.parent_run_id + '`' if data.parent_run_id else '(none found)'}",
         f"- Trials: {len(df)} ({fin_n} finished), from {len(df) + len(data.duplicates)} MLflow "
         "trial runs",
         f"- Metric `{metric}` compared across `{axis}`, baseline {base}; samples are seeds",
         "", "## Results", ""]
    L += paper_table([r for r in rows if r["scope"] == "all"], comp.confidence)
    L += ["", "Mean, std and the percentile-bootstrap CI are over finished seeds. Step time is the "
          "median `perf/step_time_ms` of a run, peak memory the max `perf/peak_mem_mb`, params "
          "`model/params`; each is averaged over the finished seeds of a variant. Changes are "
          "relative to the baseline's mean."
          + (" This table pools all depths; see \"Results by depth\"." if by_depth else ""),
          "", "## Statistics", "", comp.to_markdown().rstrip()]
    bad = left_out(df, metric, axis)
    L += ["", "## Failed, diverged and incomplete trials", ""]
    if bad:
        L += _table(["trial", axis, "seed", "status", "reason", "steps reached", "run"],
                    [[_cell(b["trial_id"]), _cell(b["variant"]), _cell(b["seed"]), _cell(b["status"]),
                      b["reason"], _num(b["steps"], 12), f"`{b['run_id']}`"] for b in bad])
    else:
        L.append("None: every trial finished with a finite metric.")
    if data.duplicates:
        L += ["", "Duplicate MLflow runs of one trial (the most complete run is kept: finished, "
              "then with the metric, then the latest end/start time):", ""]
        L += _table(["trial", "kept run", "kept status", "dropped run", "dropped status"],
                    [[_cell(d["trial_id"]), f"`{d['kept']}`", d["kept_status"], f"`{d['dropped']}`",
                      d["dropped_status"]] for d in data.duplicates])
    if data.notes or sf.notes:
        L += [""] + [f"- {n}" for n in data.notes + sf.notes]
    if by_depth:
        L += ["", "## Results by depth", ""]
        for d, c in by_depth.items():
            scope = f"n_layers={_cell(d)}"
            L += [f"### n_layers = {_cell(d)}", ""]
            L += paper_table([r for r in rows if r["scope"] == scope], c.confidence)
            L += ["", c.to_markdown().rstrip(), ""]
    L += ["", "## Plots", ""]
    for caption, fname in plots:
        L += [f"{caption}:", "", f"![{caption}]({fname})", ""]
    L += [f"- {n}" for n in plot_notes]
    ana = _analysis_table(df, labels)
    if ana:
        L += ["", "## Representation analysis", "",
              "Mean ± std over finished seeds of the `analysis/...` metrics (issue 8).", ""] + ana
    L += ["", "## Compute", ""]
    comp_rows, tot = [], {"trials": 0, "tokens": 0.0, "flops": 0.0, "wall": 0.0}
    for lab in labels:
        part = df[df["_cell"] == lab]
        t, fl, w = (float(np.nansum(part[c].astype(float))) for c in ("tokens", "flops", "wall_time_s"))
        tot["trials"] += len(part)
        tot["tokens"] += t
        tot["flops"] += fl
        tot["wall"] += w
        comp_rows.append([lab, str(len(part)), _num(t, 15), _sci(fl), f"{w:.1f}"])
    comp_rows.append(["**total**", str(tot["trials"]), _num(tot["tokens"], 15), _sci(tot["flops"]),
                      f"{tot['wall']:.1f}"])
    L += _table(["variant", "trials", "tokens", "FLOPs (3 x forward)", "wall time (s)"], comp_rows)
    L += ["", "All trials count, failed and diverged included (steps actually reached). Tokens = "
          "steps x batch x seq_len x grad_accum; wall time = run end - run start in MLflow."]
    L += ["", "## Reproducibility", ""]
    shas = sorted({str(s) for s in df["git_sha"] if s is not None})
    seeds = sorted({_norm(s) for s in df["seed"] if _norm(s) is not None}, key=_order)
    L += [f"- Git commit(s): {', '.join(f'`{s}`' for s in shas) if shas else '(not logged)'}",
          f"- Seeds: {', '.join(str(s) for s in seeds) if seeds else '(none)'}",
          f"- Statistics seed: {comp.seed}; bootstrap and permutation resamples: {comp.n_resamples}",
          "- Libraries: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()),
          "", f"Sweep file ({sf.source}):", ""]
    if sf.text is not None:
        L += ["```yaml", sf.text.rstrip("\n"), "```"]
    else:
        L.append("(not found: no sweeps/<name>.yaml and no YAML artifact on the parent run)")
    return "\n".join(L) + "\n"


def cmd_report(args) -> int:
    path = build_report(args.sweep, out=args.out, metric=args.metric, axis=args.axis,
                        baseline=args.baseline)
    print(path)
    return 0
