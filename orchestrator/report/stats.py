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
- Bootstrap percentile CIs of each group's mean, ``rng = default_rng(seed + group_index)``, on
  values sorted first so that row order of the input cannot change a digit of the output.
- Every degenerate case (empty or one-sample group, all values identical, missing baseline, zero
  baseline mean, duplicate seeds) becomes a line in ``Comparison.notes``, never a crash.
- Rendering is deterministic: fixed group order, fixed number formatting, no timestamps.
  The result types and their rendering live in ``orchestrator.report.stats_types`` and are
  re-exported here.
"""
from __future__ import annotations

import gc
import inspect
import math
import warnings
from collections import Counter
from collections.abc import Callable, Hashable
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from lime_arch.errors import ConfigError
from orchestrator.report.stats_types import Comparison, GroupSummary, Omnibus, PairTest

FINISHED = "finished"
PERMUTATION_BELOW = 5  # a group smaller than this makes the chi-square approximation of H poor
EXACT_MWU_MAX_N = 40  # scipy's exact U distribution (no ties) is cheap well beyond this


def _rng_kwargs(func: Callable[..., Any], seed: int) -> dict[str, Any]:
    """scipy renamed random_state to rng (1.15); pass whichever the installed version has."""
    name = "rng" if "rng" in inspect.signature(func).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def cliffs_delta(a: np.ndarray, b: np.ndarray) -> float:
    """P(a > b) - P(a < b) over all pairs; equals the rank-biserial correlation 2U/(n_a n_b) - 1."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.sign(a[:, None] - b[None, :]).mean())


def min_reachable_p(n_a: int, n_b: int) -> float:
    """Smallest two-sided exact Mann-Whitney p-value for n_a vs n_b samples (no ties)."""
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def holm(pvalues: list[float], alpha: float = 0.05) -> tuple[list[float], list[bool]]:
    if not pvalues:
        return [], []
    # statsmodels' Holm branch runs gc.collect() on every call, a full heap scan that costs
    # ~0.2 s once torch/scipy are loaded. Freezing the existing objects for the call limits the
    # scan to new ones; unfreeze puts them back, so nothing else changes.
    gc.freeze()
    try:
        reject, adjusted, _, _ = multipletests(pvalues, alpha=alpha, method="holm")
    finally:
        gc.unfreeze()
    return [float(x) for x in adjusted], [bool(x) for x in reject]


def _mwu(a: np.ndarray, b: np.ndarray, n_resamples: int, seed: int) -> tuple[float, float, str]:
    pooled = np.concatenate([a, b])
    if np.all(pooled == pooled[0]):
        # Every split gives the same U, so the exact p is 1; scipy's approximation would divide 0/0.
        return len(a) * len(b) / 2.0, 1.0, "all values identical"
    ties = len(np.unique(pooled)) < len(pooled)
    if not ties and len(pooled) <= EXACT_MWU_MAX_N:
        res = sps.mannwhitneyu(a, b, alternative="two-sided", method="exact")
        return float(res.statistic), float(res.pvalue), "exact"
    if ties and math.comb(len(pooled), len(a)) <= n_resamples:
        perm = sps.PermutationMethod(n_resamples=n_resamples,
                                     **_rng_kwargs(sps.PermutationMethod, seed))
        res = sps.mannwhitneyu(a, b, alternative="two-sided", method=perm)
        return float(res.statistic), float(res.pvalue), "exact permutation (ties)"
    res = sps.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    return float(res.statistic), float(res.pvalue), "asymptotic"


def _kruskal_permutation(samples: list[np.ndarray], n_resamples: int,
                         seed: int) -> tuple[float, str, int]:
    sizes = [len(s) for s in samples]
    n = sum(sizes)
    ranks = sps.rankdata(np.concatenate(samples))
    _, counts = np.unique(ranks, return_counts=True)
    # Tie correction and N are the same for every permutation of the pooled ranks.
    tie_c = 1.0 - float(np.sum(counts**3 - counts)) / (n**3 - n)

    def h_stat(*groups: np.ndarray, axis: int = -1) -> np.ndarray:
        s = sum(np.sum(g, axis=axis) ** 2 / g.shape[axis] for g in groups)
        return (12.0 / (n * (n + 1)) * s - 3.0 * (n + 1)) / tie_c

    bounds = np.cumsum(sizes)[:-1]
    distinct = math.factorial(n) // math.prod(math.factorial(k) for k in sizes)
    res = sps.permutation_test(tuple(np.split(ranks, bounds)), h_stat,
                               permutation_type="independent", vectorized=True,
                               n_resamples=n_resamples, alternative="greater",
                               **_rng_kwargs(sps.permutation_test, seed))
    # scipy enumerates exactly when n_resamples >= the number of distinct assignments.
    if n_resamples >= distinct:
        return float(res.pvalue), "exact", distinct
    return float(res.pvalue), "monte-carlo", n_resamples


