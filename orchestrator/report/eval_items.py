"""The report's downstream comparisons paired per document (issue 35), beside the per-seed ones of
``orchestrator.report.evaluation``.

Each trial's run holds its per-document results (``eval/items/<task>.json``,
``orchestrator.core.eval_items``). For every variant, task and table (scores, gold-answer loss):

- pairs: the variant's and the baseline's trial of the same seed (block) whose files for the task
  were made under the same key (shots, limit, context, version); within a pair, the documents both
  scored, matched by index and by the document's hash; the documents every pair shares;
- the difference per document and seed, in the table's units (points for scores), and its
  interval and test pooled over the seeds (``orchestrator.report.stats.items``: the hull of a t
  interval with seeds and documents both random and the sign-flip test over documents);
- the family, as the per-seed verdicts': the variants of a task (or of the average) against the
  baseline, each interval at 1 - alpha / K (Bonferroni, read by ``decide.verdict``), Holm's
  adjusted p over the same family beside it; a comparison whose two models score the same on every
  document in every seed is "not tested" and leaves its family (for a task every model scores the
  same on, every comparison);
- the average: each task's documents weighted 1 / (tasks x its documents), on the seeds every task
  pairs (the per-trial average score's difference).

``evaluation_items.csv``: a row per (table, variant, task). Torch-free; the runs are read by
``mlflow_loader`` (any ``run id -> files`` function will do: the tests pass their own).
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core import eval_items, eval_names
from orchestrator.core.fmt import cell_text, norm_value, num, order_key, same_value, table
from orchestrator.core.tracking import quiet_downloads
from orchestrator.decide.intervals import Interval
from orchestrator.decide.verdict import UNTESTED, verdict
from orchestrator.report.stats.items import METHOD, ItemStats, compare
from orchestrator.report.stats.multiplicity import holm

AVERAGE = "average"
CSV = "evaluation_items.csv"
Loader = Callable[[str], dict[str, dict]]  # run id -> task -> its per-document table


def mlflow_loader(cl) -> Loader:
    """Every run's ``eval/items`` files, read once per run ({} for a run without them)."""
    cache: dict[str, dict[str, dict]] = {}

    def load(run_id: str) -> dict[str, dict]:
        if run_id not in cache:
            out: dict[str, dict] = {}
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    with quiet_downloads():
                        local = Path(cl.download_artifacts(run_id, eval_names.ITEMS_DIR, tmp))
                except Exception:  # noqa: BLE001 - a run evaluated before per-document results has none
                    local = None
                for p in sorted(local.glob("*.json")) if local is not None and local.is_dir() else []:
                    try:
                        t = eval_items.loads(p.read_text(), f"run {run_id}: {eval_names.ITEMS_DIR}/{p.name}")
                    except ConfigError:
                        continue  # an unreadable file pairs nothing; the section counts the runs without files
                    out[str(t["task"])] = t
            cache[run_id] = out
        return cache[run_id]

    return load


@dataclass
class Cell:
    variant: Any
    task: str
    stats: ItemStats | None = None
    verdict: str = UNTESTED
    note: str = ""
    p_holm: float = math.nan
    family: int = 0
    base_mean: float = math.nan
    metric: str = ""
    unpaired: int = 0  # seeds both have whose files could not be paired (another key, no shared document)
    data: list[np.ndarray] | None = None  # the seeds x documents differences of each task, until decided


@dataclass
class ItemTable:
    title: str
    mode: str
    tasks: list[str]
    cells: list[Cell] = field(default_factory=list)

    def cell(self, variant: Any, task: str) -> Cell | None:
        return next((c for c in self.cells if c.task == task and same_value(c.variant, variant)), None)


@dataclass
class _Pairs:
    """One variant and task: per block, the (variant, baseline) values of every shared document."""

    rows: dict[Any, tuple[dict, dict]]
    docs: list[tuple[int, str]]
    skipped: int  # common blocks without a usable pair of files


def _runs(frame: pd.DataFrame, axis: str, blocks: list[str]) -> tuple[dict[str, dict[Any, str]], bool]:
    """variant (as text) -> block -> run id of the finished trials; and whether a block repeats."""
    out: dict[str, dict[Any, str]] = {}
    repeated = False
    for _, r in frame.iterrows():
        if str(r.get("status")) != "finished" or not isinstance(r.get("run_id"), str):
            continue
        key = tuple(norm_value(r.get(b)) for b in blocks)
        per = out.setdefault(str(norm_value(r[axis])), {})
        repeated |= key in per
        per[key] = r["run_id"]
    return out, repeated


