"""The report's downstream-evaluation section, from the ``eval/*`` metrics of the trials' runs
(``lime eval``, a sweep's ``eval:`` block; the names: ``orchestrator.core.eval_names``).

- Which tasks, and which metric of each: the runs' ``eval/primary`` tags (task -> primary metric
  and its direction), in evaluation order. Scores (higher is better: accuracies, exact match) go
  to the Table 1 layout, in points (x 100); losses (the gold answer's bits per byte, ``<task>_bpb``)
  to their own table. Each has an average column: per trial, the mean of its primary scores over
  the table's tasks (a trial missing one of them has no average).
- Every task and each average is compared across the report's axis like the report's metric:
  seeds are the samples, the paired analysis (``orchestrator.report.compare.by_seed``, seeds as
  blocks) gives the verdicts with the report's rule (read off the interval at the family's level,
  ``orchestrator.report.compare.decisions``), the variants of a task being its family; tasks are not
  corrected against each other, so the average's verdict is the headline and a task's alone is one
  of several looks.
- Paired per document (``orchestrator.report.eval_items``), when the runs carry per-document
  results and the caller passes a loader: each variant against the baseline on every document both
  scored within a seed, pooled over seeds, per task and for the average; ``evaluation_items.csv``.
- "Paper vs this run": the paper's Table 1 averages (LLaMA 50.29, DenseFormer 50.62, HC 52.22,
  LIMe 54.21) against this run's average score (``orchestrator.report.paper.fidelity``; directions
  only, the tasks and the scale differ).
- ``evaluation.csv``: a row per (table, variant, task): n, mean, std and the paired verdict.
Torch-free: the section reads the runs frame only.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core import eval_names
from orchestrator.core.fmt import cell_text, num, same_value, table
from orchestrator.decide import signs
from orchestrator.report import eval_items
from orchestrator.report.compare import across_seeds, by_seed, verdicts
from orchestrator.report.compare.results import Comparison, PairedAnalysis
from orchestrator.report.paper import fidelity
from orchestrator.report.paper.refs import REFS
from orchestrator.report.render.comparisons import verdict_lines

AVERAGE = "average"
TABLE1_TASKS = ("multirc", "wic", "qnli", "arc_easy", "arc_challenge", "lime_kv", "lime_induction")


@dataclass
class Column:
    task: str  # a task, or AVERAGE
    metric: str  # the frame's column
    mode: str  # "max" (a score) or "min" (a loss)
    comp: Comparison | None = None
    pa: PairedAnalysis | None = None


@dataclass
class Table:
    title: str
    mode: str
    scale: float  # scores in points (x 100, in the frame the statistics read), losses as they are
    columns: list[Column] = field(default_factory=list)


def primary_metrics(df: pd.DataFrame) -> dict[str, tuple[str, bool]]:
    """task -> (metric, higher is better), in evaluation order, from the runs' ``eval/primary`` tags."""
    col = f"tags.{eval_names.PRIMARY_TAG}"
    out: dict[str, tuple[str, bool]] = {}
    for v in (df[col] if col in df.columns else []):
        if not isinstance(v, str):
            continue
        try:
            tag = json.loads(v)
        except json.JSONDecodeError:
            continue
        for task, (metric, higher) in tag.items():
            if eval_names.metric_key(task, metric) in df.columns:
                out.setdefault(task, (metric, bool(higher)))
    return out


def analyze(df: pd.DataFrame, axis: str, baseline: Any, blocks: list[str], alpha: float,
            seed: int) -> tuple[pd.DataFrame, list[Table]]:
    """The frame with the average columns, and the tables with their statistics ([] without eval)."""
    prim = primary_metrics(df)
    df = df.copy()
    tables = []
    for title, higher, scale, avg in (("Scores", True, 100.0, "eval/average/score"),
                                      ("Gold-answer loss", False, 1.0, "eval/average/bpb")):
        tasks = [(t, m) for t, (m, h) in prim.items() if h == higher]
        if not tasks:
            continue
        mode = "max" if higher else "min"
        keys = [eval_names.metric_key(t, m) for t, m in tasks]
        values = df[keys].apply(pd.to_numeric, errors="coerce") * scale  # scores in points from here on
        df[keys] = values
        df[avg] = values.mean(axis=1, skipna=False)
        tab = Table(title, mode, scale, [Column(t, k, mode) for (t, _), k in zip(tasks, keys)])
        if len(tasks) > 1:
            tab.columns.append(Column(AVERAGE, avg, mode))
        for c in tab.columns:
            c.comp = across_seeds.compare(df, metric=c.metric, axis=axis, baseline=baseline, seed=seed, alpha=alpha)
            c.pa = by_seed.analyze(df, c.comp, blocks, mode)  # the task's variants are its family
        tables.append(tab)
    return df, tables


