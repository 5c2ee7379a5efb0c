"""The tables of a sweep report, from the runs frame (one row per trial) and ``stats.compare``.

- ``group_rows``: the paper-style numbers per variant (statistics plus step time, peak memory,
  parameters and compute, with their change vs the baseline); they are ``summary.csv``;
- ``paper_table``: those rows as markdown;
- ``left_out``: trials that are not samples (not finished, or finished without a finite metric);
- ``analysis_table``: mean ± std of the ``analysis/...`` metrics per cell;
- ``compute_table``: trials, tokens, FLOPs and wall time per cell, all trials counted;
- ``add_paired_columns``: each variant's paired comparison and verdict, for summary.csv.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core.fmt import cell, cell_text, natural_key, norm_value, num, order_key, pct, same_value, sci, table
from orchestrator.core.status import TrialStatus
from orchestrator.report.compare import verdicts
from orchestrator.report.compare.across_seeds import Comparison
from orchestrator.report.compare.results import PairedAnalysis
from orchestrator.report.render.figures import finished


def change_pct(x: float, base: float) -> float:
    """100 (x - base) / |base|; NaN when either is missing or base is 0."""
    if x is None or base is None or math.isnan(x) or math.isnan(base) or base == 0:
        return math.nan
    return 100.0 * (x - base) / abs(base)


def finite_mean(xs) -> float:
    """The mean of the finite values (NaN when there are none)."""
    a = np.asarray([x for x in xs if x is not None], np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if len(a) else math.nan


def _rows_of(df: pd.DataFrame, axis: str, value: Any) -> pd.DataFrame:
    # astype(bool): an empty object-dtype mask would select columns (an empty frame without any)
    return df[df[axis].map(lambda v: same_value(v, value)).astype(bool)]


def _totals(part: pd.DataFrame) -> tuple[float, float, float]:
    """Tokens, FLOPs and wall time of some trials (missing values count 0)."""
    return tuple(float(np.nansum(part[c].astype(float))) for c in ("tokens", "flops", "wall_time_s"))


def _variant_numbers(fin: pd.DataFrame, every: pd.DataFrame) -> dict[str, float]:
    """Means over a variant's finished trials, compute totals over all of its trials."""
    tokens, flops, wall = _totals(every)
    return {"step_time_ms": finite_mean(fin["step_time_ms"]), "peak_mem_mb": finite_mean(fin["peak_mem_mb"]),
            "params": finite_mean(fin["model/params"]) if "model/params" in fin else math.nan,
            "trials": len(every), "tokens": tokens, "flops": flops, "wall_time_s": wall}


def group_rows(comp: Comparison, df: pd.DataFrame, scope: str) -> list[dict[str, Any]]:
    """The paper-style numbers per group: statistics plus step time, memory, params, compute."""
    fin = finished(df)
    aux = {g.value: _variant_numbers(_rows_of(fin, comp.axis, g.value), _rows_of(df, comp.axis, g.value))
           for g in comp.groups}
    base = aux.get(comp.baseline, {}) if comp.baseline is not None else {}
    out = []
    for g in comp.groups:
        x = aux[g.value]
        out.append({"scope": scope, "metric": comp.metric, "axis": comp.axis, "variant": norm_value(g.value),
                    "baseline": g.value == comp.baseline, "n": g.n, "n_excluded": g.n_excluded,
                    "mean": g.mean, "std": g.std, "median": g.median, "ci_low": g.ci_low,
                    "ci_high": g.ci_high, "change_pct": g.change_pct,
                    "step_time_ms": x["step_time_ms"],
                    "step_time_change_pct": change_pct(x["step_time_ms"], base.get("step_time_ms", math.nan)),
                    "peak_mem_mb": x["peak_mem_mb"],
                    "peak_mem_change_pct": change_pct(x["peak_mem_mb"], base.get("peak_mem_mb", math.nan)),
                    "params": x["params"], "params_change_pct": change_pct(x["params"], base.get("params", math.nan)),
                    "trials": x["trials"], "tokens": x["tokens"], "flops": x["flops"],
                    "wall_time_s": x["wall_time_s"]})
    return out


