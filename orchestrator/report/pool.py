"""``lime report --pool a,b,...``: the pre-registered comparisons of several sweeps in one family.

A single sweep's verdicts are screening: its family is its own comparisons. Pooling names the sweeps
whose comparisons were fixed in advance (their files say what is compared) and puts every
comparison with a baseline of every one of them (each pooled and per-depth table) into one
baseline family, and every pair of variants into one all-pairs family, with one Bonferroni
correction each (``orchestrator.report.compare.decisions``). Each comparison keeps its own sweep's
seeds, direction, margin and kind of interval (a sweep run until decided keeps its
confidence sequence: it covers at any level at every number of seeds). The sweeps must share the
metric (as ``--pool``'s help says) and alpha.

Writes ``<out>/pool-<a>-<b>.../report.md`` and ``summary.csv`` (one row per comparison, with its
sweep) and ``pairs.csv``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core import tracking
from orchestrator.core.fmt import slug
from orchestrator.decide.families import FAMILY_NOTE
from orchestrator.report.build import sweep_analyses, sweep_choice
from orchestrator.report.compare.decisions import baseline_family, pairs_family
from orchestrator.report.render import tables
from orchestrator.report.render.comparisons import verdict_lines


def pool_name(names: list[str]) -> str:
    return "pool-" + "-".join(slug(n) for n in names)


def build_pool(names: list[str], out: str | Path = "results", seed: int = 0) -> Path:
    if len(names) < 2 or len(set(names)) != len(names):
        raise ConfigError(f"report --pool: name two or more different sweeps, got {','.join(names)!r}")
    cl = tracking.client()
    metrics = {n: sweep_choice(n, cl)[1].metric for n in names}  # read before anything is computed
    if len(set(metrics.values())) > 1:
        raise ConfigError("report --pool: the sweeps compare different metrics (" + ", ".join(
            f"{n}: {m}" for n, m in metrics.items()) + "); pooled comparisons share one metric")
    sweeps = [sweep_analyses(n, cl, seed) for n in names]
    alphas = {s.choice.alpha for s in sweeps}
    if len(alphas) > 1:
        raise ConfigError(f"report --pool: the sweeps' report.alpha differ ({sorted(alphas)}); pooled comparisons "
                          "share one error rate")
    alpha = alphas.pop()
    paired = [(s, t) for s in sweeps for t in s.tables if t.paired]
    seqs = [s.choice.decide is not None for s, _ in paired]
    kw = dict(modes=[s.mode for s, _ in paired], margins=[s.choice.margin for s, _ in paired], seqs=seqs, seed=seed)
    decided, base = baseline_family([t.rows for _, t in paired], alpha, paired[0][0].mode if paired else "min", **kw)
    paired = [(s, dataclasses.replace(t, rows=r)) for (s, t), r in zip(paired, decided)]
    prs, pairs = pairs_family([t for _, t in paired], alpha, paired[0][0].mode if paired else "min", **kw)
    evidence = f"pooled: {', '.join(names)}"
    rows, pair_csv, body = [], [], []
    for (s, t), seq, pr in zip(paired, seqs, prs):
        t = dataclasses.replace(t, pairs=pr)
        part = [{"sweep": s.name, "scope": t.scope, "metric": t.metric, "axis": t.axis, "variant": r.variant,
                 "baseline": False} for r in t.rows]
        tables.add_paired_columns(part, t, evidence, seq)
        rows += part
        pair_csv += [{"sweep": s.name, **p} for p in tables.pair_rows(t, t.metric, evidence)]
        body += ["", f"### {s.name}" + ("" if t.scope == "all" else f" ({t.scope})"), "", *verdict_lines(t)]
    out_dir = Path(out) / pool_name(names)
    out_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out_dir / "summary.csv", index=False, float_format="%.10g", lineterminator="\n")
    if pair_csv:
        pd.DataFrame(pair_csv).to_csv(out_dir / "pairs.csv", index=False, float_format="%.10g", lineterminator="\n")
    md = [f"# Pooled report: {', '.join(names)}", "",
          f"- Pre-registered comparisons of {len(names)} sweeps, each as its own report compares it (its parent "
          "run's metric, axis, baseline, margin and kind of interval), in one family per kind:",
          f"- {FAMILY_NOTE}: {base.text()}" + (f"; {pairs.text()}" if pairs.size else "") + ".",
          "- Confirmation: a verdict here holds with the family's error rate over every named sweep, not one "
          "sweep's screening rate.", "", "## Verdicts", *body]
    (out_dir / "report.md").write_text("\n".join(md) + "\n")
    return out_dir / "report.md"
