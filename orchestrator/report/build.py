"""Sweep reports: MLflow runs -> statistics -> ``results/<sweep>/report.md``, ``summary.csv``, PNGs.

``build_report(sweep)`` (and ``lime report SWEEP``) reads the sweep's runs from MLflow, one row per
trial, compares the metric across the values of one axis with ``orchestrator.report.stats`` and writes:

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

Reading the runs (which experiment and parent run, one run per trial, how params are cast and
step time, memory, tokens and FLOPs are derived) is ``orchestrator.report.runs``; its public
names are re-exported here.

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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.report import stats
from orchestrator.report.plots import cell_text as _cell
from orchestrator.report.plots import finished as _finished
from orchestrator.report.plots import make_plots, mean_router_map, router_map_from_npz  # noqa: F401 (API)
from orchestrator.report.plots import norm_value as _norm
from orchestrator.report.plots import order_key as _order
from orchestrator.report.plots import same_value as _same
from orchestrator.report.runs import (  # noqa: F401 (API)
    ALIASES,
    FACTORS,
    HISTORY_KEYS,
    MLFLOW_STATUS,
    REPORT_DEFAULTS,  # noqa: F401
    SweepFile,
    SweepRuns,
    add_key_columns,
    canonical,  # noqa: F401
    cast_param,
    load_runs,
    resolve_sweep,
)
from orchestrator.report.runs import sweep_file_from_parent as _sweep_file_from_parent

LIBRARIES = ("torch", "numpy", "scipy", "pandas", "statsmodels", "matplotlib", "mlflow", "ray")


# ------------------------------------------------------------------------------ small helpers

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
    from orchestrator.core import tracking

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
        rows += group_rows(c, df[df["n_layers"].map(lambda v, d=d: _same(v, d))], f"n_layers={_cell(d)}")
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
