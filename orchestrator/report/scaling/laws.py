"""Scaling-law fits on plain arrays: L(C) = E + A * C^(-alpha) and L(N, D) = E + A/N^a + B/D^b.

The fit follows Hoffmann et al. (2022, "Chinchilla", approach 3): the model is written in log
space as a log-sum-exp of its terms, ``log L = LSE(a - alpha * log(C / c_ref), e)`` with
``A = exp(a)``, ``E = exp(e)``, and the Huber loss (delta 1e-3) of the log residuals is
minimised by L-BFGS-B from a grid of starting points; the best optimum is kept. The small delta
makes the loss close to absolute deviations, so one bad seed does not pull the curve. The log
space keeps every term positive and puts relative errors on the same scale at every rung.

``c_ref`` (the geometric mean of the x values) keeps the amplitude well conditioned whatever the
FLOPs' magnitude; ``PowerLaw.A`` is the amplitude at ``c_ref`` and ``PowerLaw.a_raw`` the one of
``E + A * C^(-alpha)`` with C in its own units.

Everything here is deterministic: fixed starts, no randomness (the bootstrap lives in
``orchestrator.report.scaling.fits``), so the same points give the same parameters.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from itertools import product

import numpy as np
from scipy.optimize import brentq, minimize
from threadpoolctl import ThreadpoolController

__all__ = ["HUBER_DELTA", "ALPHA_MAX", "PowerLaw", "Chinchilla", "fit_power_law", "fit_chinchilla",
           "multiplier", "crossovers"]

HUBER_DELTA = 1e-3
ALPHA_MAX = 5.0  # upper bound of every exponent; a fit that ends there is not identified
ALPHA_MIN = 1e-3  # an exponent below this is a flat curve: A and alpha trade off freely
_ALPHA_STARTS = (0.05, 0.2, 0.5, 1.0, 2.0)
_E_FRACTIONS = (0.0, 0.5, 0.9, 0.99)  # E as a fraction of the smallest observed value
# L-BFGS-B calls BLAS on vectors of 3-5 numbers; a multi-threaded OpenBLAS spends 100x the work
# waking its threads on a busy machine (measured: 0.3 s instead of 2 ms per fit), so the fits run
# single-threaded. The controller lists the BLAS libraries loaded now (numpy's and scipy's).
_BLAS = ThreadpoolController()


@dataclass(frozen=True)
class PowerLaw:
    """L(C) = E + A * (C / c_ref)^(-alpha)."""

    E: float
    A: float
    alpha: float
    c_ref: float
    objective: float = math.nan  # the Huber loss at the optimum (scaled by 1/delta^2)

    def predict(self, c) -> np.ndarray:
        return self.E + self.A * (np.asarray(c, np.float64) / self.c_ref) ** (-self.alpha)

    def inverse(self, loss: float) -> float:
        """The C at which the curve reaches ``loss``; inf when ``loss`` is at or below E."""
        if not loss > self.E:
            return math.inf
        log_c = math.log(self.c_ref) - math.log((loss - self.E) / self.A) / self.alpha
        return math.exp(log_c) if log_c < 700 else math.inf  # beyond float range: never, in practice

    @property
    def a_raw(self) -> float:
        """A in ``E + A * C^(-alpha)`` with C in its own units."""
        return self.A * self.c_ref ** self.alpha

    def at_bound(self) -> bool:
        return self.alpha >= ALPHA_MAX * 0.999 or self.alpha <= ALPHA_MIN


@dataclass(frozen=True)
class Chinchilla:
    """L(N, D) = E + A * (N / n_ref)^(-a) + B * (D / d_ref)^(-b)."""

    E: float
    A: float
    a: float
    B: float
    b: float
    n_ref: float
    d_ref: float
    objective: float = math.nan

    def predict(self, n, d) -> np.ndarray:
        n, d = np.asarray(n, np.float64), np.asarray(d, np.float64)
        return self.E + self.A * (n / self.n_ref) ** (-self.a) + self.B * (d / self.d_ref) ** (-self.b)

    def at_bound(self) -> bool:
        return any(x >= ALPHA_MAX * 0.999 or x <= ALPHA_MIN for x in (self.a, self.b))


# ------------------------------------------------------------------------------ the objective

def _huber(r: np.ndarray) -> tuple[float, np.ndarray]:
    """Huber loss of residuals and its derivative, scaled by 1/delta^2 so that L-BFGS-B's
    relative stopping rule sees values of order 1 rather than 1e-6."""
    d = HUBER_DELTA
    a = np.abs(r)
    loss = np.where(a <= d, 0.5 * r * r, d * (a - 0.5 * d))
    return float(loss.sum()) / d**2, np.clip(r, -d, d) / d**2


def _lse_objective(theta: np.ndarray, xs: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Huber loss of ``LSE(e, a_k - alpha_k * xs[k]) - y`` and its gradient.

    theta = (e, a_1, alpha_1, ..., a_K, alpha_K); xs: (K, n) log-normalized inputs; y: (n,) log L.
    """
    k = xs.shape[0]
    terms = np.vstack([np.full_like(y, theta[0])] + [theta[1 + 2 * j] - theta[2 + 2 * j] * xs[j]
                                                      for j in range(k)])  # (K+1, n)
    top = terms.max(axis=0)
    w = np.exp(terms - top)
    pred = top + np.log(w.sum(axis=0))
    w /= w.sum(axis=0)  # softmax weights: d pred / d term
    loss, dr = _huber(pred - y)
    grad = np.empty_like(theta)
    grad[0] = dr @ w[0]
    for j in range(k):
        grad[1 + 2 * j] = dr @ w[1 + j]
        grad[2 + 2 * j] = -(dr * xs[j]) @ w[1 + j]
    return loss, grad


