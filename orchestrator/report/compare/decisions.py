"""The verdicts of a report: every comparison's interval at its family's level, and the verdict read
off it (``orchestrator.decide.rule``), for the comparisons with the baseline and for all pairs.

``baseline_family`` decides every variant-vs-baseline row of a list of tables (the pooled one and
each per-depth one, or the tables of several sweeps) as ONE family; ``pairs_family`` the all-pairs
rows likewise; ``decide_rows`` is one table as its own family; ``apply`` does both families over a
report:

- the verdict: ``rule.decide``: the median difference's sign interval (fixed seeds) or sign
  confidence sequence (seeds added until decided), at 1 - alpha / K; the mean's interval (t ∪
  sign-flip hull, or the mixture confidence sequence) beside it with the skew/outlier flag;
- the family: zero-variance comparisons are "not tested" and leave it; in a fixed-seed design a
  comparison whose seeds cannot reach alpha / K is left out too (Tarone, ``rule.tarone``: K is the
  smallest count such that at most K comparisons can reach alpha / K) and its note says how many
  seeds it would need; a sequential design keeps every testable comparison (K = their count);
- Holm-adjusted p-values (permutation and Wilcoxon, of the mean) over the same whole family, as
  supporting numbers;
- the MDE of a fixed-n comparison: the difference the verdict's sign interval would exclude with 80%
  power at this n and level for normal differences of the observed sd (``signs.mde_dz``).
"""
from __future__ import annotations

import dataclasses
import math
from itertools import combinations

import numpy as np

from orchestrator.core.fmt import order_key
from orchestrator.decide import rule, signs
from orchestrator.decide.families import BASELINE, PAIRS, Family
from orchestrator.decide.verdict import Margin
from orchestrator.report.compare.results import PairComparison, PairedAnalysis, PairedRow
from orchestrator.report.stats.multiplicity import holm, holm_min_p
from orchestrator.report.stats.paired import sign_flip_min_p, sign_flip_test

nan = math.nan


def _abs_margin(margin: Margin | None, base_mean: float) -> float:
    m = margin.absolute(base_mean) if margin is not None else None
    return m if m is not None else nan


def _family(name: str, ds: list[np.ndarray], alpha: float, sequential: bool) -> tuple[Family, list[bool], str]:
    """The family of these comparisons, which of them are in it, and the note of those left out."""
    testable = [not rule.untested(d) for d in ds]
    if sequential:
        return Family(name, sum(testable), alpha), testable, ""
    idx = [i for i, t in enumerate(testable) if t]
    k, keep = rule.tarone([len(ds[i]) for i in idx], alpha)
    inside = [False] * len(ds)
    for i, kept in zip(idx, keep):
        inside[i] = kept
    need = rule.needed_seeds(alpha / max(1, k))
    at = f"{alpha:g}" if k <= 1 else f"{alpha:g}/{k}"
    return Family(name, k, alpha), inside, f"left out of the family (Tarone): needs {need} seeds at alpha {at}"


def _ruled(d: np.ndarray, level: float, mode: str, m: float, sequential: bool, seed: int, seeds, inside: bool,
           note: str) -> tuple[rule.Ruling, str]:
    r = rule.decide(d, level, mode, m if math.isfinite(m) else None, sequential, seed, seeds)
    if r.why:
        return r, f"not tested: {r.why}"
    return r, ("" if inside else note)


def baseline_family(tables: list[list[PairedRow]], alpha: float, mode: str, margin: Margin | None = None,
                    sequential: bool = False, n_resamples: int = 9999, seed: int = 0,
                    modes: list[str] | None = None, margins: list | None = None,
                    seqs: list[bool] | None = None) -> tuple[list[list[PairedRow]], Family]:
    """Every table's rows decided as one family (see the module docstring). ``modes``, ``margins``,
    ``seqs``: per table, when the tables come from different sweeps (a pooled report)."""
    flat = [(t, i) for t, rows in enumerate(tables) for i in range(len(rows))]
    ds = [np.asarray(tables[t][i].diffs, np.float64) for t, i in flat]
    family, inside, note = _family(BASELINE, ds, alpha, sequential if seqs is None else all(seqs))
    test = [j for j, ok in enumerate(inside) if ok]
    p_holm = dict(zip(test, holm([tables[flat[j][0]][flat[j][1]].p_perm for j in test])[0]))
    w_holm = dict(zip(test, holm([tables[flat[j][0]][flat[j][1]].p_wilcoxon for j in test])[0]))
    min_p = dict(zip(test, holm_min_p([sign_flip_min_p(tables[flat[j][0]][flat[j][1]].n, n_resamples)
                                       for j in test])))
    level = family.level
    out = [list(rows) for rows in tables]
    for j, (t, i) in enumerate(flat):
        r = tables[t][i]
        seq = sequential if seqs is None else seqs[t]
        m = _abs_margin(margin if margins is None else margins[t], r.base_mean)
        ruling, why = _ruled(ds[j], level, modes[t] if modes else mode, m, seq, seed, r.seeds, inside[j], note)
        mde = nan
        if r.n > 1 and not seq:
            mde_dz = signs.mde_dz(r.n, level)  # of the verdict's (sign) interval, normal differences
            mde = math.inf if not math.isfinite(mde_dz) else mde_dz * r.diff_sd
        mde_pct = (100.0 * mde / abs(r.base_mean) if math.isfinite(mde) and r.base_mean == r.base_mean and r.base_mean
                   else (math.inf if mde == math.inf else nan))
        iv, mean = ruling.interval, ruling.mean
        out[t][i] = dataclasses.replace(
            r, ci_low=iv.low, ci_high=iv.high, confidence=level, verdict=ruling.verdict.word,
            within_margin=ruling.verdict.within_margin, method=iv.method, family_size=family.size, margin=m,
            p_perm_holm=p_holm.get(j, nan), p_wilcoxon_holm=w_holm.get(j, nan), min_p_holm=min_p.get(j, nan),
            mde=mde, mde_pct=mde_pct, estimand=ruling.estimand, mean_ci_low=mean.low, mean_ci_high=mean.high,
            mean_method=mean.method, flag=ruling.flag, note=why)
    return out, family