def section(df: pd.DataFrame, axis: str, baseline: Any, blocks: list[str], alpha: float, seed: int,
            out_dir: Path | None = None, items: eval_items.Loader | None = None) -> list[str]:
    """The markdown lines of the section ([] when no trial has ``eval/*`` metrics); writes
    ``evaluation.csv`` (and ``evaluation_items.csv``) to ``out_dir``. ``items``: a run's
    per-document results (``eval_items.mlflow_loader``); None leaves the per-document comparisons out."""
    frame, tables = analyze(df, axis, baseline, blocks, alpha, seed)
    if not tables:
        return []
    finished = frame[frame["status"].map(lambda s: str(s) == "finished")]
    first = tables[0].columns[0]
    scored = int(pd.to_numeric(finished[first.metric], errors="coerce").notna().sum())
    listed = [c.task for t in tables for c in t.columns if c.task != AVERAGE]
    shots = _shots(frame, [t for t in listed if suite_base(t) not in listed])
    lines = ["", "## Downstream evaluation", "",
             f"Tasks of the LM Evaluation Harness on each trial's final checkpoint (`lime eval`, the sweep's "
             f"`eval:` block): {scored} of {len(finished)} finished trials carry scores. Shots: {shots}. Each cell: "
             "mean ± std over seeds of the task's primary metric (scores in points); the verdicts compare each "
             f"variant with `{cell_text(baseline)}` on its seeds with the report's rule: each verdict is read off "
             f"the {signs.FIXED} interval of the median per-seed difference at the task's Bonferroni level (the "
             "variants of a task are its family; the mean's interval beside it does not decide). Tasks are not "
             "corrected against each other: the average is the headline; a task's verdict alone is one of "
             "several looks."]
    for tab in tables:
        lines += _table_lines(tab, axis, baseline)
    if items is not None:
        lines += _per_document(frame, tables, axis, baseline, blocks, alpha, seed, items, out_dir)
    ref = REFS.get("table1")
    scores = next((t for t in tables if t.mode == "max"), None)
    avg = next((c for c in scores.columns if c.task == AVERAGE), None) if scores else None
    if ref is not None and avg is not None and any(c.task in TABLE1_TASKS for c in scores.columns):
        paper = fidelity.section(ref, avg.comp, avg.pa, [], {}, "max")
        lines += ["", "### Paper vs this run (Table 1, the average score)"] + paper[2:] + [
            f"- This run averages {len(scores.columns) - 1} task(s) "
            f"({', '.join(c.task for c in scores.columns if c.task != AVERAGE)}); the paper 7 at 1B "
            "parameters: only the directions can agree."]
    if out_dir is not None:
        pd.DataFrame(_csv_rows(tables)).to_csv(Path(out_dir) / "evaluation.csv", index=False,
                                               float_format="%.10g", lineterminator="\n")
    return lines


def _per_document(frame: pd.DataFrame, tables: list[Table], axis: str, baseline: Any, blocks: list[str],
                  alpha: float, seed: int, load: eval_items.Loader, out_dir: Path | None) -> list[str]:
    """The comparisons paired per document (``eval_items``) of every table's tasks and average."""
    specs = [(t.title, t.mode, t.scale, [(c.task, c.metric[len(eval_names.metric_key(c.task, "")):])
                                         for c in t.columns if c.task != AVERAGE]) for t in tables]
    variants = [g.value for g in tables[0].columns[0].comp.groups]
    blocks = [b for b in dict.fromkeys(blocks) if b in frame.columns and b != axis]
    found, notes = eval_items.analyze(frame, specs, axis, baseline, variants, blocks, alpha, seed, load)
    if out_dir is not None and found:
        pd.DataFrame(eval_items.csv_rows(found, baseline)).to_csv(
            Path(out_dir) / eval_items.CSV, index=False, float_format="%.10g", lineterminator="\n")
    return eval_items.section(found, notes, baseline, axis, alpha)