def paper_table(rows: list[dict[str, Any]], confidence: float = 0.95, stopped: bool = False,
                co_scheduled: bool = False) -> list[str]:
    """``stopped``: the seeds were added until decided, so the t CI of a mean is labelled not valid;
    ``co_scheduled``: the step times were measured beside other trials (``orchestrator.report.cosched``)."""
    level = f"{confidence * 100:g}%"
    body = []
    for r in rows:
        name = cell_text(r["variant"]) + (" (baseline)" if r["baseline"] else "")
        ms = f"{num(r['mean'])} ± {num(r['std'])}" if r["n"] > 1 else num(r["mean"])
        body.append([name, str(r["n"]), ms, f"[{num(r['ci_low'])}, {num(r['ci_high'])}]",
                     pct(r["change_pct"]), num(r["step_time_ms"], 4), pct(r["step_time_change_pct"]),
                     num(r["peak_mem_mb"], 5), pct(r["peak_mem_change_pct"]), num(r["params"], 12),
                     pct(r["params_change_pct"])])
    ci = f"{level} CI" + (" (not valid after optional stopping)" if stopped else "")
    co = " (co-scheduled)" if co_scheduled else ""
    return table(["variant", "n", "mean ± std", ci, "change", f"step ms{co}", f"step change{co}",
                  "peak MB", "memory change", "params", "params change"], body)


def _paired_key(r: dict[str, Any]) -> float:
    """A row's paired change against the baseline (0 for the baseline itself): NaN without pairs."""
    if r["baseline"]:
        return 0.0
    d = r.get("diff_mean", math.nan)
    return float(d) if isinstance(d, (int, float)) else math.nan


def ranking_table(rows: list[dict[str, Any]], iso: dict[str, tuple[float, float]], mode: str,
                  metric: str, mult: dict[str, str] | None = None, co_scheduled: bool = False,
                  wall: dict[str, str] | None = None) -> list[str]:
    """The variants ranked by their paired change against the baseline (each variant's mean per-seed
    difference over the seeds it shares with the baseline: a variant stopped early at 8 seeds is not
    ranked by its 8-seed mean against the baseline's 32-seed mean), beside their rank at the
    baseline's training FLOPs (``iso``: the iso-FLOP comparison's value at that budget; "-" where a
    variant's runs end before it), their verdict against the baseline, step time and training
    memory; with ``mult`` (variant -> text) the compute multiplier and its interval
    (``orchestrator.report.multiplier``), with ``wall`` the wall-clock speedup (``report.wallclock``).
    Rows without paired columns (an unpaired design) rank by their own means."""
    sign = 1.0 if mode == "min" else -1.0
    paired = any(not r["baseline"] and math.isfinite(_paired_key(r)) for r in rows)
    key_of = _paired_key if paired else (lambda r: r["mean"])
    ranked = sorted(rows, key=lambda r: (sign * key_of(r) if math.isfinite(key_of(r)) else math.inf,
                                         order_key(r["variant"])))
    at_budget = {k: v for k, v in iso.items() if math.isfinite(v[0])}
    iso_rank = {k: i + 1 for i, (k, _) in enumerate(sorted(at_budget.items(), key=lambda kv: (sign * kv[1][0], kv[0])))}
    body = []
    for i, r in enumerate(ranked):
        key = str(r["variant"])
        name = cell_text(r["variant"]) + (" (baseline)" if r["baseline"] else "")
        v = at_budget.get(key)
        if paired:
            n = r.get("n_pairs", math.nan)
            change = ("-" if r["baseline"] else pct(r.get("diff_pct", math.nan))
                      + (f" ({int(n)} seeds)" if isinstance(n, (int, float)) and math.isfinite(n) else ""))
        else:
            change = pct(r["change_pct"])
        body.append([str(i + 1), name, num(r["mean"]), change, str(r.get("verdict") or "-"),
                     str(iso_rank[key]) if key in iso_rank else "-", num(v[0]) if v else "-",
                     pct(r["step_time_change_pct"]), pct(r["peak_mem_change_pct"])]
                    + ([("-" if r["baseline"] else mult.get(key, "-"))] if mult is not None else [])
                    + ([("-" if r["baseline"] else wall.get(key, "-"))] if wall is not None else []))
    by = ("by the paired change: each variant's mean per-seed difference to the baseline over the seeds both have"
          if paired else f"by the mean `{cell(metric)}` over seeds")
    note = (f"Rank {by} ({'lower' if mode == 'min' else 'higher'} is better); the mean column is each variant's own "
            "mean over its seeds; equal-FLOPs rank: by `val/loss` at the baseline's final training FLOPs (the Iso-FLOP "
            "comparison below; '-': the variant's runs end before that budget, or no curve was logged); the verdict "
            "is the one of the Verdicts section, read off its interval."
            + (" Compute multiplier: how many times the compute the variant is worth, the median over seeds and "
               "its interval (Verdicts, Worth in compute)." if mult is not None else "")
            + (" Wall-clock speedup: the multiplier times the measured throughput ratio, and its interval "
               "(Verdicts, Worth in wall-clock time)." if wall is not None else "")
            + (" Step changes are co-scheduled (see All numbers), not overhead." if co_scheduled else ""))
    co = " (co-scheduled)" if co_scheduled else ""
    return table(["rank", "variant", "mean", "paired change (seeds)" if paired else "change", "verdict",
                  "rank at equal FLOPs", "val/loss at the baseline's FLOPs", f"step change{co}", "memory change"]
                 + (["compute multiplier [interval]"] if mult is not None else [])
                 + (["wall-clock speedup [interval]"] if wall is not None else []), body) + ["", note]


