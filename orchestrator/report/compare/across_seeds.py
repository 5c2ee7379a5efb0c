"""Statistics across seeds: which variants of a sweep differ, and by how much.

Groups are the values of one axis (routers by default, or n_layers, router_lr, ...), samples are
seeds, the metric is any numeric column. Choices, and why:

- Only trials with status "finished" and a finite metric are samples. Every other row is kept in
  ``Comparison.excluded`` with its reason, because a diverged variant is a result too.
- Sweeps have few seeds (often 3), so everything is rank based and small-sample aware:
  Kruskal-Wallis (tie-corrected, scipy) as omnibus test with epsilon^2 = H/(n-1); when any group
  has fewer than 5 samples the chi-square p-value is poor, so a permutation p-value of the same H
  is added (exact enumeration of all distinct group assignments when there are at most
  ``n_resamples`` of them, else seeded Monte-Carlo). Permuting mid-ranks is the same as permuting
  values and re-ranking, which lets H be computed vectorised from rank sums.
- Post-hoc: two-sided Mann-Whitney U for each variant against the baseline and for all pairs,
  Holm-corrected separately per family (statsmodels "holm"; its default is Holm-Sidak).
  Without ties and for small samples the exact null distribution is used. With ties scipy's
  "exact" is wrong and the normal approximation can undercut the smallest p-value the design
  can reach (3 vs 3 with one tie gives 0.077 < 0.1), so ties are tested by exact permutation when
  there are at most ``n_resamples`` splits; only larger samples fall back to "asymptotic".
  The method used is recorded per row.
- Effect size: Cliff's delta = P(a > b) - P(a < b), equal to the rank-biserial correlation of U.
  Positive means the first group tends to have the larger metric.
- The smallest two-sided p-value a pair can reach, 2 / C(n1 + n2, n1), is reported per pair and
  a note says when a family cannot reach p < alpha at all (before or after Holm).
- Student's t CI of each group's mean (the percentile bootstrap used before covered 75% at 3 seeds;
  ``tests/orchestrator/decide/test_coverage.py``); it depends on the values only, not their order.
- Every degenerate case (empty or one-sample group, all values identical, missing baseline, zero
  baseline mean, duplicate seeds) becomes a line in ``Comparison.notes``, never a crash.
- Rendering is deterministic: fixed group order, fixed number formatting, no timestamps.
  The result types and their rendering live in ``orchestrator.report.compare.results`` and are
  re-exported here; the tests and intervals themselves in ``orchestrator.report.stats.ranks``.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from lime_arch.errors import ConfigError
from orchestrator.core.fmt import is_number, order_key
from orchestrator.core.status import TrialStatus
from orchestrator.decide.intervals import t_interval
from orchestrator.report.compare.results import Comparison, GroupSummary, Omnibus, PairTest
from orchestrator.report.stats.multiplicity import holm
from orchestrator.report.stats.ranks import (
    cliffs_delta,
    kruskal_permutation_p,
    mann_whitney,
    min_reachable_p,
)

PERMUTATION_BELOW = 5  # a group smaller than this makes the chi-square approximation of H poor


def _plain(v: Any) -> Any:
    """numpy scalars -> Python scalars, so keys hash, compare and print the same everywhere."""
    return v.item() if isinstance(v, np.generic) else v


def _column_keys(column: pd.Series) -> list[Any]:
    """Python values of a key column, None for missing. A missing entry turns an int column
    into floats (12 -> 12.0); all-integral float columns are turned back into ints."""
    keys = [None if _is_missing(_plain(v)) else _plain(v) for v in column.tolist()]
    present = [k for k in keys if k is not None]
    if present and all(isinstance(k, float) and k.is_integer() for k in present):
        keys = [None if k is None else int(k) for k in keys]
    return keys


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT


def _require(df: pd.DataFrame, columns: dict[str, str]) -> None:
    for role, col in columns.items():
        if col not in df.columns:
            raise ConfigError(f"stats.{role}: column {col!r} is not in the runs table; "
                              f"columns: {sorted(map(str, df.columns))}")


def _resolve_baseline(baseline: Any, keys: list[Any], axis: str) -> Any:
    if baseline is None:
        return None
    for k in keys:
        if (type(k) is type(baseline) or (is_number(k) and is_number(baseline))) and k == baseline:
            return k
    for k in keys:  # MLflow params are strings: "12" should find 12 and vice versa
        if str(k) == str(baseline):
            return k
    raise ConfigError(f"stats.baseline: {baseline!r} is not a value of column {axis!r}; "
                      f"values: {[k for k in keys if k is not None]}")


def compare(df: pd.DataFrame, metric: str = "final/val_loss", axis: str = "router",
            baseline: str | float | None = "none", seed: int = 0, n_resamples: int = 9999,
            confidence: float = 0.95, alpha: float = 0.05) -> Comparison:
    """Compare `metric` across the values of `axis`, seeds as samples (see module docstring)."""
    _require(df, {"metric": metric, "axis": axis, "seed": "seed", "status": "status"})
    rows = Rows.of(df, metric, axis)
    keys = list(dict.fromkeys(v for v in rows.values if v is not None))
    base = _resolve_baseline(baseline, keys, axis)
    keys.sort(key=lambda v: order_key(v, first=base))
    samples, sample_seeds, excluded = _split(rows, keys, axis)
    data = {k: np.sort(np.asarray(samples[k], float)) for k in keys}
    notes = _duplicate_seed_notes(sample_seeds, axis)
    base_mean = _baseline_mean(data, base, axis, notes)
    n_excl = Counter(e["value"] for e in excluded)
    summaries = [_summarize(k, data[k], n_excl.get(k, 0), base_mean, axis, confidence, n_resamples,
                            seed + i, notes) for i, k in enumerate(keys)]
    usable = _testable(data, keys, axis, notes)
    omnibus = _omnibus([data[k] for k in usable], tuple(usable), n_resamples, seed, notes)
    posthoc = _posthoc(data, usable, base, axis, alpha, n_resamples, seed, notes)
    return Comparison(metric=metric, axis=axis, baseline=base, confidence=confidence, alpha=alpha,
                      seed=seed, n_resamples=n_resamples, groups=summaries, omnibus=omnibus,
                      posthoc=posthoc, excluded=excluded, notes=notes)


@dataclass
class Rows:
    """The columns ``compare`` reads, as Python values (None for missing keys)."""

    values: list[Any]
    seeds: list[Any]
    statuses: list[Any]
    raw_metric: list[Any]
    numeric: np.ndarray
    trial_ids: list[Any] | None

    @classmethod
    def of(cls, df: pd.DataFrame, metric: str, axis: str) -> Rows:
        return cls(values=_column_keys(df[axis]), seeds=_column_keys(df["seed"]),
                   statuses=[_plain(s) for s in df["status"].tolist()],
                   raw_metric=[_plain(m) for m in df[metric].tolist()],
                   numeric=pd.to_numeric(df[metric], errors="coerce").astype(float).to_numpy(),
                   trial_ids=df["trial_id"].tolist() if "trial_id" in df.columns else None)


def exclusion(value: Any, status: Any, x: float, raw: Any, axis: str) -> str | None:
    """Why a row is not a sample, or None when it is one."""
    if value is None:
        return f"missing value of {axis!r}"
    if _is_missing(status):
        return "missing status"
    if TrialStatus.parse(status) is not TrialStatus.FINISHED:
        return f"status is {status!r}, not {TrialStatus.FINISHED.value!r}"
    if math.isnan(x):
        return "metric is missing (nan)" if _is_missing(raw) else f"metric {raw!r} is not a number"
    if math.isinf(x):
        return f"metric is {'+' if x > 0 else '-'}inf"
    return None


def _split(rows: Rows, keys: list[Any], axis: str
           ) -> tuple[dict[Any, list[float]], dict[Any, list[Any]], list[dict[str, Any]]]:
    """Samples and their seeds per group, and the excluded rows (sorted) with their reasons."""
    samples: dict[Any, list[float]] = {k: [] for k in keys}
    sample_seeds: dict[Any, list[Any]] = {k: [] for k in keys}
    excluded: list[dict[str, Any]] = []
    for i, (v, s, st) in enumerate(zip(rows.values, rows.seeds, rows.statuses)):
        reason = exclusion(v, st, rows.numeric[i], rows.raw_metric[i], axis)
        if reason is None:
            samples[v].append(float(rows.numeric[i]))
            sample_seeds[v].append(s)
            continue
        row = {"value": v, "seed": s, "status": None if _is_missing(st) else st, "reason": reason}
        if rows.trial_ids is not None:
            row["trial_id"] = _plain(rows.trial_ids[i])
        excluded.append(row)
    position = {k: i for i, k in enumerate(keys)}
    excluded.sort(key=lambda e: (position.get(e["value"], len(keys)), order_key(e["seed"]),
                                 str(e["status"]), e["reason"], str(e.get("trial_id"))))
    return samples, sample_seeds, excluded


def _duplicate_seed_notes(sample_seeds: dict[Any, list[Any]], axis: str) -> list[str]:
    notes = []
    for k, seeds in sample_seeds.items():
        dup = sorted((s for s, c in Counter(seeds).items() if c > 1), key=order_key)
        if dup:
            notes.append(f"{axis}={k}: seeds {dup} occur more than once; samples may not be "
                         "independent (pooled over another axis? use compare_by)")
    return notes


def _baseline_mean(data: dict[Any, np.ndarray], base: Any, axis: str, notes: list[str]) -> float:
    """The baseline's mean (NaN when there is none), with a note when it cannot be used."""
    base_mean = float(np.mean(data[base])) if base is not None and len(data[base]) else math.nan
    if base is not None and not len(data[base]):
        notes.append(f"baseline {axis}={base} has no usable samples: no change vs baseline, "
                     "no baseline family")
    elif base is not None and base_mean == 0:
        notes.append(f"baseline {axis}={base} has mean 0: change vs baseline is undefined")
    return base_mean


