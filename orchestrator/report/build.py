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

What is compared (metric, axis, baseline) comes from the sweep's parent run
(``orchestrator.report.settings``) unless the caller passes ``settings`` (``lime report FILE``);
``--metric/--axis/--baseline`` override either. Reading the runs is ``orchestrator.report.runs``,
the tables are ``orchestrator.report.tables``.

Determinism: rows are sorted by trial, statistics are seeded, plots have fixed styles and no PNG
metadata, and the body has no timestamps, so the same runs give byte-identical files.
The files are also logged to the parent run under the artifact path ``report``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core import tracking
from orchestrator.core.fmt import cell_text, norm_value, order_key, same_value
from orchestrator.core.keys import ALIASES, FACTORS
from orchestrator.core.status import TrialStatus
from orchestrator.report import stats, tables
from orchestrator.report.plots import make_plots, mean_router_map, router_map_from_npz
from orchestrator.report.runs import SweepRuns, add_key_columns, cast_param, collect_runs, find_runs, load_runs
from orchestrator.report.settings import REPORT_DEFAULTS, Choice, ReportSettings, SweepFile, from_parent_run

__all__ = ["build_report", "library_versions", "ReportSettings", "SweepFile", "REPORT_DEFAULTS", "SweepRuns",
           "load_runs", "cast_param", "mean_router_map", "router_map_from_npz"]
LIBRARIES = ("torch", "numpy", "scipy", "pandas", "statsmodels", "matplotlib", "mlflow", "ray")


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


@dataclass
class _Report:
    """Everything the markdown is written from."""

    data: SweepRuns
    sweep_file: SweepFile
    df: pd.DataFrame  # the runs frame with a ``_cell`` label per trial
    comp: stats.Comparison
    by_depth: dict[Any, stats.Comparison]
    rows: list[dict[str, Any]]  # summary.csv
    labels: list[str]  # the cells in report order
    metric: str
    axis: str
    plots: list[tuple[str, str]]
    plot_notes: list[str]


def build_report(sweep: str, out: str | Path = "results", metric: str | None = None,
                 axis: str | None = None, baseline: str | None = None, seed: int = 0,
                 log_to_mlflow: bool = True, settings: ReportSettings | None = None,
                 sweep_file: SweepFile | None = None) -> Path:
    """Write ``<out>/<sweep>/report.md``, ``summary.csv`` and PNGs; returns the report.md path.

    ``settings`` and ``sweep_file``: what the caller read from a sweep file. Without settings
    they come from the sweep's parent run (the defaults, with a note, when it has none), and so
    does the file shown unless ``sweep_file`` is given."""
    cl = tracking.client()
    found = find_runs(sweep, cl)
    if settings is None:
        settings, launched = from_parent_run(cl, found.parent, sweep)
        sweep_file = launched if sweep_file is None else SweepFile(
            sweep_file.text, sweep_file.source, sweep_file.notes + launched.notes)
    choice = settings.choose(metric, axis, baseline)
    data = collect_runs(found, choice.metric, cl)
    df = _runs_frame(data, choice)
    comp, by_depth = _compare(df, choice, seed)
    labels = _cells(df, comp, choice)

    out_dir = Path(out) / sweep
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("*.png"), out_dir / "report.md", out_dir / "summary.csv"]:
        old.unlink(missing_ok=True)
    rows = _summary_rows(df, comp, by_depth)
    pd.DataFrame(rows).to_csv(out_dir / "summary.csv", index=False, float_format="%.10g", lineterminator="\n")
    plots, plot_notes = make_plots(cl, df, data.histories, labels, choice.metric, choice.axis,
                                   [g.value for g in comp.groups], out_dir, data.name)
    report = _Report(data, sweep_file or SweepFile(), df, comp, by_depth, rows, labels, choice.metric,
                     choice.axis, plots, plot_notes)
    (out_dir / "report.md").write_text(_markdown(report))

    if log_to_mlflow:
        if data.parent_run_id:
            cl.log_artifacts(data.parent_run_id, str(out_dir), artifact_path="report")
        else:
            print(f"note: sweep {sweep!r} has no parent run; the report is not logged to MLflow",
                  file=sys.stderr)
    return out_dir / "report.md"


# ------------------------------------------------------------------------------ the numbers

