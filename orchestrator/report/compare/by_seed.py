"""The paired analysis of a sweep: seeds are blocks, every variant is compared with the baseline
on the seeds both have.

Why paired: the engine draws every batch as a pure function of (seed, step) and builds the model
right after seeding, with the router's own weights created after the shared ones, so two trials
with the same seed see the same data in the same order and start from the same weights for
every parameter they share (tests/orchestrator/report/test_pairing.py checks this for every
registered router). The seed-to-seed variation therefore cancels in the per-seed difference
variant - baseline, and the paired tests see effects that the unpaired Kruskal-Wallis and
Mann-Whitney tests (still in the report) cannot.

- Samples are the same as ``stats.compare``'s (finished trials with a finite metric). A block is
  a seed, or a seed together with other factors that vary but are not compared (``blocks``,
  e.g. ``("seed", "n_layers")`` for a table pooled over depths).
- The design is "paired" when no block repeats within a variant. A variant missing some of the
  baseline's seeds is compared on the seeds both have, with a note; Friedman uses the seeds all
  tested variants share. When blocks repeat (a factor pooled without being a block), the design
  is "unpaired": the report then has no verdicts and says why.
- Tests and their choices are in ``orchestrator.report.stats.paired``. The verdict is read off the
  interval of the mean difference at the family's Bonferroni level, and Holm runs within each test
  over the same family (``orchestrator.report.compare.decisions``).
- Per-seed differences are rounded to 12 significant digits of the metric's scale (``snap``),
  so the float noise of a subtraction cannot create or break ties between differences.
- The verdict's interval is the median difference's sign interval and the mean's (``paired_interval``,
  Student's t and the exact sign-flip inversion) is shown beside it: ``orchestrator.decide.rule``.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core.fmt import norm_value, order_key
from orchestrator.decide.families import BASELINE, Family
from orchestrator.decide.verdict import Margin
from orchestrator.report.compare import verdicts
from orchestrator.report.compare.across_seeds import Comparison, Rows, exclusion
from orchestrator.report.compare.decisions import decide_rows
from orchestrator.report.compare.results import FriedmanResult, PairedAnalysis, PairedRow
from orchestrator.report.stats.paired import friedman, friedman_min_p, sign_flip_test, wilcoxon

WHY_PAIRED = ("a seed fixes the data order and the initial weights of every parameter the variants share, so "
              "the per-seed difference variant - baseline cancels the seed-to-seed variation")


def analyze(df: pd.DataFrame, comp: Comparison, blocks: Sequence[str] = ("seed",),
            mode: str | None = None, margin: Margin | None = None, scope: str = "all") -> PairedAnalysis:
    """The paired analysis of ``comp``'s metric and axis on the trials of ``df`` (its verdicts with
    this table's comparisons as the family; ``decisions.apply`` widens it to the report's)."""
    mode = verdicts.metric_mode(comp.metric, mode)
    blocks = [b for b in dict.fromkeys(blocks) if b in df.columns and b != comp.axis]
    base = comp.baseline
    out = PairedAnalysis(design="unpaired", why="", metric=comp.metric, axis=comp.axis, baseline=base,
                         alpha=comp.alpha, mode=mode, friedman=None, rows=[], scope=scope)
    if "seed" not in blocks:
        out.why = "the runs have no seed column, so seeds cannot be matched; the unpaired tests below apply."
        return out
    values, repeated = _block_values(df, comp, blocks)
    if repeated:
        out.why = (f"seeds repeat within a variant ({repeated}): the table pools trials that differ in "
                   "something besides the axis and the seed, so they cannot be paired; the unpaired tests "
                   "below apply" + (" (the per-depth tables are paired)." if "n_layers" in df.columns else "."))
        return out
    tested = [g.value for g in comp.groups if len(values.get(g.value, {})) >= 2]
    out.design = "paired"
    out.values = {g: values[g] for g in tested}
    out.why = _why(values, tested, blocks, out.notes, comp.axis)
    out.friedman = _friedman(values, tested, comp, out.notes)
    if base is None or base not in tested:
        out.notes.append("no baseline with at least 2 seeds: no paired comparisons and no verdicts")
        return out
    out.rows = _pairs(values, tested, comp, mode, margin)
    return out


def block_key(row: pd.Series, blocks: list[str]) -> Any:
    keys = tuple(norm_value(row[b]) for b in blocks)
    return keys[0] if len(keys) == 1 else keys


def _block_values(df: pd.DataFrame, comp: Comparison, blocks: list[str]) -> tuple[dict, str]:
    """Per group value: {block: metric} over the samples; and a description of repeats, if any."""
    rows = Rows.of(df, comp.metric, comp.axis)
    keys = [block_key(r, blocks) for _, r in df.iterrows()]
    known = {str(norm_value(g.value)): g.value for g in comp.groups}
    values: dict[Any, dict[Any, float]] = {}
    counts: Counter = Counter()
    for i, v in enumerate(rows.values):
        if exclusion(v, rows.statuses[i], rows.numeric[i], rows.raw_metric[i], comp.axis) is not None:
            continue
        g = known.get(str(norm_value(v)), v)
        counts[(g, keys[i])] += 1
        values.setdefault(g, {})[keys[i]] = float(rows.numeric[i])
    dup = sorted({g for (g, _), c in counts.items() if c > 1}, key=order_key)
    return values, ", ".join(f"{comp.axis}={g}" for g in dup)


def _label(block: Any, blocks: list[str]) -> str:
    return str(block) if len(blocks) == 1 else ",".join(f"{b}={v}" for b, v in zip(blocks, block))


def _why(values: dict, tested: list, blocks: list[str], notes: list[str], axis: str) -> str:
    unit = "seed" if blocks == ["seed"] else " x ".join(blocks) + " cell"
    sets = {g: set(values[g]) for g in tested}
    every = sorted(set().union(*sets.values()) if sets else set(), key=order_key)
    shown = ", ".join(_label(b, blocks) for b in every)
    if all(s == set(every) for s in sets.values()):
        return (f"Blocks are {unit}s: every variant has the same {unit}s ({shown}), and {WHY_PAIRED}; the "
                "verdicts use the paired tests. Kruskal-Wallis and Mann-Whitney (below) treat the seeds as "
                "independent samples and stay for reference.")
    for g in tested:
        missing = [b for b in every if b not in sets[g]]
        if missing:
            where = ", ".join(_label(b, blocks) for b in missing)
            notes.append(f"{axis}={g} has no finished sample at {unit} {where}: it is compared on the seeds it "
                         "shares with the baseline")
    return (f"Blocks are {unit}s, and {WHY_PAIRED}. Not every variant finished every {unit} ({shown}): each "
            "variant is compared with the baseline on the seeds both have, Friedman on the seeds all share "
            "(see the notes). Kruskal-Wallis and Mann-Whitney (below) use every finished seed.")


def _friedman(values: dict, tested: list, comp: Comparison, notes: list[str]) -> FriedmanResult:
    common = sorted(set.intersection(*(set(values[g]) for g in tested)) if tested else set(), key=order_key)
    groups = tuple(tested)
    if len(tested) < 3:
        why = ("not run: with 2 variants the paired tests below are the omnibus test" if len(tested) == 2
               else "not run: fewer than 2 variants with 2 or more seeds")
        return FriedmanResult(why, groups, len(common), *([math.nan] * 3), "", 0, math.nan, math.nan)
    if len(common) < 2:
        return FriedmanResult("not run: fewer than 2 seeds shared by all variants", groups, len(common),
                              *([math.nan] * 3), "", 0, math.nan, math.nan)
    x = np.array([[values[g][b] for g in tested] for b in common])
    res = friedman(x, comp.n_resamples, comp.seed)
    min_p = friedman_min_p(len(common), len(tested), comp.n_resamples)
    if res["status"] == "ok" and min_p >= comp.alpha:
        notes.append(f"Friedman: with {len(common)} seeds and {len(tested)} variants the smallest reachable "
                     f"permutation p is {min_p:.4g}, so it cannot reach p < {comp.alpha:g}")
    return FriedmanResult(res["status"], groups, len(common), res["chi2"], res["p"], res["perm_p"],
                          res["perm_method"], res["perm_count"], res["kendall_w"], min_p)


def snap(d: np.ndarray, scale: float) -> np.ndarray:
    """Differences rounded to 12 significant digits of the values' scale: 2.7 - 2.9 and 2.8 - 3.0
    are the same difference, so float noise cannot create or break a tie (or a zero spread)."""
    if scale <= 0 or not math.isfinite(scale):
        return d
    return np.round(d, 11 - math.floor(math.log10(scale)))


def _pairs(values: dict, tested: list, comp: Comparison, mode: str, margin: Margin | None) -> list[PairedRow]:
    base = comp.baseline
    rows = []
    for g in [g for g in tested if g != base]:
        common = sorted(set(values[g]) & set(values[base]), key=order_key)
        d = snap(np.array([values[g][b] - values[base][b] for b in common]),
                 max((abs(values[x][b]) for x in (g, base) for b in common), default=0.0))
        base_mean = float(np.mean([values[base][b] for b in common])) if common else math.nan
        rows.append(paired_row(g, common, d, base_mean, comp.n_resamples, comp.seed))
    family = Family(BASELINE, sum(1 for r in rows if r.n >= 2), comp.alpha)
    return decide_rows(rows, family, mode, margin, n_resamples=comp.n_resamples, seed=comp.seed)


def paired_row(g, common: Sequence, d: np.ndarray, base_mean: float, n_resamples: int, seed: int) -> PairedRow:
    """One comparison's own numbers (``common``: its blocks, ``d``: its per-block differences); its
    interval, verdict and family-wide p come from ``decide_rows`` (or ``decisions.baseline_family``)."""
    nan = math.nan
    n = len(d)
    mean = float(np.mean(d)) if n else nan
    sd = float(np.std(d, ddof=1)) if n > 1 else nan
    rel = 100.0 * mean / abs(base_mean) if n and base_mean == base_mean and base_mean != 0 else nan
    dz = mean / sd if n > 1 and sd > 0 else nan
    p_perm, perm_method, _ = sign_flip_test(d, n_resamples, seed) if n >= 2 else (nan, "", 0)
    w_plus, p_wil, wil_method, zeros = wilcoxon(d) if n >= 2 else (nan, nan, "", 0)
    return PairedRow(variant=g, n=n, seeds=tuple(common), base_mean=base_mean, diff_mean=mean, diff_pct=rel,
                     diff_sd=sd, d_z=dz, ci_low=nan, ci_high=nan, confidence=nan, p_perm=p_perm,
                     p_perm_holm=nan, perm_method=perm_method, w_plus=w_plus, p_wilcoxon=p_wil,
                     p_wilcoxon_holm=nan, wilcoxon_method=wil_method, zeros=zeros, min_p_holm=nan, mde=nan,
                     mde_pct=nan, verdict=verdicts.UNTESTED, diffs=tuple(float(x) for x in d))