def _bootstrap_ci(x: np.ndarray, confidence: float, n_resamples: int,
                  seed: int) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate-data warnings become notes upstream
        res = sps.bootstrap((x,), np.mean, confidence_level=confidence, method="percentile",
                            n_resamples=n_resamples, **_rng_kwargs(sps.bootstrap, seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


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


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _order_key(v: Any, baseline: Any) -> tuple:
    if v is None:
        return (2, 0, "")
    if _is_number(v):
        return (0, float(v), "")
    return (1, 0 if v == baseline else 1, str(v))


def _require(df: pd.DataFrame, columns: dict[str, str]) -> None:
    for role, col in columns.items():
        if col not in df.columns:
            raise ConfigError(f"stats.{role}: column {col!r} is not in the runs table; "
                              f"columns: {sorted(map(str, df.columns))}")


def _resolve_baseline(baseline: Any, keys: list[Any], axis: str) -> Any:
    if baseline is None:
        return None
    for k in keys:
        if (type(k) is type(baseline) or (_is_number(k) and _is_number(baseline))) and k == baseline:
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
    values = _column_keys(df[axis])
    seeds = _column_keys(df["seed"])
    statuses = [_plain(s) for s in df["status"].tolist()]
    raw_metric = [_plain(m) for m in df[metric].tolist()]
    numeric = pd.to_numeric(df[metric], errors="coerce").astype(float).to_numpy()
    trial_ids = df["trial_id"].tolist() if "trial_id" in df.columns else None

    keys = list(dict.fromkeys(v for v in values if v is not None))
    base = _resolve_baseline(baseline, keys, axis)
    keys.sort(key=lambda v: _order_key(v, base))
    position = {k: i for i, k in enumerate(keys)}

    samples: dict[Any, list[float]] = {k: [] for k in keys}
    sample_seeds: dict[Any, list[Any]] = {k: [] for k in keys}
    excluded: list[dict[str, Any]] = []
    for i, (v, s, st) in enumerate(zip(values, seeds, statuses)):
        x = numeric[i]
        if v is None:
            reason = f"missing value of {axis!r}"
        elif _is_missing(st):
            reason = "missing status"
        elif str(st).strip().lower() != FINISHED:
            reason = f"status is {st!r}, not {FINISHED!r}"
        elif math.isnan(x):
            reason = ("metric is missing (nan)" if _is_missing(raw_metric[i])
                      else f"metric {raw_metric[i]!r} is not a number")
        elif math.isinf(x):
            reason = f"metric is {'+' if x > 0 else '-'}inf"
        else:
            samples[v].append(float(x))
            sample_seeds[v].append(s)
            continue
        row = {"value": v, "seed": s, "status": None if _is_missing(st) else st, "reason": reason}
        if trial_ids is not None:
            row["trial_id"] = _plain(trial_ids[i])
        excluded.append(row)
    excluded.sort(key=lambda e: (position.get(e["value"], len(keys)), _order_key(e["seed"], None),
                                 str(e["status"]), e["reason"], str(e.get("trial_id"))))

    notes: list[str] = []
    data = {k: np.sort(np.asarray(samples[k], float)) for k in keys}
    for k in keys:
        dup = sorted((s for s, c in Counter(sample_seeds[k]).items() if c > 1),
                     key=lambda s: _order_key(s, None))
        if dup:
            notes.append(f"{axis}={k}: seeds {dup} occur more than once; samples may not be "
                         "independent (pooled over another axis? use compare_by)")

    base_mean = float(np.mean(data[base])) if base is not None and len(data[base]) else math.nan
    if base is not None and not len(data[base]):
        notes.append(f"baseline {axis}={base} has no usable samples: no change vs baseline, "
                     "no baseline family")
    elif base is not None and base_mean == 0:
        notes.append(f"baseline {axis}={base} has mean 0: change vs baseline is undefined")

    summaries = []
    n_excl = Counter(e["value"] for e in excluded)
    for i, k in enumerate(keys):
        x = data[k]
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
            ci = _bootstrap_ci(x, confidence, n_resamples, seed + i)
            if math.isnan(ci[0]) or math.isnan(ci[1]):
                notes.append(f"{axis}={k}: bootstrap CI undefined")
        change = (100.0 * (mean - base_mean) / abs(base_mean)
                  if n and base_mean == base_mean and base_mean != 0 else math.nan)
        summaries.append(GroupSummary(
            value=k, n=n, n_excluded=n_excl.get(k, 0), mean=mean,
            std=float(np.std(x, ddof=1)) if n > 1 else math.nan,
            median=float(np.median(x)) if n else math.nan,
            ci_low=ci[0], ci_high=ci[1], change_pct=change))

    if any(2 <= len(data[k]) < PERMUTATION_BELOW for k in keys):
        notes.append(f"percentile bootstrap CIs from fewer than {PERMUTATION_BELOW} samples are "
                     "too narrow; read them as descriptive")
    usable = [k for k in keys if len(data[k]) >= 2]
    left_out = [k for k in keys if len(data[k]) < 2]
    if left_out and len(usable) >= 2:
        notes.append("left out of Kruskal-Wallis and post-hoc tests (fewer than 2 samples): "
                     + ", ".join(f"{axis}={k}" for k in left_out))
    omnibus = _omnibus([data[k] for k in usable], tuple(usable), n_resamples, seed, notes)
    posthoc = _posthoc(data, usable, base, axis, alpha, n_resamples, seed, notes)
    return Comparison(metric=metric, axis=axis, baseline=base, confidence=confidence, alpha=alpha,
                      seed=seed, n_resamples=n_resamples, groups=summaries, omnibus=omnibus,
                      posthoc=posthoc, excluded=excluded, notes=notes)


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
        perm_p, perm_method, perm_count = _kruskal_permutation(samples, n_resamples, seed)
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
        tests = [_mwu(data[a], data[b], n_resamples, seed) for a, b in pairs]
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
    keys = sorted(dict.fromkeys(by_values), key=lambda v: _order_key(v, None))
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
