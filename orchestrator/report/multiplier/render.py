"""The compute multipliers in a report: the Verdicts section's "Compute multiplier" part, the
ranking's column, summary.csv and per_seed.csv columns and the parent run's metrics.

summary.csv (each variant's row of each scope): ``compute_multiplier`` (the median over blocks),
``compute_multiplier_ci_low`` / ``_ci_high`` (its interval: exp of the median log-multiplier's),
``compute_multiplier_level``, ``compute_multiplier_verdict``, ``compute_multiplier_n`` (blocks with a
value), ``compute_multiplier_extrapolated`` (of them, read off a fitted tail). per_seed.csv (each
paired row of a variant): ``log_multiplier`` (the verdict's sample; empty without a value) and
``multiplier_read`` (how: interpolated, power law, log-linear, first evaluation; with "at most" or
"at least" when censored, or why there is no value). Metrics: ``multiplier/<variant>/median``,
``.../ci_low``, ``.../ci_high``, ``.../extrapolated_seeds``; per depth ``multiplier/<variant>/<scope>/...``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from orchestrator.core.fmt import cell_text, norm_value, num, sci, slug, table
from orchestrator.decide.verdict import BETTER, UNDECIDABLE, UNDECIDED, UNTESTED, WORSE
from orchestrator.report.compare.results import PairedRow
from orchestrator.report.multiplier import Multipliers
from orchestrator.report.multiplier.curve import CAP, LINE, POWER
from orchestrator.report.multiplier.seeds import SeedValue

COLUMNS = ("compute_multiplier", "compute_multiplier_ci_low", "compute_multiplier_ci_high", "compute_multiplier_level",
           "compute_multiplier_verdict", "compute_multiplier_n", "compute_multiplier_extrapolated")
HEADING = "### Worth in compute (multiplier)"  # not "Compute ...": a reader's split on "## Compute" finds the section
WORDS = {BETTER: "better: worth more compute than it costs", WORSE: "worse: worth less compute than it costs",
         UNDECIDED: "not decided: the interval holds 1x"}


def times(x: float) -> str:
    return "-" if x != x else ("inf" if x == math.inf else f"{num(x, 3)}x")


def median(r: PairedRow) -> float:
    return float(np.exp(np.median(r.diffs))) if len(r.diffs) else math.nan


def interval(r: PairedRow) -> tuple[float, float]:
    return float(np.exp(r.ci_low)), float(np.exp(r.ci_high))


def read(s: SeedValue) -> str:
    """How a block's value was read, for per_seed.csv and the per-seed table."""
    if s.reach is None:
        return f"none: {s.why}"
    out = s.reach.how + (" (extrapolated)" if s.reach.extrapolated else "")
    if s.reach.censored:
        out += f", {s.reach.censored}"
    return out + (f": {s.reach.note}" if s.reach.note else "")


def counts(vals: list[SeedValue]) -> str:
    """Which of a comparison's values are extrapolated or censored ("" for none)."""
    ok = [s for s in vals if s.reach is not None]
    ext = [s for s in ok if s.reach.extrapolated]
    parts = []
    if ext:
        forms = [f"{form} {n}" for form in (POWER, LINE) if (n := sum(s.reach.how == form for s in ext))]
        parts.append(f"extrapolated on {len(ext)} of {len(ok)} seeds ({', '.join(forms)})")
    cens = [s.reach.censored for s in ok if s.reach.censored]
    if cens:
        parts.append("censored on " + ", ".join(f"{cens.count(c)} ({c})" for c in dict.fromkeys(cens)))
    if len(ok) < len(vals):
        parts.append(f"{len(vals) - len(ok)} seed(s) without a value ({next(s.why for s in vals if s.reach is None)})")
    return "; ".join(parts)


def sentence(r: PairedRow, vals: list[SeedValue], scope: str) -> str:
    where = "" if scope == "all" else f" ({scope})"
    name = f"**{cell_text(r.variant)}**{where}"
    extra = counts(vals)
    extra = f" {extra[0].upper()}{extra[1:]}." if extra else ""
    if r.verdict == UNTESTED:
        why = r.note or "not tested: fewer than 2 seeds with a value"
        return f"- {name}: {why}; median {times(median(r))}.{extra}"
    lo, hi = interval(r)
    mean = ""
    if r.mean_ci_low == r.mean_ci_low:
        mlo, mhi = np.exp([r.mean_ci_low, r.mean_ci_high])
        mean = (f" Interval of the mean log-multiplier, as a multiplier: [{times(mlo)}, {times(mhi)}] "
                f"({r.mean_method}, not deciding).")
    head = (f"- {name}: {times(median(r))} the compute (median over {r.n} seeds), {r.confidence * 100:.4g}% interval "
            f"[{times(lo)}, {times(hi)}] ({r.method})")
    if r.verdict == UNDECIDABLE:
        word = f"cannot decide: {r.note}" if r.note else "cannot decide: too few seeds for a finite interval"
    else:
        word = WORDS.get(r.verdict, r.verdict)
    flag = f" FLAG {r.flag}: mean and median may differ." if r.flag else ""
    return f"{head}; {word}.{mean}{flag}{extra}"