def _summarize(k: Any, x: np.ndarray, n_excluded: int, base_mean: float, axis: str, confidence: float,
               n_resamples: int, seed: int, notes: list[str]) -> GroupSummary:
    """One group's numbers (``seed`` is kept for callers; the t interval needs none)."""
    n = len(x)
    mean = float(np.mean(x)) if n else math.nan
    ci = (math.nan, math.nan)
    if n == 0:
        notes.append(f"{axis}={k}: no usable samples")
    elif n == 1:
        notes.append(f"{axis}={k}: one sample, no std or CI")
    elif np.all(x == x[0]):
        ci = (float(x[0]), float(x[0]))
        notes.append(f"{axis}={k}: all {n} values identical, CI collapses to the value")
    else:
        ci = t_interval(x, confidence)
    change = (100.0 * (mean - base_mean) / abs(base_mean)
              if n and base_mean == base_mean and base_mean != 0 else math.nan)
    return GroupSummary(value=k, n=n, n_excluded=n_excluded, mean=mean,
                        std=float(np.std(x, ddof=1)) if n > 1 else math.nan,
                        median=float(np.median(x)) if n else math.nan,
                        ci_low=ci[0], ci_high=ci[1], change_pct=change)


def _testable(data: dict[Any, np.ndarray], keys: list[Any], axis: str, notes: list[str]) -> list[Any]:
    """The groups with at least 2 samples (the ones the tests use), with notes on small ones."""
    usable = [k for k in keys if len(data[k]) >= 2]
    left_out = [k for k in keys if len(data[k]) < 2]
    if left_out and len(usable) >= 2:
        notes.append("left out of Kruskal-Wallis and post-hoc tests (fewer than 2 samples): "
                     + ", ".join(f"{axis}={k}" for k in left_out))
    return usable


