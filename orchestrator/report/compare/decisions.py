"""The verdicts of a report: every comparison's interval at its family's level, and the verdict read
off it (``orchestrator.decide``), for the comparisons with the baseline and for all pairs.

``decide_rows`` fills the interval, verdict, Holm p-values and minimal detectable effect of a list of
``PairedRow`` that form one family (or part of one: ``family`` gives its size); ``pair_rows`` builds
the all-pairs rows of one table from its paired samples; ``apply`` does both over every table of a
report (the pooled one and each per-depth one), so each family is the whole report's:

- the interval: ``paired_interval`` (the hull of Student's t and the inverted sign-flip test) for a
  fixed-seed sweep, the confidence sequence (``orchestrator.decide.sequential``) for one whose seeds
  were added until decided (its stopping made any fixed-n interval invalid), at 1 - alpha / m;
- the verdict: ``orchestrator.decide.verdict.verdict`` of that interval and the absolute margin (a %
  margin is taken of the comparison's baseline mean on its seeds);
- Holm-adjusted p-values (permutation and Wilcoxon) over the same family, as supporting numbers;
- the MDE of a fixed-n comparison: the mean difference its interval would exclude with 80% power at
  this n and level, given the observed sd (``orchestrator.report.stats.verdict_power``).
"""
from __future__ import annotations

import dataclasses
import math
from itertools import combinations

import numpy as np

from orchestrator.core.fmt import order_key
from orchestrator.decide.families import BASELINE, PAIRS, Family
from orchestrator.decide.intervals import paired_interval
from orchestrator.decide.sequential import confidence_sequence
from orchestrator.decide.verdict import Margin, verdict
from orchestrator.report.compare.results import PairComparison, PairedAnalysis, PairedRow
from orchestrator.report.stats.multiplicity import holm, holm_min_p
from orchestrator.report.stats.paired import sign_flip_min_p, sign_flip_test
from orchestrator.report.stats.verdict_power import verdict_mde_dz

nan = math.nan


def interval(d: np.ndarray, level: float, sequential: bool, seed: int):
    return confidence_sequence(d, level) if sequential else paired_interval(d, level, seed)


def _abs_margin(margin: Margin | None, base_mean: float) -> float:
    m = margin.absolute(base_mean) if margin is not None else None
    return m if m is not None else nan


def decide_rows(rows: list[PairedRow], family: Family, mode: str, margin: Margin | None = None,
                sequential: bool = False, n_resamples: int = 9999, seed: int = 0) -> list[PairedRow]:
    """The rows with their interval at the family's level, verdict, Holm p (over these rows) and MDE."""
    test = [i for i, r in enumerate(rows) if r.n >= 2]
    p_holm = dict(zip(test, holm([rows[i].p_perm for i in test])[0]))
    w_holm = dict(zip(test, holm([rows[i].p_wilcoxon for i in test])[0]))
    min_p = dict(zip(test, holm_min_p([sign_flip_min_p(rows[i].n, n_resamples) for i in test])))
    level = family.level
    out = []
    for i, r in enumerate(rows):
        d = np.asarray(r.diffs, np.float64)
        iv = interval(d, level, sequential, seed)
        m = _abs_margin(margin, r.base_mean)
        v = verdict(iv, mode, m if math.isfinite(m) else None)
        mde = nan
        if r.n > 1 and not sequential:
            mde_dz = verdict_mde_dz(r.n, level)
            mde = math.inf if not math.isfinite(mde_dz) else mde_dz * r.diff_sd
        mde_pct = (100.0 * mde / abs(r.base_mean) if math.isfinite(mde) and r.base_mean == r.base_mean and r.base_mean
                   else (math.inf if mde == math.inf else nan))
        out.append(dataclasses.replace(
            r, ci_low=iv.low, ci_high=iv.high, confidence=level, verdict=v.word, within_margin=v.within_margin,
            method=iv.method, family_size=family.size, margin=m, p_perm_holm=p_holm.get(i, nan),
            p_wilcoxon_holm=w_holm.get(i, nan), min_p_holm=min_p.get(i, nan), mde=mde, mde_pct=mde_pct))
    return out


def _pair_samples(pa: PairedAnalysis) -> list[tuple]:
    """(a, b, common blocks, a - b per block) for every pair of tested non-baseline variants."""
    tested = [r.variant for r in pa.rows if r.n >= 2]
    out = []
    for a, b in combinations(tested, 2):
        va, vb = pa.values.get(a, {}), pa.values.get(b, {})
        common = sorted(set(va) & set(vb), key=order_key)
        out.append((a, b, common, np.array([va[k] - vb[k] for k in common], np.float64)))
    return out


def pair_rows(pa: PairedAnalysis, family: Family, mode: str, margin: Margin | None, sequential: bool,
              n_resamples: int = 9999, seed: int = 0) -> list[PairComparison]:
    samples = [s for s in _pair_samples(pa) if len(s[2]) >= 2]
    p = [sign_flip_test(d, n_resamples, seed)[0] for *_, d in samples]
    adjusted = holm(p)[0]
    base = {r.variant: r.base_mean for r in pa.rows}
    out = []
    for (a, b, _, d), pv, ph in zip(samples, p, adjusted):
        iv = interval(d, family.level, sequential, seed)
        m = _abs_margin(margin, base.get(b, nan))
        v = verdict(iv, mode, m if math.isfinite(m) else None)
        sd = float(np.std(d, ddof=1))
        out.append(PairComparison(pa.scope, a, b, len(d), float(d.mean()), sd, float(d.mean()) / sd if sd > 0 else nan,
                                  iv.low, iv.high, family.level, iv.method, family.size, pv, ph, m, v.word,
                                  v.within_margin))
    return out


@dataclasses.dataclass(frozen=True)
class Families:
    baseline: Family
    pairs: Family
    sequential: bool


def apply(analyses: list[PairedAnalysis], alpha: float, mode: str, margin: Margin | None = None,
          sequential: bool = False, n_resamples: int = 9999, seed: int = 0) -> tuple[list[PairedAnalysis], Families]:
    """Every table's verdicts with the report's two families (see the module docstring)."""
    paired = [pa for pa in analyses if pa.paired]
    base = Family(BASELINE, sum(1 for pa in paired for r in pa.rows if r.n >= 2), alpha)
    pairs = Family(PAIRS, sum(1 for pa in paired for s in _pair_samples(pa) if len(s[2]) >= 2), alpha)
    out = []
    for pa in analyses:
        if pa.paired:
            rows = decide_rows(pa.rows, base, mode, margin, sequential, n_resamples, seed)
            pa = dataclasses.replace(pa, rows=rows)
            pa = dataclasses.replace(pa, pairs=pair_rows(pa, pairs, mode, margin, sequential, n_resamples, seed))
        out.append(pa)
    return out, Families(base, pairs, sequential)