def seed_table(m: Multipliers) -> list[str]:
    body = []
    for variant, vals in m.values.get("all", {}).items():
        for s in vals:
            if s.reach is None:
                body.append([cell_text(variant), cell_text(s.block), "-", "-", "-", "-", read(s)])
                continue
            body.append([cell_text(variant), cell_text(s.block), num(s.target, 5), sci(s.flops),
                         sci(math.exp(s.reach.log_c)), times(math.exp(s.log_m)), read(s)])
    return table(["variant", "block", "final val/loss", "its FLOPs", "baseline's FLOPs to reach it", "multiplier",
                  "read"], body)


def lines(m: Multipliers, metric: str) -> list[str]:
    """The "Worth in compute" part of the Verdicts section (one line when there is none)."""
    if m.absent:
        return ["", HEADING, "", f"No compute multiplier: {m.absent}. It reads the FLOPs the baseline needs off the "
                "baseline's own `val/loss` curve against training FLOPs, which needs at least two evaluations "
                "(`train.eval_interval`) and `model/flops_per_token`."]
    if not m.rows:
        return []
    kind = ("sign confidence sequence of the median (the seeds were added until the loss verdicts decided)"
            if m.sequential else "sign interval of the median")
    note = "" if metric == "final/val_loss" else f" The report's metric is `{metric}`; the multiplier is of `val/loss`."
    out = ["", HEADING, "",
           "How many times the training compute a variant is worth: per seed, the FLOPs the baseline's run on the "
           "same seed needs to reach the variant's final `val/loss` (its last evaluation), read off the baseline's "
           "own `val/loss` curve against training FLOPs (3 x `model/flops_per_token` x tokens) linearly in log FLOPs "
           "between its evaluations (the first time it gets there), over the variant's own training FLOPs. Above 1x "
           "the variant is worth more compute than it costs. Where the variant ends below the baseline's whole "
           "curve, the FLOPs come from a power law L = a + b C^-c fitted to the last doubling of the baseline's "
           "curve (a straight line in log C where the power law is ill-posed, said per seed), flagged as "
           f"extrapolated; beyond {CAP:g}x the curve's end, or where the fit never gets there, a seed counts "
           f"{CAP:g}x the end (\"at least\"), and a variant that ends above the baseline's first evaluation counts at "
           "that evaluation (\"at most\"): bounds that cannot move an interval across 1x (docs/REPORTS.md). The "
           f"verdict is the loss verdicts' rule on the per-seed log-multipliers: the {kind}, higher is better, in a "
           f"family of its own ({m.family.text()}); the report's equivalence margin is of the metric and is not "
           f"applied here.{note}", ""]
    for scope, rows in m.rows.items():
        out += [sentence(r, m.values[scope][r.variant], scope) for r in rows]
    if "all" in m.values:
        out += ["", "Per seed (the pooled table's blocks):", "", *seed_table(m)]
    return out


def ranking(m: Multipliers) -> dict[str, str]:
    """variant (as text) -> the ranking's cell: the median multiplier and its interval."""
    out = {}
    for r in m.rows.get("all", []):
        lo, hi = interval(r) if r.verdict != UNTESTED else (math.nan, math.nan)
        out[str(norm_value(r.variant))] = times(median(r)) + (f" [{times(lo)}, {times(hi)}]" if lo == lo else "")
    return out


def add_columns(rows: list[dict[str, Any]], m: Multipliers) -> None:
    """The multiplier columns of summary.csv (in place; empty where a row has none)."""
    for row in rows:
        vals: dict[str, Any] = dict.fromkeys(COLUMNS, math.nan)
        r = None if row.get("baseline") else m.row(row["scope"], row["variant"])
        if r is not None:
            lo, hi = interval(r)
            ext = sum(1 for s in m.values[row["scope"]][r.variant] if s.reach is not None and s.reach.extrapolated)
            vals.update(zip(COLUMNS, (median(r), lo, hi, r.confidence, r.verdict, r.n, ext)))
        row.update(vals)


def seed_columns(m: Multipliers, scope: str, variant: Any, block: Any) -> dict[str, Any]:
    """per_seed.csv's ``log_multiplier`` and ``multiplier_read`` of one row."""
    s = m.seed(scope, variant, block)
    if s is None:
        return {"log_multiplier": math.nan, "multiplier_read": ""}
    return {"log_multiplier": s.log_m, "multiplier_read": read(s)}


def metrics(m: Multipliers) -> dict[str, float]:
    """The parent run's numbers."""
    out = {}
    for scope, rows in m.rows.items():
        for r in rows:
            key = f"multiplier/{slug(cell_text(r.variant))}" + ("" if scope == "all" else f"/{slug(scope)}")
            lo, hi = interval(r)
            ext = sum(1 for s in m.values[scope][r.variant] if s.reach is not None and s.reach.extrapolated)
            out.update({f"{key}/median": median(r), f"{key}/ci_low": lo, f"{key}/ci_high": hi,
                        f"{key}/extrapolated_seeds": float(ext)})
    return out