def left_out(df: pd.DataFrame, metric: str, axis: str) -> list[dict[str, Any]]:
    """Trials that are not samples: not finished, or finished without a finite metric."""
    out = []
    for _, r in df.iterrows():
        value = r.get(metric, math.nan)
        value = math.nan if value is None else float(value)
        if TrialStatus.parse(r["status"]) is not TrialStatus.FINISHED:
            reason = f"status {r['status']}"
        elif not math.isfinite(value):
            reason = f"no {metric}" if math.isnan(value) else f"{metric} is {value}"
        else:
            continue
        out.append({"trial_id": r["trial_id"], "variant": r.get(axis), "seed": r.get("seed"),
                    "status": r["status"], "reason": reason, "steps": r["steps_done"],
                    "run_id": r["run_id"]})
    return sorted(out, key=lambda e: (order_key(e["variant"]), order_key(e["seed"]), e["trial_id"]))


def left_out_table(bad: list[dict[str, Any]], axis: str) -> list[str]:
    return table(["trial", axis, "seed", "status", "reason", "steps reached", "run"],
                 [[cell_text(b["trial_id"]), cell_text(b["variant"]), cell_text(b["seed"]),
                   cell_text(b["status"]), b["reason"], num(b["steps"], 12), f"`{b['run_id']}`"] for b in bad])


def duplicates_table(duplicates: list[dict[str, Any]]) -> list[str]:
    return table(["trial", "kept run", "kept status", "dropped run", "dropped status"],
                 [[cell_text(d["trial_id"]), f"`{d['kept']}`", d["kept_status"], f"`{d['dropped']}`",
                   d["dropped_status"]] for d in duplicates])


def analysis_table(df: pd.DataFrame, labels: list[str]) -> list[str]:
    """Mean ± std (n) over finished seeds of each ``analysis/...`` metric per cell; [] if none."""
    keys = sorted((c for c in df.columns if isinstance(c, str) and c.startswith("analysis/")), key=natural_key)
    if not keys:
        return []
    fin = finished(df)
    body = []
    for k in keys:
        row = [k]
        for lab in labels:
            v = np.asarray(fin.loc[fin["_cell"] == lab, k].astype(float))
            v = v[np.isfinite(v)]
            row.append("-" if not len(v) else num(v.mean(), 4) + (
                f" ± {num(v.std(ddof=1), 3)}" if len(v) > 1 else "") + f" (n={len(v)})")
        body.append(row)
    return table(["metric"] + labels, body)


def compute_table(df: pd.DataFrame, labels: list[str]) -> list[str]:
    """Trials, tokens, FLOPs and wall time per cell and in total (every trial counts)."""
    rows, trials, tokens, flops, wall = [], 0, 0.0, 0.0, 0.0
    for lab in labels:
        part = df[df["_cell"] == lab]
        t, fl, w = _totals(part)
        trials, tokens, flops, wall = trials + len(part), tokens + t, flops + fl, wall + w
        rows.append([lab, str(len(part)), num(t, 15), sci(fl), f"{w:.1f}"])
    rows.append(["**total**", str(trials), num(tokens, 15), sci(flops), f"{wall:.1f}"])
    return table(["variant", "trials", "tokens", "FLOPs (3 x forward)", "wall time (s)"], rows)