def _runs_frame(data: SweepRuns, choice: Choice) -> pd.DataFrame:
    """The runs frame with the axis and grid columns; ConfigError for a metric or axis no run has."""
    add_key_columns(data.frame, [choice.axis] + choice.grid_cols)
    df = data.frame.copy()
    if choice.metric not in df.columns:
        if (df["status"] == TrialStatus.FINISHED).any():
            known = sorted(c for c in df.columns if isinstance(c, str) and "/" in c)
            raise ConfigError(f"report.metric: {choice.metric!r} is not logged by any run of sweep "
                              f"{data.name!r}; metrics: {known}")
        df[choice.metric] = float("nan")
    if df[choice.axis].map(lambda v: norm_value(v) is None).all():
        raise ConfigError(f"report.axis: {choice.axis!r} has no value in any run of sweep {data.name!r}; "
                          f"use an alias ({', '.join(ALIASES)}) or a dotted config key")
    return df


def _compare(df: pd.DataFrame, choice: Choice, seed: int) -> tuple[stats.Comparison, dict[Any, stats.Comparison]]:
    """The comparison over all trials and, when depth varies (and is not the axis), per depth."""
    base, base_note = _pick_baseline(df, choice)
    comp = stats.compare(df, metric=choice.metric, axis=choice.axis, baseline=base, seed=seed)
    if base_note:
        comp.notes.insert(0, base_note)
    by_depth = {}
    if choice.axis != "n_layers" and _varies(df, "n_layers"):
        by_depth = stats.compare_by(df, metric=choice.metric, axis=choice.axis, by="n_layers", baseline=base,
                                    seed=seed)
    return comp, by_depth