def _omnibus(samples: list[np.ndarray], groups: tuple, n_resamples: int, seed: int,
             notes: list[str]) -> Omnibus:
    nan = math.nan
    n_total = int(sum(len(s) for s in samples))
    if len(samples) < 2:
        status = "not run: fewer than 2 groups with at least 2 samples"
        notes.append(f"Kruskal-Wallis {status}")
        return Omnibus(status, groups, n_total, 0, nan, nan, nan, nan, "", 0)
    pooled = np.concatenate(samples)
    if np.all(pooled == pooled[0]):
        # H is 0/0 after the tie correction; scipy returns nan. Say so rather than invent 0/1.
        notes.append("Kruskal-Wallis: all values identical across the tested groups; H and p are "
                     "undefined (reported as nan)")
        return Omnibus("all values identical", groups, n_total, len(samples) - 1,
                       nan, nan, nan, nan, "", 0)
    res = sps.kruskal(*samples)
    h, p = float(res.statistic), float(res.pvalue)
    perm_p, perm_method, perm_count = nan, "", 0
    if min(len(s) for s in samples) < PERMUTATION_BELOW:
        perm_p, perm_method, perm_count = kruskal_permutation_p(samples, n_resamples, seed)
        notes.append(f"some tested group has fewer than {PERMUTATION_BELOW} samples: the "
                     f"chi-square p of Kruskal-Wallis is unreliable, use the {perm_method} "
                     "permutation p")
    return Omnibus("ok", groups, n_total, len(samples) - 1, h, p, h / (n_total - 1),
                   perm_p, perm_method, perm_count)