# diff_ci_low/high: the verdict's interval at ci_level (before issue 25 a 95% percentile bootstrap);
# p_perm_holm, p_wilcoxon_holm, min_p_holm: Holm over the report's whole baseline family (per family since
# issue 33); estimand: "median" since issue 33 (the verdict's interval), the mean's beside it in mean_ci_*
PAIRED_COLUMNS = ("verdict", "design", "n_pairs", "diff_mean", "diff_pct", "diff_sd", "d_z", "diff_ci_low",
                  "diff_ci_high", "p_perm", "p_perm_holm", "p_wilcoxon", "p_wilcoxon_holm", "min_p_holm", "mde",
                  "mde_pct", "alpha", "better", "ci_level", "ci_method", "family", "family_size", "margin",
                  "within_margin", "seeds_design", "evidence", "estimand", "mean_ci_low", "mean_ci_high",
                  "mean_ci_method", "flag", "note")


def add_paired_columns(rows: list[dict[str, Any]], pa: PairedAnalysis, evidence: str = "screening (one sweep)",
                       sequential: bool = False) -> None:
    """The paired comparison and verdict of each variant, as summary.csv columns (in place)."""
    nan = math.nan
    for row in rows:
        vals = dict.fromkeys(PAIRED_COLUMNS, nan)
        vals.update(design=pa.design, alpha=pa.alpha, better="lower" if pa.mode == "min" else "higher",
                    verdict=verdicts.BASELINE if row["baseline"] else verdicts.UNTESTED,
                    seeds_design="sequential" if sequential else "fixed", evidence=evidence)
        hit = [r for r in pa.rows if same_value(r.variant, row["variant"])]
        if hit:
            r = hit[0]
            vals.update(verdict=r.verdict, n_pairs=r.n, diff_mean=r.diff_mean, diff_pct=r.diff_pct,
                        diff_sd=r.diff_sd, d_z=r.d_z, diff_ci_low=r.ci_low, diff_ci_high=r.ci_high,
                        p_perm=r.p_perm, p_perm_holm=r.p_perm_holm, p_wilcoxon=r.p_wilcoxon,
                        p_wilcoxon_holm=r.p_wilcoxon_holm, min_p_holm=r.min_p_holm, mde=r.mde, mde_pct=r.mde_pct,
                        ci_level=r.confidence, ci_method=r.method, family="baseline", family_size=r.family_size,
                        margin=r.margin, within_margin=r.within_margin, estimand=r.estimand,
                        mean_ci_low=r.mean_ci_low, mean_ci_high=r.mean_ci_high, mean_ci_method=r.mean_method,
                        flag=r.flag, note=r.note)
        elif not pa.paired and not row["baseline"]:
            vals["verdict"] = "no verdict (unpaired design)"
        row.update(vals)


def pair_rows(pa: PairedAnalysis, metric: str, evidence: str = "screening (one sweep)") -> list[dict[str, Any]]:
    """The all-pairs family's rows of one table, as pairs.csv rows (the same column names as summary.csv)."""
    return [{"scope": p.scope, "metric": metric, "axis": pa.axis, "a": norm_value(p.a), "b": norm_value(p.b),
             "verdict": p.verdict, "n_pairs": p.n, "diff_mean": p.diff_mean, "diff_sd": p.diff_sd, "d_z": p.d_z,
             "diff_ci_low": p.ci_low, "diff_ci_high": p.ci_high, "ci_level": p.confidence, "ci_method": p.method,
             "family": "all-pairs", "family_size": p.family_size, "p_perm": p.p_perm, "p_perm_holm": p.p_perm_holm,
             "margin": p.margin, "within_margin": p.within_margin, "alpha": pa.alpha, "estimand": p.estimand,
             "mean_ci_low": p.mean_ci_low, "mean_ci_high": p.mean_ci_high, "mean_ci_method": p.mean_method,
             "flag": p.flag, "note": p.note,
             "better": "lower" if pa.mode == "min" else "higher", "evidence": evidence} for p in pa.pairs]
