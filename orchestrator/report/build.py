"""Sweep reports: MLflow runs -> statistics -> ``results/<sweep>/report.md``, ``summary.csv``, PNGs.

``build_report(sweep)`` (and ``lime report SWEEP``) reads the sweep's runs from MLflow, one row per
trial, compares the metric across the values of one axis and writes (``per_seed.csv``: every sample
the verdicts use, ``orchestrator.report.per_seed``):

- a header with the design, alpha and the baseline's init and lr;
- a table like the paper's (variant, n, mean +- std, CI, change vs baseline, step time, memory, params);
- a verdict per variant from the per-seed differences (``orchestrator.decide.rule``, through
  ``orchestrator.report.compare``), labelled after sequential stopping (``render.sequential``);
- with ``report.tune``, each variant at its own best value of the tuning axis (``compare.tuning``);
- for a search sweep, its configurations against the best one, and the winner named (``search``);
- for a sweep that mirrors a paper result, "paper vs this run" (``orchestrator.report.paper.fidelity``);
- the unstable trials (spike-tagged by the engine's stability monitor, or diverged) and which
  verdicts move without them (``orchestrator.report.unstable``: a sensitivity line, nothing dropped);
- every trial that is not a sample (failed, diverged, killed, running, no final metric), and
  every duplicate MLflow run of a trial with the run that was kept; for depth sweeps (``n_layers``
  varies) the same tables per depth and the metric against depth;
- plots: loss curves by step and by FLOPs, the final metric per seed, router heatmaps (mean over
  seeds of each run's normalized mean-|w| source map, from the ``router_weights.npz`` artifacts);
- each variant's compute multiplier: the FLOPs the baseline needs to reach its final validation loss
  over its own, per seed, with the verdict rule's interval (``orchestrator.report.multiplier``), and
  its wall-clock speedup: that times the throughput ratio measured by ``lime report --throughput``
  (``measure``; ``orchestrator.report.wallclock``, ``throughput.json`` beside the report);
- the iso-FLOP comparison (each variant at the baseline's final FLOP budget) and, when a variant was
  trained at several sizes, the scaling section (fits, multipliers, hold-out check, depth view;
  ``orchestrator.report.scaling``, whose numbers also go to the parent run as ``scaling/...`` metrics);
- representation-analysis metrics (``analysis/...``) when runs have them; for trials trained with router
  pruning, Table 5's counts and the loss cost and step-time saving of pruning against the unpruned twins
  (``routing``), and the retrieval curves of Figure 9 and a token-dependent router's spread maps;
- downstream tasks (``eval/...``) when runs have them: the Table 1 layout with paired verdicts
  per task and for the average, the same paired per document (``eval_items``), and the paper's
  Table 1 directions (``orchestrator.report.evaluation``, also ``evaluation.csv``, ``evaluation_items.csv``);
- the compute each variant used, the sweep's efficiency ratio and its trials' start-up
  (``orchestrator.report.efficiency``), the sweep file, git commits, library versions and seeds.

What is compared (metric, axis, baseline) comes from the sweep's parent run
(``orchestrator.report.settings``) unless the caller passes ``settings`` (``lime report FILE``);
``--metric/--axis/--baseline`` override either. Reading the runs is ``orchestrator.report.runs``,
the tables are ``orchestrator.report.render.tables``, the markdown ``orchestrator.report.render.sections``.

Determinism: rows are sorted by trial, statistics are seeded, plots have fixed styles and no PNG
metadata, and the body has no timestamps, so the same runs (and throughput.json) give byte-identical
files. The files are also logged to the parent run under the artifact path ``report``, with ``report.html``:
the same report with its plots embedded, which MLflow's artifact viewer renders (``render.html``).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core import record, tracking
from orchestrator.core.fmt import cell_text, norm_value, order_key, same_value
from orchestrator.core.keys import ALIASES, FACTORS
from orchestrator.core.status import TrialStatus
from orchestrator.decide.verdict import Margin, check_margin_metrics
from orchestrator.report import (
    cosched,
    curves,
    eval_items,
    evaluation,
    multiplier,
    per_seed,
    routing,
    scaling,
    search,
    unstable,
    wallclock,
)
from orchestrator.report.compare import across_seeds, by_seed, decisions, tuning, verdicts
from orchestrator.report.compare.results import Comparison, PairedAnalysis
from orchestrator.report.multiplier import render as mult_render
from orchestrator.report.paper.refs import reference_for
from orchestrator.report.render import sections, sequential, tables
from orchestrator.report.render.figures import make_plots, mean_router_map, router_map_from_npz
from orchestrator.report.render.html import write_html
from orchestrator.report.render.sections import ReportData
from orchestrator.report.runs import SweepRuns, add_key_columns, collect_runs, find_runs, load_runs
from orchestrator.report.settings import REPORT_DEFAULTS, Choice, ReportSettings, SweepFile, choose, from_parent_run
from orchestrator.report.wallclock import render as wall_render

__all__ = ["build_report", "library_versions", "ReportSettings", "SweepFile", "REPORT_DEFAULTS", "SweepRuns",
           "load_runs", "mean_router_map", "router_map_from_npz"]
PER_SEED = "per_seed.csv"
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


def build_report(sweep: str, out: str | Path = "results", metric: str | None = None,
                 axis: str | None = None, baseline: str | None = None, seed: int = 0,
                 log_to_mlflow: bool = True, settings: ReportSettings | None = None,
                 sweep_file: SweepFile | None = None, measure=None, rounds: int | None = None) -> Path:
    """Write ``<out>/<sweep>/report.md``, ``summary.csv``, ``per_seed.csv`` and PNGs; returns the report.md path.

    ``settings`` and ``sweep_file``: what the caller read from a sweep file. Without settings
    they come from the sweep's parent run (the defaults, with a note, when it has none), and so
    does the file shown unless ``sweep_file`` is given. ``measure``, ``rounds``: ``lime report --throughput``."""
    cl = tracking.client()
    found = find_runs(sweep, cl)
    if settings is None:
        settings, launched = from_parent_run(cl, found.parent, sweep)
        sweep_file = launched if sweep_file is None else SweepFile(
            sweep_file.text, sweep_file.source, sweep_file.notes + launched.notes)
    choice = stopping_margin(choose(settings, metric, axis, baseline), found, settings)
    ref = reference_for(sweep, choice.paper)
    data = collect_runs(found, choice.metric, cl)
    data.notes.extend(curves.apply_final_evals(data.frame, data.histories, choice.metric, choice.final_evals))
    df = _runs_frame(data, choice)
    mode = verdicts.metric_mode(choice.metric, choice.mode)
    if choice.folded:  # a search: each configuration against the best one
        choice = dataclasses.replace(choice, baseline=search.best(df, choice.metric, mode), explicit_baseline=True)
    sdf, tuned, notes = _tuned(df, choice, mode)
    comp, by_depth, pa, depth_pairs, families = _decided(sdf, choice, mode, seed)
    blocks = _blocks(sdf, choice)
    labels = _cells(df, comp, choice)
    tables_decided = [pa] + [p for _, p in depth_pairs.values()]
    # the verdicts without the unstable trials: the same pipeline on the rest (a sensitivity line)
    unstable_lines = unstable.section(df, sdf, choice.axis, tables_decided,
                                      lambda rest: _decided_tables(rest, choice, mode, seed))
    waves = record.decide_waves(found.parent.data.params) if found.parent is not None else {}

    out_dir = Path(out) / sweep
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("*.png"), out_dir / "report.md", out_dir / "report.html", out_dir / "summary.csv",
                out_dir / "pairs.csv", out_dir / "evaluation.csv", out_dir / eval_items.CSV, out_dir / PER_SEED]:
        old.unlink(missing_ok=True)
    rows = _summary_rows(sdf, comp, pa, depth_pairs, tuned, families.sequential)
    # the compute each variant is worth (issue 35), and whether its step times were measured beside other trials
    mult = multiplier.build(sdf, data.histories, choice.axis, blocks, tables_decided, choice.alpha, families.sequential,
                            seed)
    co = cosched.find(df, choice.axis)
    wall = wallclock.build(sdf, choice.axis, blocks, tables_decided, mult, out_dir, sweep, measure, rounds)
    mult_render.add_columns(rows, mult)
    wall_render.add_columns(rows, wall)
    cosched.add_column(rows, co)
    pd.DataFrame(rows).to_csv(out_dir / "summary.csv", index=False, float_format="%.10g", lineterminator="\n")
    seeds = per_seed.rows(tables_decided, blocks, seed, lambda *key: mult_render.seed_columns(mult, *key))
    if seeds:  # every sample the verdicts rest on (orchestrator.report.per_seed)
        pd.DataFrame(seeds).to_csv(out_dir / PER_SEED, index=False, float_format="%.17g", lineterminator="\n")
    pairs = [p for a in [pa] + [x for _, x in depth_pairs.values()] for p in tables.pair_rows(a, choice.metric)]
    if pairs:
        pd.DataFrame(pairs).to_csv(out_dir / "pairs.csv", index=False, float_format="%.10g", lineterminator="\n")
    plots, plot_notes = make_plots(cl, df, data.histories, labels, choice.metric, choice.axis,
                                   [g.value for g in comp.groups], out_dir, data.name)
    factors = [c for c in list(FACTORS) + choice.grid_cols if c != choice.tune]
    scal = scaling.build(sdf, data.histories, choice.metric, choice.axis, comp.baseline, mode, factors,
                         out_dir, data.name, seed, margin=choice.margin, verdicts=_depth_verdicts(depth_pairs))
    # downstream tasks (eval/* metrics), when trials carry them: the Table 1 layout and its verdicts
    evals = evaluation.section(sdf, choice.axis, comp.baseline, blocks, choice.alpha, seed, out_dir,
                               eval_items.mlflow_loader(cl))  # and paired per document, from eval/items
    if choice.folded and search.plot(df, choice.folded, choice.metric, out_dir / "search.png", data.name):
        plots.append((f"{choice.metric} against each searched value (x: mean of a configuration)", "search.png"))
    report = ReportData(data, sweep_file or SweepFile(), df, sdf, comp, pa, depth_pairs, rows, labels,
                        choice.metric, choice.axis, mode, plots, plot_notes, library_versions(), ref, tuned, notes,
                        scal.lines + evals + routing.section(df, labels, choice.metric, mode),
                        search.section(df, choice.folded, choice.metric, mode) if choice.folded else [],
                        families=families, margin=choice.margin, iso=scal.iso,
                        sequential=sequential.lines(pa, waves, choice.decide, ref, mode, _abs_margin(choice))
                        if families.sequential else [],
                        unstable=unstable_lines, multipliers=mult, co_scheduled=co, wallclock=wall)
    (out_dir / "report.md").write_text(sections.markdown(report))
    write_html(out_dir / "report.md", f"Sweep report: {data.name}")  # report.html: the plots embedded

    if log_to_mlflow:
        if data.parent_run_id:
            cl.log_artifacts(data.parent_run_id, str(out_dir), artifact_path="report")
            scaling.log(cl, data.parent_run_id, scal)
            scaling.log_metrics(cl, data.parent_run_id, {**mult_render.metrics(mult), **wall_render.metrics(wall)})
        else:
            print(f"note: sweep {sweep!r} has no parent run; the report is not logged to MLflow",
                  file=sys.stderr)
    return out_dir / "report.md"


# ------------------------------------------------------------------------------ the numbers

def _runs_frame(data: SweepRuns, choice: Choice) -> pd.DataFrame:
    """The runs frame with the axis and grid columns; ConfigError for a metric or axis no run has."""
    if choice.folded:
        add_key_columns(data.frame, list(choice.folded))
        search.add_configurations(data.frame, choice.folded)
    add_key_columns(data.frame, [choice.axis] + choice.grid_cols + ([choice.tune] if choice.tune else []))
    df = data.frame.copy()
    if choice.metric not in df.columns:
        if (df["status"] == TrialStatus.FINISHED).any():
            known = sorted(c for c in df.columns if isinstance(c, str) and "/" in c)
            raise ConfigError(f"report.metric: {choice.metric!r} is not logged by any run of sweep "
                              f"{data.name!r}; metrics: {known}")
        df[choice.metric] = float("nan")
    if (df["status"] == TrialStatus.FINISHED).any():
        check_margin_metrics(choice.margins, [c for c in df.columns if isinstance(c, str) and "/" in c], data.name)
    if df[choice.axis].map(lambda v: norm_value(v) is None).all():
        raise ConfigError(f"report.axis: {choice.axis!r} has no value in any run of sweep {data.name!r}; "
                          f"use an alias ({', '.join(ALIASES)}) or a dotted config key")
    return df


def _compare(df: pd.DataFrame, choice: Choice, seed: int) -> tuple[Comparison, dict[Any, Comparison]]:
    """The comparison over all trials and, when depth varies (and is not the axis), per depth."""
    base, base_note = _pick_baseline(df, choice)
    comp = across_seeds.compare(df, metric=choice.metric, axis=choice.axis, baseline=base, seed=seed,
                                alpha=choice.alpha)
    if base_note:
        comp.notes.insert(0, base_note)
    by_depth = {}
    if choice.axis != "n_layers" and "n_layers" not in choice.folded and _varies(df, "n_layers"):
        by_depth = across_seeds.compare_by(df, metric=choice.metric, axis=choice.axis, by="n_layers", baseline=base,
                                    seed=seed, alpha=choice.alpha)
    return comp, by_depth


def _decided(sdf: pd.DataFrame, choice: Choice, mode: str, seed: int):
    """(comparison, per-depth comparisons, paired table, per-depth (comparison, paired table),
    families) of some trials, every verdict decided: what the report's tables show."""
    comp, by_depth = _compare(sdf, choice, seed)
    blocks = _blocks(sdf, choice)
    pa = by_seed.analyze(sdf, comp, blocks, mode, choice.margin)
    depth_pairs = {d: (c, by_seed.analyze(_at_depth(sdf, d), c, blocks, mode, choice.margin,
                                          scope=f"n_layers={cell_text(d)}")) for d, c in by_depth.items()}
    pa, depth_pairs, families = _families(pa, depth_pairs, choice, mode, seed)
    return comp, by_depth, pa, depth_pairs, families