def decide_rows(rows: list[PairedRow], family: Family, mode: str, margin: Margin | None = None,
                sequential: bool = False, n_resamples: int = 9999, seed: int = 0) -> list[PairedRow]:
    """One table's rows as their own family at ``family.alpha`` (its size is recomputed: untested and
    Tarone-excluded rows leave it)."""
    return baseline_family([rows], family.alpha, mode, margin, sequential, n_resamples, seed)[0][0]


def _pair_samples(pa: PairedAnalysis) -> list[tuple]:
    """(a, b, common blocks, a - b per block) for every pair of tested non-baseline variants."""
    tested = [r.variant for r in pa.rows if r.n >= 2]
    out = []
    for a, b in combinations(tested, 2):
        va, vb = pa.values.get(a, {}), pa.values.get(b, {})
        common = sorted(set(va) & set(vb), key=order_key)
        out.append((a, b, common, np.array([va[k] - vb[k] for k in common], np.float64)))
    return out


def pairs_family(analyses: list[PairedAnalysis], alpha: float, mode: str, margin: Margin | None = None,
                 sequential: bool = False, n_resamples: int = 9999, seed: int = 0,
                 modes: list[str] | None = None, margins: list | None = None,
                 seqs: list[bool] | None = None) -> tuple[list[list[PairComparison]], Family]:
    """The all-pairs comparisons of every (paired) table, decided as one family."""
    flat = [(t, s) for t, pa in enumerate(analyses) for s in _pair_samples(pa) if len(s[2]) >= 2]
    ds = [s[3] for _, s in flat]
    family, inside, note = _family(PAIRS, ds, alpha, sequential if seqs is None else all(seqs))
    p = [sign_flip_test(d, n_resamples, seed)[0] for d in ds]
    test = [j for j, ok in enumerate(inside) if ok]
    adjusted = dict(zip(test, holm([p[j] for j in test])[0]))
    out: list[list[PairComparison]] = [[] for _ in analyses]
    for j, (t, (a, b, common, d)) in enumerate(flat):
        pa = analyses[t]
        base = {r.variant: r.base_mean for r in pa.rows}
        m = _abs_margin(margin if margins is None else margins[t], base.get(b, nan))
        seq = sequential if seqs is None else seqs[t]
        ruling, why = _ruled(d, family.level, modes[t] if modes else mode, m, seq, seed, common, inside[j], note)
        iv, mean = ruling.interval, ruling.mean
        sd = float(np.std(d, ddof=1))
        out[t].append(PairComparison(
            pa.scope, a, b, len(d), float(d.mean()), sd, float(d.mean()) / sd if sd > 0 else nan, iv.low, iv.high,
            family.level, iv.method, family.size, p[j], adjusted.get(j, nan), m, ruling.verdict.word,
            ruling.verdict.within_margin, ruling.estimand, mean.low, mean.high, mean.method, ruling.flag, why))
    return out, family


def pair_rows(pa: PairedAnalysis, family: Family, mode: str, margin: Margin | None, sequential: bool,
              n_resamples: int = 9999, seed: int = 0) -> list[PairComparison]:
    """One table's all-pairs rows as their own family at ``family.alpha``."""
    return pairs_family([pa], family.alpha, mode, margin, sequential, n_resamples, seed)[0][0]


@dataclasses.dataclass(frozen=True)
class Families:
    baseline: Family
    pairs: Family
    sequential: bool


def apply(analyses: list[PairedAnalysis], alpha: float, mode: str, margin: Margin | None = None,
          sequential: bool = False, n_resamples: int = 9999, seed: int = 0) -> tuple[list[PairedAnalysis], Families]:
    """Every table's verdicts with the report's two families (see the module docstring)."""
    paired = [pa for pa in analyses if pa.paired]
    rows, base = baseline_family([pa.rows for pa in paired], alpha, mode, margin, sequential, n_resamples, seed)
    paired = [dataclasses.replace(pa, rows=r) for pa, r in zip(paired, rows)]
    prs, pairs = pairs_family(paired, alpha, mode, margin, sequential, n_resamples, seed)
    done = iter(dataclasses.replace(pa, pairs=p) for pa, p in zip(paired, prs))
    out = [next(done) if pa.paired else pa for pa in analyses]
    return out, Families(base, pairs, sequential)