def _pairs(load: Loader, runs_v: dict, runs_b: dict, task: str, metric: str) -> _Pairs:
    rows, docs, skipped = {}, None, 0
    for blk in sorted(set(runs_v) & set(runs_b), key=lambda b: tuple(order_key(x) for x in b)):
        tv, tb = load(runs_v[blk]).get(task), load(runs_b[blk]).get(task)
        if tv is None or tb is None or tv["key"] != tb["key"]:
            skipped += 1
            continue
        xv, xb = eval_items.values(tv, metric), eval_items.values(tb, metric)
        shared = {k for k in xv if k in xb and math.isfinite(xv[k]) and math.isfinite(xb[k])}
        if not shared:
            skipped += 1
            continue
        rows[blk] = (xv, xb)
        docs = shared if docs is None else docs & shared
    return _Pairs(rows, sorted(docs or ()), skipped)


def _matrix(p: _Pairs, blocks: list, scale: float) -> np.ndarray:
    """Seeds x documents of variant - baseline in the table's units (rounded to 12 digits: 0.1 - 0.3
    and 0.2 - 0.4 are one difference)."""
    m = np.array([[scale * (p.rows[b][0][k] - p.rows[b][1][k]) for k in p.docs] for b in blocks], np.float64)
    return np.round(m, 12)


def _base_mean(p: _Pairs, blocks: list, scale: float) -> float:
    return float(np.mean([[scale * p.rows[b][1][k] for k in p.docs] for b in blocks]))


def _or_empty(load: Loader) -> Loader:
    """A loader that answers {} where ``load`` answers None (a run it does not know)."""
    def files(rid: str) -> dict[str, dict]:
        return load(rid) or {}
    return files


def analyze(frame: pd.DataFrame, specs: list[tuple[str, str, float, list[tuple[str, str]]]], axis: str,
            baseline: Any, variants: list, blocks: list[str], alpha: float, seed: int,
            load: Loader) -> tuple[list[ItemTable], list[str]]:
    """The per-document comparisons of every table ``(title, mode, scale, [(task, metric)])``;
    and the notes (why there are none, runs without files)."""
    load = _or_empty(load)
    runs, repeated = _runs(frame, axis, blocks)
    if repeated:
        return [], [f"blocks ({', '.join(blocks)}) repeat within a variant: trials cannot be paired per document"]
    base = runs.get(str(norm_value(baseline)), {})
    with_files = {rid for per in runs.values() for rid in per.values() if load(rid)}
    n_runs = sum(len(per) for per in runs.values())
    if not with_files:
        return [], [f"none of the {n_runs} finished trials has per-document results (evaluated before they were "
                    "logged); evaluating them again (`lime eval`, the sweep's `eval:` block) adds them"]
    notes = [] if len(with_files) == n_runs else [
        f"{n_runs - len(with_files)} of {n_runs} finished trials have no per-document results; their seeds are "
        "left out of these comparisons"]
    others = [v for v in variants if not same_value(v, baseline)]
    out = []
    for title, mode, scale, tasks in specs:
        tab = ItemTable(title, mode, [t for t, _ in tasks] + ([AVERAGE] if len(tasks) > 1 else []))
        for v in others:
            pairs = {t: _pairs(load, runs.get(str(norm_value(v)), {}), base, t, m) for t, m in tasks}
            for t, m in tasks:
                tab.cells.append(_cell(v, t, m, pairs[t], list(pairs[t].rows), scale))
            if len(tasks) > 1:
                tab.cells.append(_average(v, tasks, pairs, scale))
        for task in tab.tasks:
            _decide([c for c in tab.cells if c.task == task], mode, alpha, seed)
        out.append(tab)
    return out, notes


def _cell(v: Any, task: str, metric: str, p: _Pairs, blocks: list, scale: float) -> Cell:
    c = Cell(v, task, metric=metric, unpaired=p.skipped)
    if not blocks or len(p.docs) < 2:
        c.note = "not tested: no seed with per-document results of both" if not blocks else (
            f"not tested: {len(p.docs)} document(s) shared")
        return c
    m = _matrix(p, blocks, scale)
    c.base_mean = _base_mean(p, blocks, scale)
    if not np.any(m):
        c.note = f"not tested: the two score the same on every document in every seed ({m.shape[0]} x {m.shape[1]})"
        return c
    c.data = [m]  # decided with its family (``_decide``)
    return c


def _average(v: Any, tasks: list[tuple[str, str]], pairs: dict[str, _Pairs], scale: float) -> Cell:
    c = Cell(v, AVERAGE, metric=AVERAGE)
    common = set.intersection(*(set(pairs[t].rows) for t, _ in tasks))
    blocks = sorted(common, key=lambda b: tuple(order_key(x) for x in b))
    if not blocks or any(len(pairs[t].docs) < 2 for t, _ in tasks):
        c.note = "not tested: no seed with per-document results of every task"
        return c
    mats = [_matrix(pairs[t], blocks, scale) for t, _ in tasks]
    c.base_mean = float(np.mean([_base_mean(pairs[t], blocks, scale) for t, _ in tasks]))
    if not any(np.any(m) for m in mats):
        c.note = "not tested: the two score the same on every document of every task in every seed"
        return c
    c.data = mats
    return c


