"""The anytime-valid confidence sequence of a paired mean difference (``lime sweep run --until-decided``).

A fixed-n interval is valid for one n chosen before the data; looking after every wave of seeds and
stopping when it excludes 0 inflates the error rate (at 5% per look, to about 20% over 20 looks). A
confidence sequence CS_1, CS_2, ... covers the true mean at every n at once:
P(mu in CS_n for all n) >= 1 - a, so it may be looked at after every seed and stopped at any time.

The sequence here is a scale-invariant Gaussian mixture for normal per-seed differences with
unknown variance: close to the t-test confidence sequences of Wang & Ramdas 2023 ("Anytime-valid
t-tests and confidence sequences for Gaussian means with unknown variance", arXiv 2310.03722: a
Gaussian prior on the standardised effect, the scale removed by invariance), not to Lai 1976's flat
prior. Since issue 33 it is the MEAN's sequence printed beside the verdict; verdicts use the median's
sign sequence (``signs``, ``rule``), which keeps its error under skew.

For a candidate mean mu let y_i = d_i - mu. The likelihood ratio of the maximal
invariant under scaling (y_1..y_n up to a common factor) between "(mean - mu) / sd = delta" with
delta ~ N(0, g) and "mean = mu" is (integrating the scale with the invariant prior 1 / sigma)

    BF_n(mu) = (1 + g n)^(-1/2) * (1 - g n r / (1 + g n))^(-n/2),   r = (sum y)^2 / (n sum y^2),

a nonnegative martingale with mean 1 under mean = mu whatever the sd, so by Ville's inequality
P(sup_n BF_n(mu) >= 1 / a) <= a. CS_n = {mu : BF_n(mu) < 1 / a}. BF grows with r, and r with
|mean(d) - mu|, so CS_n is the interval mean(d) +- sqrt(SS / n * r* / (1 - r*)) with SS the sum of
squared deviations and r* the solution of BF = 1 / a; it is the whole line while even r = 1 (all
y equal) cannot reach 1 / a, i.e. while (1 + g n)^((n - 1) / 2) < 1 / a.

g = ``PRIOR_VAR``: the prior variance of the standardised effect d_z. 1 puts the mixture's weight on
effects of about one sd of the per-seed differences (the committed sweeps' effects have d_z 0.5-1.6);
the expected number of seeds to a decision changes by under 10% for g in [0.5, 4]
(``tests/orchestrator/decide/test_sequential.py`` measures it). The sequence assumes normal
per-seed differences, as the t interval does; under the null its simulated error over 60 seeds is
2.7% at a = 5% for normal differences, 1.8% for heavy-tailed (t3) ones and 5.2% for skewed (gamma(4))
ones, more for stronger skew: docs/STATISTICS.md has the numbers.
"""
from __future__ import annotations

import math

import numpy as np

from orchestrator.decide.intervals import Interval

PRIOR_VAR = 1.0
METHOD = "confidence sequence (t-mixture, Wang & Ramdas 2023)"


def log_bf(d: np.ndarray, mu: float = 0.0, g: float = PRIOR_VAR) -> float:
    """log BF_n(mu) of the differences d (see the module docstring); 0 for fewer than 2 values."""
    y = np.asarray(d, np.float64) - mu
    n = len(y)
    s2 = float(np.sum(y * y))
    if n < 2 or s2 == 0:
        return 0.0 if n < 2 else math.inf
    r = float(np.sum(y)) ** 2 / (n * s2)
    c = g * n / (1 + g * n)
    return -0.5 * math.log1p(g * n) - 0.5 * n * math.log1p(-min(c * r, 1 - 1e-300))


def max_log_bf(n: int, g: float = PRIOR_VAR) -> float:
    """The largest log BF n differences can give (r = 1: all equal after removing mu)."""
    return 0.5 * (n - 1) * math.log1p(g * n) if n >= 2 else 0.0


def min_seeds_finite(level: float, g: float = PRIOR_VAR) -> int:
    """The fewest differences at which the sequence can be finite at ``level``."""
    n = 2
    while max_log_bf(n, g) <= math.log(1.0 / (1.0 - level)):
        n += 1
    return n


def confidence_sequence(d: np.ndarray, level: float, g: float = PRIOR_VAR) -> Interval:
    """CS_n of mean(d) at ``level`` (1 - a) for the n differences d."""
    d = np.asarray(d, np.float64)
    n = len(d)
    threshold = math.log(1.0 / (1.0 - level))
    if n < 2 or max_log_bf(n, g) <= threshold:
        return Interval(-math.inf, math.inf, level, n, METHOD)
    c = g * n / (1 + g * n)
    # BF(r*) = 1/a  <=>  log(1 - c r*) = -(2/n) (log(1/a) + log(1 + g n) / 2)
    r_star = -math.expm1(-(2.0 / n) * (threshold + 0.5 * math.log1p(g * n))) / c
    mean = float(d.mean())
    ss = float(np.sum((d - mean) ** 2))
    half = math.sqrt(ss / n * r_star / (1.0 - r_star))
    return Interval(mean - half, mean + half, level, n, METHOD)


def sequence(d: np.ndarray, level: float, at: list[int] | None = None, g: float = PRIOR_VAR) -> list[Interval]:
    """CS_n after each n in ``at`` (default every n from 1): the sequence a report shows."""
    d = np.asarray(d, np.float64)
    return [confidence_sequence(d[:n], level, g) for n in (at or range(1, len(d) + 1))]


def log_bf_rows(d: np.ndarray, g: float = PRIOR_VAR) -> np.ndarray:
    """log BF_n(0) of every row of d (sims, n), vectorised: the sequence at n excludes 0 exactly
    when it is >= log(1 / a)."""
    d = np.asarray(d, np.float64)
    n = d.shape[1]
    s1, s2 = d.sum(axis=1), np.sum(d * d, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(s2 > 0, s1**2 / (n * s2), 0.0)
    c = g * n / (1 + g * n)
    return -0.5 * math.log1p(g * n) - 0.5 * n * np.log1p(-np.minimum(c * r, 1 - 1e-300))