def _varies(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and len({str(norm_value(v)) for v in df[col]}) > 1


def _pick_baseline(df: pd.DataFrame, choice: Choice) -> tuple[Any, str | None]:
    """The baseline, or (when it was not asked for explicitly and no run has it) the axis' first
    value, with a note."""
    axis, baseline = choice.axis, choice.baseline
    values = sorted({norm_value(v) for v in df[axis] if norm_value(v) is not None}, key=order_key)
    if baseline is None or choice.explicit_baseline or any(same_value(v, baseline) for v in values):
        return baseline, None
    if not values:
        return None, None
    return values[0], (f"the {choice.baseline_origin} baseline {baseline!r} is not a value of {axis!r}; "
                       f"using the first value, {values[0]!r}")


def _cells(df: pd.DataFrame, comp: stats.Comparison, choice: Choice) -> list[str]:
    """Label every trial with its cell (the axis value plus every other factor that varies, as
    ``_cell``) and return the labels in report order: the comparison's group order, then values."""
    axis = choice.axis
    factors = [c for c in dict.fromkeys(list(FACTORS) + choice.grid_cols)
               if c not in (axis, "seed") and _varies(df, c)]
    df["_cell"] = [", ".join([cell_text(r[axis])] + [f"{f}={cell_text(r[f])}" for f in factors])
                   for _, r in df.iterrows()]
    order = {str(norm_value(g.value)): i for i, g in enumerate(comp.groups)}
    cell_key = {lab: (order.get(str(norm_value(r[axis])), len(order)), order_key(r[axis]),
                      tuple(order_key(r[f]) for f in factors))
                for lab, (_, r) in zip(df["_cell"], df.iterrows())}
    return sorted(dict.fromkeys(df["_cell"]), key=lambda lab: (cell_key[lab], lab))


def _summary_rows(df: pd.DataFrame, comp: stats.Comparison,
                  by_depth: dict[Any, stats.Comparison]) -> list[dict[str, Any]]:
    rows = tables.group_rows(comp, df, "all")
    for d, c in by_depth.items():
        part = df[df["n_layers"].map(lambda v, d=d: same_value(v, d))]
        rows += tables.group_rows(c, part, f"n_layers={cell_text(d)}")
    return rows


# ------------------------------------------------------------------------------ the markdown

def _markdown(r: _Report) -> str:
    sections = (_header, _results, _trials, _results_by_depth, _plots, _analysis, _compute,
                _reproducibility)
    return "\n".join(line for section in sections for line in section(r)) + "\n"


def _header(r: _Report) -> list[str]:
    data, df = r.data, r.df
    fin_n = int((df["status"] == TrialStatus.FINISHED).sum())
    base = "none" if r.comp.baseline is None else f"`{cell_text(r.comp.baseline)}`"
    parent = f"`{data.parent_run_id}`" if data.parent_run_id else "(none found)"
    return [f"# Sweep report: {data.name}", "",
            f"- MLflow: experiment(s) {', '.join(f'`{e}`' for e in data.experiment_ids)}, parent run {parent}",
            f"- Trials: {len(df)} ({fin_n} finished), from {len(df) + len(data.duplicates)} MLflow trial runs",
            f"- Metric `{r.metric}` compared across `{r.axis}`, baseline {base}; samples are seeds"]


def _results(r: _Report) -> list[str]:
    lines = ["", "## Results", ""]
    lines += tables.paper_table([row for row in r.rows if row["scope"] == "all"], r.comp.confidence)
    pooled = " This table pools all depths; see \"Results by depth\"." if r.by_depth else ""
    return lines + ["", "Mean, std and the percentile-bootstrap CI are over finished seeds. Step time is the "
                    "median `perf/step_time_ms` of a run, peak memory the max `perf/peak_mem_mb`, params "
                    "`model/params`; each is averaged over the finished seeds of a variant. Changes are "
                    "relative to the baseline's mean." + pooled,
                    "", "## Statistics", "", r.comp.to_markdown().rstrip()]


def _trials(r: _Report) -> list[str]:
    lines = ["", "## Failed, diverged and incomplete trials", ""]
    bad = tables.left_out(r.df, r.metric, r.axis)
    lines += tables.left_out_table(bad, r.axis) if bad else ["None: every trial finished with a finite metric."]
    if r.data.duplicates:
        lines += ["", "Duplicate MLflow runs of one trial (the most complete run is kept: finished, "
                  "then with the metric, then the latest end/start time):", ""]
        lines += tables.duplicates_table(r.data.duplicates)
    notes = r.data.notes + r.sweep_file.notes
    return lines + ([""] + [f"- {n}" for n in notes] if notes else [])


def _results_by_depth(r: _Report) -> list[str]:
    if not r.by_depth:
        return []
    lines = ["", "## Results by depth", ""]
    for d, c in r.by_depth.items():
        scope = f"n_layers={cell_text(d)}"
        lines += [f"### n_layers = {cell_text(d)}", ""]
        lines += tables.paper_table([row for row in r.rows if row["scope"] == scope], c.confidence)
        lines += ["", c.to_markdown().rstrip(), ""]
    return lines


def _plots(r: _Report) -> list[str]:
    lines = ["", "## Plots", ""]
    for caption, fname in r.plots:
        lines += [f"{caption}:", "", f"![{caption}]({fname})", ""]
    return lines + [f"- {n}" for n in r.plot_notes]


def _analysis(r: _Report) -> list[str]:
    ana = tables.analysis_table(r.df, r.labels)
    if not ana:
        return []
    return ["", "## Representation analysis", "",
            "Mean ± std over finished seeds of the `analysis/...` metrics (the representation "
            "analysis a trial runs at its end with `train.analyze`).", ""] + ana


def _compute(r: _Report) -> list[str]:
    return (["", "## Compute", ""] + tables.compute_table(r.df, r.labels)
            + ["", "All trials count, failed and diverged included (steps actually reached). Tokens = "
               "steps x batch x seq_len x grad_accum; wall time = run end - run start in MLflow."])


def _reproducibility(r: _Report) -> list[str]:
    df, sf = r.df, r.sweep_file
    shas = sorted({str(s) for s in df["git_sha"] if s is not None})
    seeds = sorted({norm_value(s) for s in df["seed"] if norm_value(s) is not None}, key=order_key)
    lines = ["", "## Reproducibility", "",
             f"- Git commit(s): {', '.join(f'`{s}`' for s in shas) if shas else '(not logged)'}",
             f"- Seeds: {', '.join(str(s) for s in seeds) if seeds else '(none)'}",
             f"- Statistics seed: {r.comp.seed}; bootstrap and permutation resamples: {r.comp.n_resamples}",
             "- Libraries: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()),
             "", f"Sweep file ({sf.source}):", ""]
    if sf.text is None:
        return lines + ["(not found: no YAML artifact on the parent run)"]
    return lines + ["```yaml", sf.text.rstrip("\n"), "```"]