def _decide(cells: list[Cell], mode: str, alpha: float, seed: int) -> None:
    """The family of one task's (or the average's) comparisons: Bonferroni intervals, Holm's p."""
    tested = [c for c in cells if c.data is not None]
    level = 1.0 - alpha / max(1, len(tested))
    for c in tested:
        c.stats, c.data = compare(c.data, level, seed), None
        c.family = len(tested)
        iv = Interval(c.stats.low, c.stats.high, level, c.stats.n_items, METHOD)
        c.verdict = verdict(iv, mode).word
    for c, p in zip(tested, holm([c.stats.p for c in tested])[0]):
        c.p_holm = p


def _text(c: Cell | None) -> str:
    if c is None:
        return "-"
    if c.stats is None:
        return UNTESTED
    s = c.stats
    return (f"{c.verdict} ({s.diff:+.3g} [{num(s.low, 3)}, {num(s.high, 3)}], Holm p {num(c.p_holm, 2)}; "
            f"{s.n_seeds} x {s.n_items})")


def section(tables: list[ItemTable], notes: list[str], baseline: Any, axis: str, alpha: float) -> list[str]:
    """The markdown of the per-document comparisons (a note alone when there are none)."""
    head = ["", "### Paired per document (pooled over seeds)", ""]
    if not tables:
        return head + [f"- {n}" for n in notes]
    lines = head + [
        f"Each variant against `{cell_text(baseline)}` document by document: the difference on every "
        "document both models of a seed scored, pooled over the seeds both have (the interval: the hull of "
        "a t interval with seeds and documents both random and the sign-flip test over documents, which "
        "stays honest at accuracies near 0 and 1; docs/EVALUATION.md). Each interval at its task's "
        "Bonferroni level (the variants of a task, or of the average, are its family), Holm's p over the "
        "same family beside it; a comparison whose two models score the same on every document in every "
        "seed is not tested. Cells: verdict (difference [interval], Holm p; seeds x documents), in the "
        "table's units. These verdicts are beside the per-seed ones above, not instead of them: they "
        "count every document, the per-seed ones only each seed's total."]
    lines += [f"- {n}" for n in notes]
    for tab in tables:
        variants = list(dict.fromkeys(str(norm_value(c.variant)) for c in tab.cells))
        body = [[v] + [_text(tab.cell(v, t)) for t in tab.tasks] for v in variants]
        levels = sorted({f"{100 * c.stats.level:.4g}%" for c in tab.cells if c.stats is not None})
        lines += ["", f"{tab.title} ({'higher' if tab.mode == 'max' else 'lower'} is better; alpha {alpha:g}, "
                  f"intervals at {', '.join(levels) or '-'}):", "", *table([axis, *tab.tasks], body)]
        flagged = [f"{cell_text(c.variant)} on {c.task} (F-test p {num(c.stats.seeds_p, 2)})" for c in tab.cells
                   if c.stats is not None and math.isfinite(c.stats.seeds_p) and c.stats.seeds_p < alpha]
        if flagged:
            lines += ["", "- Seeds disagree beyond their documents' noise (the interval carries that seed "
                      "variance): " + "; ".join(flagged) + "."]
        untested = []  # why a comparison is not tested, once a task
        for task in tab.tasks:
            why = {c.note for c in tab.cells if c.task == task and c.stats is None}
            if why:
                who = "every variant" if all(c.stats is None for c in tab.cells if c.task == task) else "some variants"
                untested.append(f"- {task} ({who}): " + "; ".join(sorted(why)) + ".")
        lines += [""] + untested if untested else []
    return lines


def csv_rows(tables: list[ItemTable], baseline: Any) -> list[dict[str, Any]]:
    nan = math.nan
    rows = []
    for tab in tables:
        for c in tab.cells:
            s = c.stats
            rows.append({"table": tab.title, "variant": c.variant, "baseline": baseline, "task": c.task,
                         "metric": c.metric, "seeds": s.n_seeds if s else 0, "unpaired_seeds": c.unpaired,
                         "documents": s.n_items if s else 0,
                         "base_mean": c.base_mean, "diff": s.diff if s else nan,
                         "diff_ci_low": s.low if s else nan, "diff_ci_high": s.high if s else nan,
                         "confidence": s.level if s else nan, "family_size": c.family, "p": s.p if s else nan,
                         "p_holm": c.p_holm, "se_documents": s.se_items if s else nan,
                         "sd_seeds": s.sd_seeds if s else nan, "seeds_p": s.seeds_p if s else nan,
                         "method": METHOD if s else "", "better": "higher" if tab.mode == "max" else "lower",
                         "margin": nan, "verdict": c.verdict, "note": c.note})
    return rows