def suite_base(task: str) -> str | None:
    """``arc_easy_bpb`` -> ``arc_easy`` (a gold-answer loss variant has its task's shots)."""
    return task[:-4] if task.endswith("_bpb") else None


def _shots(frame: pd.DataFrame, tasks: list[str]) -> str:
    """Each task's shots from its ``eval/<task>/config`` tag (``3-shot,...``)."""
    out = []
    for t in tasks:
        col = f"tags.{eval_names.config_tag(t)}"
        vals = sorted({str(v).split(",")[0] for v in frame[col] if isinstance(v, str)}) if col in frame.columns else []
        out.append(f"{t} {'/'.join(v.removesuffix('-shot') for v in vals) or '?'}")
    return ", ".join(out)


def _cell(c: Column, value: Any) -> str:
    try:
        g = c.comp.group(value)
    except KeyError:
        return "-"
    if g.n == 0:
        return "-"
    sd = f" ± {num(g.std, 3)}" if g.n > 1 and math.isfinite(g.std) else ""
    return f"{num(g.mean, 4)}{sd}"


def _verdict(c: Column, value: Any) -> str:
    if c.pa is None or not c.pa.rows:
        return "-"
    try:
        r = c.pa.row(value)
    except KeyError:
        return "-"
    diff = f"{r.diff_mean:+.3g}" if math.isfinite(r.diff_mean) else "nan"
    if r.verdict in (verdicts.UNTESTED,):
        return r.verdict
    return f"{r.verdict} ({diff}, {verdicts.interval_text(r)})"


def _table_lines(tab: Table, axis: str, baseline: Any) -> list[str]:
    cols = tab.columns
    values = [g.value for g in cols[0].comp.groups] if cols else []
    unit = "points, higher is better" if tab.mode == "max" else "bits per byte of the gold answer, lower is better"
    head = "Table 1 layout" if tab.mode == "max" else "Gold-answer loss"
    names = [c.task + ("" if c.task == AVERAGE else f" ({c.metric.rsplit('/', 1)[1]})") for c in cols]
    n_col = [str(max((c.comp.group(v).n for c in cols if _has(c, v)), default=0)) for v in values]
    body = [[f"{cell_text(v)}{' (baseline)' if same_value(v, baseline) else ''}", n] +
            [_cell(c, v) for c in cols] for v, n in zip(values, n_col)]
    lines = ["", f"### {head} ({unit})", "", *table([axis, "n", *names], body)]
    others = [v for v in values if not same_value(v, baseline)]
    if others and any(c.pa is not None and c.pa.rows for c in cols):
        vbody = [[cell_text(v)] + [_verdict(c, v) for c in cols] for v in others]
        lines += ["", f"Verdicts against `{cell_text(baseline)}` (difference of the means over common seeds, in the "
                  "table's units; alpha "
                  f"{cols[0].comp.alpha:g}):", "", *table([axis, *[c.task for c in cols]], vbody)]
    avg = next((c for c in cols if c.task == AVERAGE), None)
    if avg is not None and avg.pa is not None:
        lines += ["", f"The average ({'scores' if tab.mode == 'max' else 'losses'}):", "", *verdict_lines(avg.pa)]
    elif not any(c.pa is not None and c.pa.paired for c in cols):
        lines += ["", f"- No verdicts: {cols[0].pa.why if cols and cols[0].pa else 'no paired analysis'}"]
    return lines


def _has(c: Column, v: Any) -> bool:
    try:
        c.comp.group(v)
        return True
    except KeyError:
        return False


def _csv_rows(tables: list[Table]) -> list[dict[str, Any]]:
    rows = []
    for tab in tables:
        for c in tab.columns:
            for g in c.comp.groups:
                try:
                    v = c.pa.row(g.value).verdict if c.pa is not None else ""
                except KeyError:
                    v = verdicts.BASELINE if same_value(g.value, c.comp.baseline) else ""
                rows.append({"table": tab.title, "variant": g.value, "task": c.task, "metric": c.metric, "n": g.n,
                             "mean": g.mean, "std": g.std if np.isfinite(g.std) else math.nan, "verdict": v})
    return rows