def _minimize(starts: list[np.ndarray], xs: np.ndarray, y: np.ndarray, bounds) -> tuple[np.ndarray, float] | None:
    """The best finite optimum over the starts, or None."""
    best: tuple[np.ndarray, float] | None = None
    for th0 in starts:
        with warnings.catch_warnings(), _BLAS.limit(limits=1, user_api="blas"):
            warnings.simplefilter("ignore", RuntimeWarning)
            res = minimize(_lse_objective, th0, args=(xs, y), jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": 500})
        if np.all(np.isfinite(res.x)) and math.isfinite(res.fun) and (best is None or res.fun < best[1] - 1e-12):
            best = (res.x.copy(), float(res.fun))
    return best


def _e_bounds(loss: np.ndarray) -> tuple[float, float]:
    lo = float(np.log(loss.min()))
    return lo - 20.0, float(np.log(loss.max()))


def _e_starts(loss: np.ndarray) -> list[float]:
    m = float(loss.min())
    return [math.log(m * f) if f > 0 else math.log(m) - 10.0 for f in _E_FRACTIONS]


# ------------------------------------------------------------------------------ fits

def fit_power_law(c, loss, start: PowerLaw | None = None) -> PowerLaw | None:
    """Fit L(C) = E + A * C^(-alpha) to points (one per seed and rung); None when no start
    converges to finite parameters. ``start``: a fit whose optimum (and ``c_ref``) replaces the
    default grid of starting points, e.g. the full data's fit for a bootstrap refit."""
    c, loss = np.asarray(c, np.float64), np.asarray(loss, np.float64)
    if len(c) < 2 or np.any(c <= 0) or np.any(loss <= 0) or not np.all(np.isfinite(np.r_[c, loss])):
        return None
    c_ref = start.c_ref if start is not None else float(np.exp(np.log(c).mean()))
    x = np.log(c / c_ref)[None, :]
    y = np.log(loss)
    mid = float(np.median(loss))
    starts = ([np.array([math.log(start.E), math.log(start.A), start.alpha])] if start is not None else
              [np.array([e, math.log(max(mid - math.exp(e), 1e-6 * mid)), al])
               for e, al in product(_e_starts(loss), _ALPHA_STARTS)])
    bounds = [_e_bounds(loss), (-50.0, 50.0), (0.0, ALPHA_MAX)]
    best = _minimize(starts, x, y, bounds)
    if best is None:
        return None
    (e, a, alpha), obj = best
    return PowerLaw(math.exp(e), math.exp(a), float(alpha), c_ref, obj)


def fit_chinchilla(n, d, loss, start: Chinchilla | None = None) -> Chinchilla | None:
    """Fit L(N, D) = E + A/N^a + B/D^b (N, D normalized by their geometric means, or by
    ``start``'s, whose optimum is then the one starting point)."""
    n, d, loss = (np.asarray(v, np.float64) for v in (n, d, loss))
    if len(loss) < 2 or np.any(n <= 0) or np.any(d <= 0) or np.any(loss <= 0):
        return None
    if start is not None:
        n_ref, d_ref = start.n_ref, start.d_ref
        starts = [np.array([math.log(start.E), math.log(start.A), start.a, math.log(start.B), start.b])]
    else:
        n_ref, d_ref = float(np.exp(np.log(n).mean())), float(np.exp(np.log(d).mean()))
        mid = float(np.median(loss))
        starts = []
        for e, ea, eb in product(_e_starts(loss)[1:3], (0.2, 0.5, 1.0), (0.2, 0.5, 1.0)):
            amp = math.log(max((mid - math.exp(e)) / 2, 1e-6 * mid))
            starts.append(np.array([e, amp, ea, amp, eb]))
    xs = np.vstack([np.log(n / n_ref), np.log(d / d_ref)])
    y = np.log(loss)
    bounds = [_e_bounds(loss), (-50.0, 50.0), (0.0, ALPHA_MAX), (-50.0, 50.0), (0.0, ALPHA_MAX)]
    best = _minimize(starts, xs, y, bounds)
    if best is None:
        return None
    (e, la, a, lb, b), obj = best
    return Chinchilla(math.exp(e), math.exp(la), float(a), math.exp(lb), float(b), n_ref, d_ref, obj)


# ------------------------------------------------------------------------------ comparing two fits

def multiplier(base: PowerLaw, variant: PowerLaw, c: float) -> float:
    """The effective compute multiplier of ``variant`` at compute ``c``: the compute the baseline
    needs to reach the variant's loss at ``c``, divided by ``c`` (> 1: the variant is worth that
    much more compute; inf: the baseline never gets there, its floor E is above that loss)."""
    return base.inverse(float(variant.predict(c))) / c


def crossovers(base: PowerLaw, variant: PowerLaw, lo: float, hi: float, points: int = 400) -> list[float]:
    """The C in [lo, hi] where the two curves cross (sign changes of their difference on a log
    grid, refined by Brent's method), ascending."""
    def diff(logc: float) -> float:
        c = math.exp(logc)
        return float(variant.predict(c) - base.predict(c))

    grid = np.linspace(math.log(lo), math.log(hi), points)
    vals = np.array([diff(g) for g in grid])
    out = []
    for i in range(len(grid) - 1):
        if vals[i] == 0.0:
            out.append(math.exp(grid[i]))
        elif vals[i] * vals[i + 1] < 0:
            out.append(math.exp(brentq(diff, grid[i], grid[i + 1], xtol=1e-12, rtol=1e-12)))
    return out
