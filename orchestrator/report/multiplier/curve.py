"""The training compute the baseline needs to reach a loss, read off its own validation curve.

For one seed: the baseline's evaluations (step s_i > 0, ``val/loss`` L_i) at training FLOPs
C_i = s_i x its FLOPs per step, x_i = log C_i in increasing order, and a target loss y (the
variant's final validation loss on the same seed). ``reach`` gives log C_b(y):

- **inside the curve**: the first crossing of the curve drawn linearly in log FLOPs between the
  evaluations: the first i with L_i <= y, between evaluations i - 1 and i. "Needs" is the first
  time the baseline gets there (a noisy curve that dips and rises again counts its first dip);
- **at or above the first evaluation** (L_0 <= y: the variant ends worse than the baseline's
  first evaluation): x_0, an upper bound (censored: ``AT_MOST``);
- **below every evaluation** (the variant ends lower than the baseline ever got): extrapolated
  from the curve's tail, the evaluations in the last doubling of its compute (at least the last
  ``MIN_TAIL``): L(C) = a + b (C / C_end)^-c by least squares, profiled over c in ``C_RANGE``
  (for a fixed c, a and b are a linear fit), solved for y. The fit is ill-posed with fewer than
  ``MIN_TAIL`` tail points (3 parameters need a residual), when it does not fall (b <= 0) or when
  c ends at a bound of its range (c -> 0 is the straight line in log C, the next form; a large c
  is a curve that has flattened onto its asymptote); then the straight line
  L = alpha + beta log C through the same tail is used instead, and the report says which form
  and why. A value the fit puts before the curve's end is the curve's end (the data never got
  there before it). An extrapolation beyond ``CAP`` x the curve's end, a power law whose
  asymptote a is at or above y, or a tail that does not fall (beta >= 0) is counted as ``CAP`` x
  the end: censored, ``AT_LEAST``.

Why censoring cannot make a verdict: the multiplier's verdict reads the median's sign interval
(``orchestrator.decide.rule``), whose bounds are order statistics. An ``AT_MOST`` value lies below
1x (the baseline's first evaluation costs less than the variant's whole run) and replaces a smaller
true value, so it can only raise an interval's low end where that end is below 1x anyway, and
only raise its high end (less "worse"); an ``AT_LEAST`` value lies above 1x (CAP x the baseline's
run costs more than the variant's) and replaces a larger one, so it can only lower an interval's
high end where that end is above 1x, and only lower its low end (less "better").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

CAP = 100.0  # the farthest extrapolation counted, in multiples of the baseline's final FLOPs
MIN_TAIL = 4
C_RANGE = (0.02, 4.0)  # the power law's exponent c; an optimum at either end is not identified
GRID = 121
INTERPOLATED, FIRST, POWER, LINE = "interpolated", "first evaluation", "power law", "log-linear"
AT_MOST, AT_LEAST = "at most", "at least"


@dataclass(frozen=True)
class Reach:
    """log C: the FLOPs the baseline needs to reach the target; how it was read, and whether the
    value is a bound (``censored``) with why."""

    log_c: float
    how: str  # INTERPOLATED, FIRST, POWER or LINE
    censored: str = ""  # "", AT_MOST or AT_LEAST
    note: str = ""  # why the simpler form or the bound

    @property
    def extrapolated(self) -> bool:
        return self.how in (POWER, LINE)


@dataclass(frozen=True)
class PowerLaw:
    """L = a + b (C / C_end)^-c, with u = log(C / C_end)."""

    a: float
    b: float
    c: float

    def at(self, u: np.ndarray) -> np.ndarray:
        return self.a + self.b * np.exp(-self.c * np.asarray(u, np.float64))


def reach(log_c, loss, target: float) -> Reach:
    """log C_b(target) off the curve (``log_c`` increasing, both finite, at least 2 points)."""
    x, y = np.asarray(log_c, np.float64), np.asarray(loss, np.float64)
    hit = np.flatnonzero(y <= target)
    if len(hit):
        i = int(hit[0])
        if i == 0:
            return Reach(float(x[0]), FIRST, AT_MOST, "the baseline's first evaluation already reaches it")
        if y[i] == target:
            return Reach(float(x[i]), INTERPOLATED)
        t = (y[i - 1] - target) / (y[i - 1] - y[i])  # y[i-1] > target > y[i]
        return Reach(float(x[i - 1] + t * (x[i] - x[i - 1])), INTERPOLATED)
    return extrapolate(x, y, target)


def tail(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The evaluations in the last doubling of the curve's compute, at least the last ``MIN_TAIL``."""
    keep = x >= x[-1] - math.log(2.0) - 1e-12
    if keep.sum() < MIN_TAIL:
        keep = np.arange(len(x)) >= len(x) - MIN_TAIL
    return x[keep], y[keep]


def _linear(z: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(a, b, residual sum of squares) of y = a + b z by least squares."""
    A = np.column_stack([np.ones_like(z), z])
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    r = y - A @ coef
    return float(coef[0]), float(coef[1]), float(r @ r)


def power_fit(u: np.ndarray, y: np.ndarray) -> tuple[PowerLaw | None, str]:
    """The power law through a tail (``u`` = log(C / C_end)), or None and why it is ill-posed."""
    if len(u) < MIN_TAIL:
        return None, f"{len(u)} tail evaluations for its 3 parameters"

    def sse(c: float) -> float:
        return _linear(np.exp(-c * u), y)[2]

    grid = np.geomspace(*C_RANGE, GRID)
    errs = np.array([sse(c) for c in grid])
    j = int(np.argmin(errs))
    if j in (0, len(grid) - 1):
        return None, f"its exponent c ends at the bound {grid[j]:g} of [{C_RANGE[0]:g}, {C_RANGE[1]:g}]"
    c = float(optimize.minimize_scalar(sse, bounds=(grid[j - 1], grid[j + 1]), method="bounded",
                                       options={"xatol": 1e-8}).x)
    a, b, _ = _linear(np.exp(-c * u), y)
    if not b > 0:
        return None, "it does not fall (b <= 0)"
    return PowerLaw(a, b, c), ""


def extrapolate(x: np.ndarray, y: np.ndarray, target: float) -> Reach:
    """log C_b(target) for a target below every evaluation (see the module docstring)."""
    tx, ty = tail(x, y)
    u = tx - x[-1]
    cap = math.log(CAP)
    law, why = power_fit(u, ty)
    if law is not None:
        if target <= law.a:
            return Reach(x[-1] + cap, POWER, AT_LEAST, f"the fit's asymptote {law.a:.4g} is at or above the target")
        reached = -math.log((target - law.a) / law.b) / law.c
        how, note = POWER, ""
    else:
        beta, alpha = np.polyfit(u, ty, 1) if len(u) >= 2 else (0.0, float(ty[-1]))
        note = f"power law ill-posed: {why}"
        if not beta < 0:
            return Reach(x[-1] + cap, LINE, AT_LEAST, note + "; the tail does not fall")
        reached = (target - alpha) / beta
        how = LINE
    if reached > cap:
        return Reach(x[-1] + cap, how, AT_LEAST, (note + "; " if note else "") + f"beyond {CAP:g}x the curve's end")
    return Reach(float(x[-1] + max(reached, 0.0)), how, "", note)
