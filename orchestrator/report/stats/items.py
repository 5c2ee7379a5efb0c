"""Two models compared document by document on a downstream task, pooled over seeds.

The data of one task: a matrix ``d[s, i]`` = variant - baseline on document i in seed s, where
both models of seed s scored the same document (0/1 per document for an accuracy, so d is -1, 0
or 1; the gold answer's bits per byte for a loss). An average over T tasks has one matrix per task
over the same seeds and weighs every task 1/T, as the per-trial average score does.

The estimate ``D`` is the mean of d over documents and seeds (with the same documents in every
seed: the mean of the per-seed accuracy differences). Seeds and documents are crossed, both
random: ``d[s, i] = D + a_s + b_i + e_si``, so

    Var(D^) = s_a^2 / S + s_b^2 / N + s_e^2 / (S N).

- The document part ``(s_b^2 + s_e^2 / S) / N`` is the variance of the documents' means over the
  seeds, divided by N: a document is resampled with all its seeds, because the same document
  recurs in every seed (treating seeds as independent strata of documents would drop s_b's
  share S - 1 times over).
- The seed part ``s_a^2 / S`` is ``(var_s(dbar_s) - MS_e / N) / S`` floored at 0, where dbar_s
  is seed s's mean difference and MS_e the two-way residual mean square (E MS_e = s_e^2): what the
  seeds disagree beyond the noise of their documents. Leaving it out would make the interval
  about these trained models, not the architectures (two equal architectures whose 8 trained
  models differ a little would be told apart by enough documents). ``seeds_p`` tests s_a = 0
  (F = var_s(dbar_s) / (MS_e / N) on S - 1 and (S - 1)(N - 1) degrees of freedom).

The interval is the hull of two (the same construction as ``decide.intervals.paired_interval``):

- ``t``: D^ +- t_df sqrt(V^), df by Satterthwaite over the document part (N - 1 df), the seeds'
  variance (S - 1) and the noise subtracted from it;
- ``sign-flip``: the inversion of the sign-flip test over documents (each document's mean over
  the seeds, the average's weighted to its task's share): exact when the two models are
  exchangeable on each document, so it stays honest where the t interval is not, at accuracies
  near 0 or 1 and for models that agree on almost every document (4 documents that differ, all for
  the variant: p = 2/16 however many documents agree). Every sign vector of 16 documents or fewer,
  else ``MC_FLIPS`` seeded ones, drawn in chunks (a task of 10,000 documents fits in memory).

``p`` is max(p_t, p_sign-flip): the hull excludes 0 at level 1 - a exactly when both tests reject
at a. Pure functions on arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from orchestrator.decide import intervals

MC_FLIPS = intervals.MC_FLIPS
CHUNK_CELLS = 2_000_000  # sign-vector entries drawn at once
METHOD = "t (seeds x documents) ∪ sign-flip over documents"


@dataclass(frozen=True)
class ItemStats:
    n_seeds: int
    n_items: int  # documents (over all tasks for an average)
    diff: float  # D^
    se: float  # sqrt of the document part + the seed part
    se_items: float  # the document part alone
    sd_seeds: float  # the estimated s_a (nan with one seed)
    df: float
    level: float
    t_low: float
    t_high: float
    flip_low: float
    flip_high: float
    p_t: float
    p_flip: float
    seeds_p: float  # the F test of s_a = 0 (nan with one seed)

    @property
    def low(self) -> float:
        return min(self.t_low, self.flip_low)

    @property
    def high(self) -> float:
        return max(self.t_high, self.flip_high)

    @property
    def p(self) -> float:
        return max(self.p_t, self.p_flip)


def _residual_ms(m: np.ndarray) -> float:
    """The two-way (seeds x documents, one value a cell) residual mean square."""
    s, n = m.shape
    r = m - m.mean(axis=1, keepdims=True) - m.mean(axis=0, keepdims=True) + m.mean()
    return float((r**2).sum()) / ((s - 1) * (n - 1))


def compare(mats: list[np.ndarray], level: float, seed: int = 0) -> ItemStats:
    """The paired comparison of one task (one matrix seeds x documents) or of the average of
    several (one matrix each, the same seeds in the same rows); see the module."""
    mats = [np.asarray(m, np.float64) for m in mats]
    if not mats or any(m.ndim != 2 for m in mats) or len({m.shape[0] for m in mats}) != 1:
        raise ValueError("one seeds x documents matrix per task, every one with the same seeds")
    S, T = mats[0].shape[0], len(mats)
    if S < 1 or any(m.shape[1] < 2 for m in mats):
        raise ValueError("at least one seed and 2 documents a task")
    w = 1.0 / T
    diff = sum(w * float(m.mean()) for m in mats)
    doc_means = [m.mean(axis=0) for m in mats]
    parts = [w**2 * float(np.var(x, ddof=1)) / len(x) for x in doc_means]  # each task's document part
    a = sum(parts)
    b, sd_a, seeds_p, b_terms = 0.0, math.nan, math.nan, 0.0
    if S >= 2:
        seed_means = sum(w * m.mean(axis=1) for m in mats)
        noise = sum(w**2 * _residual_ms(m) / m.shape[1] for m in mats)  # E var_s(dbar_s) without s_a
        var_s = float(np.var(seed_means, ddof=1))
        b = max(0.0, var_s - noise) / S
        sd_a = math.sqrt(b * S)
        df_e = sum((S - 1) * (m.shape[1] - 1) for m in mats)
        if b > 0:  # Satterthwaite over var_s / S (S - 1 df) minus noise / S (df_e): the seed part is their difference
            b_terms = (var_s / S) ** 2 / (S - 1) + (noise / S) ** 2 / df_e
        if noise > 0:
            seeds_p = float(sps.f.sf(var_s / noise, S - 1, df_e))
        elif var_s > 0:
            seeds_p = 0.0
    v = a + b
    den = sum(p**2 / (len(x) - 1) for p, x in zip(parts, doc_means)) + b_terms
    df = v**2 / den if den > 0 else math.inf
    se = math.sqrt(v)
    if se > 0:
        half = float(sps.t.ppf(0.5 + level / 2, df)) * se
        p_t = float(2 * sps.t.sf(abs(diff) / se, df))
    else:  # every document's difference the same in every seed: the mean is known exactly
        half, p_t = 0.0, (1.0 if diff == 0 else 0.0)
    z = np.concatenate([w * x * (sum(len(y) for y in doc_means) / len(x)) for x in doc_means])  # mean(z) = D^
    flo, fhi, p_flip = flip_interval(z, level, seed)
    return ItemStats(S, len(z), diff, se, math.sqrt(a), sd_a, df, level, diff - half, diff + half, flo, fhi,
                     p_t, p_flip, seeds_p)


def flip_interval(z: np.ndarray, level: float, seed: int = 0, n_flips: int = MC_FLIPS) -> tuple[float, float, float]:
    """The sign-flip interval of mean(z) at ``level`` and the test's p at 0: ``intervals``'
    inversion, with the Monte Carlo sign vectors drawn in chunks (memory: ``CHUNK_CELLS``)."""
    z = np.asarray(z, np.float64)
    n = len(z)
    if 2**n <= intervals.EXACT_MAX_FLIPS:
        lo, hi = intervals.sign_flip_interval(z, level, seed)
        return lo, hi, intervals.sign_flip_p(z, 0.0, seed)
    rng = np.random.default_rng([seed, n])
    total = float(z.sum())
    tol = 1e-9 * max(1.0, float(np.abs(z).sum()))
    los, his, hits = [], [], 0
    rows = max(1, CHUNK_CELLS // n)
    for start in range(0, n_flips, rows):
        s = 1.0 - 2.0 * rng.integers(0, 2, size=(min(rows, n_flips - start), n))
        lo, hi = intervals.segments(z, s)  # the same inversion as the seeds' interval, a chunk at a time
        los.append(lo)
        his.append(hi)
        hits += int(np.sum(np.abs(s @ z) >= abs(total) - tol))
    lo, hi = np.concatenate(los), np.concatenate(his)
    p = (1 + hits) / (1 + n_flips) if np.any(z) else 1.0
    need = math.ceil((1.0 - level) * (n_flips + 1) - 1e-9) - 1  # p(mu) >= a <=> segments holding mu >= need
    if need <= 0:
        return -math.inf, math.inf, p
    need = min(need, n_flips)
    return float(np.partition(lo, need - 1)[need - 1]), float(np.partition(hi, n_flips - need)[n_flips - need]), p