def _posthoc(data: dict[Any, np.ndarray], usable: list[Any], base: Any, axis: str, alpha: float,
             n_resamples: int, seed: int, notes: list[str]) -> list[PairTest]:
    families: list[tuple[str, list[tuple[Any, Any]]]] = []
    if base is not None and base in usable:
        families.append(("baseline", [(k, base) for k in usable if k != base]))
    elif base is not None and len(usable) >= 2:
        notes.append(f"baseline {axis}={base} has fewer than 2 samples: no baseline family")
    families.append(("all-pairs", list(combinations(usable, 2))))
    rows: list[PairTest] = []
    for family, pairs in families:
        if not pairs:
            continue
        tests = [mann_whitney(data[a], data[b], n_resamples, seed) for a, b in pairs]
        adjusted, reject = holm([t[1] for t in tests], alpha)
        mins = [min_reachable_p(len(data[a]), len(data[b])) for a, b in pairs]
        for (a, b), (u, p, method), q, r, mp in zip(pairs, tests, adjusted, reject, mins):
            rows.append(PairTest(family, a, b, len(data[a]), len(data[b]), u, p, q, r,
                                 cliffs_delta(data[a], data[b]), mp, method))
        best = min(mins)
        if best >= alpha:
            notes.append(f"{family}: the smallest p-value these sample sizes can reach is "
                         f"{best:.4g}, so no pair can reach p < {alpha:g}")
        elif min(1.0, len(pairs) * best) >= alpha:
            notes.append(f"{family}: after Holm over {len(pairs)} comparisons the smallest "
                         f"reachable adjusted p is {min(1.0, len(pairs) * best):.4g}, so no pair "
                         f"can reach p < {alpha:g}")
    return rows


def compare_by(df: pd.DataFrame, metric: str = "final/val_loss", axis: str = "router",
               by: str = "n_layers", baseline: str | float | None = "none", seed: int = 0,
               n_resamples: int = 9999, confidence: float = 0.95,
               alpha: float = 0.05) -> dict[Hashable, Comparison]:
    """One Comparison per value of `by` (e.g. routers at each depth), in sorted order of `by`.

    The baseline must exist somewhere in `df` (else ConfigError, it is a typo). A slice that lacks
    it is compared without one and says so in its notes, since ragged sweeps (a variant run only
    at some depths) are legitimate. Rows with a missing `by` value form their own slice under the
    key None, listed last, so they are never dropped.
    """
    _require(df, {"by": by, "metric": metric, "axis": axis})
    _resolve_baseline(baseline, [k for k in _column_keys(df[axis]) if k is not None], axis)
    by_values = _column_keys(df[by])
    keys = sorted(dict.fromkeys(by_values), key=order_key)
    out: dict[Hashable, Comparison] = {}
    for key in keys:
        part = df[[v == key for v in by_values]]
        present = [k for k in _column_keys(part[axis]) if k is not None]
        try:
            part_baseline = _resolve_baseline(baseline, present, axis)
        except ConfigError:
            part_baseline = None
        comp = compare(part, metric=metric, axis=axis, baseline=part_baseline, seed=seed,
                       n_resamples=n_resamples, confidence=confidence, alpha=alpha)
        if baseline is not None and part_baseline is None:
            comp.notes.insert(0, f"{by}={key}: baseline {axis}={baseline} not present; "
                                 "compared without a baseline")
        out[key] = comp
    return out