def _decided_tables(sdf: pd.DataFrame, choice: Choice, mode: str, seed: int) -> list[PairedAnalysis]:
    _, _, pa, depth_pairs, _ = _decided(sdf, choice, mode, seed)
    return [pa] + [p for _, p in depth_pairs.values()]


def _varies(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and len({str(norm_value(v)) for v in df[col]}) > 1


def _free(df: pd.DataFrame, col: str, axis: str) -> bool:
    """A factor that varies on its own: not one that the compared value fixes (a ``variant``
    bundle's ``router`` or ``depth_mix``), which is part of the variant, not a cell or a block."""
    if not _varies(df, col):
        return False
    if axis not in df.columns:
        return True
    per_value: dict[str, set[str]] = {}
    for a, v in zip(df[axis], df[col]):
        per_value.setdefault(str(norm_value(a)), set()).add(str(norm_value(v)))
    return any(len(vs) > 1 for vs in per_value.values())


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


def _cells(df: pd.DataFrame, comp: Comparison, choice: Choice) -> list[str]:
    """Label every trial with its cell (the axis value plus every other factor that varies, as
    ``_cell``) and return the labels in report order: the comparison's group order, then values."""
    axis = choice.axis
    factors = [c for c in dict.fromkeys(list(FACTORS) + choice.grid_cols)
               if c not in (axis, "seed", *choice.folded) and _free(df, c, axis)]
    df["_cell"] = [", ".join([cell_text(r[axis])] + [f"{f}={cell_text(r[f])}" for f in factors])
                   for _, r in df.iterrows()]
    order = {str(norm_value(g.value)): i for i, g in enumerate(comp.groups)}
    cell_key = {lab: (order.get(str(norm_value(r[axis])), len(order)), order_key(r[axis]),
                      tuple(order_key(r[f]) for f in factors))
                for lab, (_, r) in zip(df["_cell"], df.iterrows())}
    return sorted(dict.fromkeys(df["_cell"]), key=lambda lab: (cell_key[lab], lab))


def _at_depth(df: pd.DataFrame, d: Any) -> pd.DataFrame:
    return df[df["n_layers"].map(lambda v: same_value(v, d))]


def _families(pa: PairedAnalysis, by_depth: dict[Any, tuple[Comparison, PairedAnalysis]], choice: Choice,
              mode: str, seed: int) -> tuple[PairedAnalysis, dict[Any, tuple[Comparison, PairedAnalysis]],
                                             decisions.Families]:
    """Every table's verdicts with the report's families: the comparisons with the baseline over the
    pooled and every per-depth table, and all pairs of variants over the same tables."""
    analyses, families = decisions.apply([pa] + [p for _, p in by_depth.values()], choice.alpha, mode,
                                         choice.margin, sequential=choice.decide is not None,
                                         seed=seed)
    return analyses[0], {d: (c, p) for (d, (c, _)), p in zip(by_depth.items(), analyses[1:])}, families


def _abs_margin(choice: Choice) -> float | None:
    """The sequential section's margin in metric units (``stopping_margin`` made it absolute)."""
    m = choice.margin
    return m.value if m is not None and not m.relative else None


def _depth_verdicts(depth_pairs: dict) -> dict[tuple[str, int], str]:
    """(variant, depth) -> its verdict in the per-depth table, for the depth view to quote."""
    out = {}
    for d, (_, p) in depth_pairs.items():
        if isinstance(d, (int, float)) and not isinstance(d, bool) and float(d).is_integer():
            out.update({(cell_text(r.variant), int(d)): r.verdict for r in p.rows})
    return out


def _summary_rows(df: pd.DataFrame, comp: Comparison, pa: PairedAnalysis,
                  by_depth: dict[Any, tuple[Comparison, PairedAnalysis]],
                  tuned: tuning.Tuning | None, sequential: bool = False) -> list[dict[str, Any]]:
    rows = tables.group_rows(comp, df, "all")
    tables.add_paired_columns(rows, pa, sequential=sequential)
    for d, (c, p) in by_depth.items():
        part = tables.group_rows(c, _at_depth(df, d), f"n_layers={cell_text(d)}")
        tables.add_paired_columns(part, p, sequential=sequential)
        rows += part
    if tuned is not None:
        for row in rows:
            hit = [v for k, v in tuned.chosen.items() if same_value(k, row["variant"])]
            row[f"tuned_{tuned.axis}"] = hit[0] if hit else None
    return rows


def _blocks(df: pd.DataFrame, choice: Choice) -> list[str]:
    """Seeds, plus every other factor that varies but is neither compared nor tuned: trials that
    share all of them share their data order and initial weights."""
    others = [c for c in dict.fromkeys(list(FACTORS) + choice.grid_cols)
              if c not in (choice.axis, "seed", choice.tune, *choice.folded) and _free(df, c, choice.axis)]
    return ["seed"] + others


def _tuned(df: pd.DataFrame, choice: Choice, mode: str) -> tuple[pd.DataFrame, tuning.Tuning | None, list[str]]:
    """The trials at each variant's best value of the tuning axis (all trials without one)."""
    if not choice.tune:
        return df, None, []
    if choice.tune == choice.axis:
        return df, None, [f"report.tune is the compared axis ({choice.tune}); no tuning applied"]
    sdf, tuned = tuning.select(df, choice.metric, choice.axis, choice.tune, mode, choice.baseline)
    return sdf, tuned, []


@dataclasses.dataclass
class SweepAnalyses:
    """One sweep's paired tables before the families are applied (``orchestrator.report.pool``)."""

    name: str
    choice: Choice
    mode: str
    tables: list[PairedAnalysis]  # the pooled table, then one per depth


def sweep_choice(sweep: str, cl):
    """(the sweep's runs, what its own report compares: its parent run's settings), read only."""
    found = find_runs(sweep, cl)
    settings, _ = from_parent_run(cl, found.parent, sweep)
    return found, stopping_margin(choose(settings), found, settings)


def stopping_margin(choice: Choice, found: Any, settings: ReportSettings) -> Choice:
    """A sequential sweep's report applies the margin its waves stopped on: the absolute value fixed
    at the first look (``sweep.decide.margin_abs`` on the parent run), not its % setting re-read
    against the final baseline mean, which moves with every seed added after the first look."""
    params = found.parent.data.params if found.parent is not None else {}
    if choice.decide is None or record.DECIDE_MARGIN not in params or choice.metric != settings.metric:
        return choice
    v = record.cast_param(params[record.DECIDE_MARGIN])
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        return choice
    return dataclasses.replace(choice, margin=Margin(float(v), False))


def sweep_analyses(sweep: str, cl, seed: int = 0) -> SweepAnalyses:
    """The paired tables of a sweep compared as its own report compares it (its parent run's settings)."""
    found, choice = sweep_choice(sweep, cl)
    df = _runs_frame(collect_runs(found, choice.metric, cl), choice)
    mode = verdicts.metric_mode(choice.metric, choice.mode)
    if choice.folded:
        choice = dataclasses.replace(choice, baseline=search.best(df, choice.metric, mode), explicit_baseline=True)
    sdf, _, _ = _tuned(df, choice, mode)
    comp, by_depth = _compare(sdf, choice, seed)
    blocks = _blocks(sdf, choice)
    tables = [by_seed.analyze(sdf, comp, blocks, mode, choice.margin)]
    tables += [by_seed.analyze(_at_depth(sdf, d), c, blocks, mode, choice.margin, scope=f"n_layers={cell_text(d)}")
               for d, c in by_depth.items()]
    return SweepAnalyses(sweep, choice, mode, tables)
