"""The scaling analysis of a sweep with a size axis: per-variant fits with bootstrap CIs, a
hold-out-rung check, effective compute multipliers against the baseline and crossovers.

``analyze`` takes the lines and rungs of ``orchestrator.report.scaling.rungs`` and returns a
``Scaling``; the markdown is ``orchestrator.report.scaling.markdown``, the plot
``orchestrator.report.scaling.figure``.

- **Fits** (``orchestrator.report.scaling.laws``): L(C) = E + A * C^(-alpha) against training
  compute for every line; against parameters N when every rung trained on the same tokens;
  Chinchilla's L(N, D) = E + A/N^a + B/D^b when both vary.
- **Not identifiable** is said, with the reason, instead of parameters: fewer rungs than
  parameters + 1; a metric that is higher-is-better or not positive; a curve that does not fall
  beyond 2 standard errors over the ladder (flat), or rises between two rungs beyond 2 standard
  errors (non-monotone: a decreasing power law does not describe it); an exponent at a bound of
  its search range; a bootstrap in which more than 10% of the refits fail or hit a bound.
- **Uncertainty**: ``N_BOOT`` seeded resamples of the seeds within each rung (the same draws for
  every line, so variant and baseline stay paired); percentile 95% intervals.
- **Multiplier** of a variant at compute C: the compute the baseline's curve needs to reach the
  variant's loss at C, over C; reported at each of the variant's measured rungs (C = that rung's
  compute) and at its largest ("at max"). It is "not identifiable", with the reason, where it is
  infinite (the variant's fitted loss lies below the baseline's fitted floor E: the fitted floors
  cross, an extrapolation of two fits rather than evidence) or where more than ``INF_SHARE`` of its
  bootstrap draws are infinite (an interval without a supported upper end).
- **Hold-out**: the fit redone without the largest rung predicts that rung; the error is the
  prediction minus the measured mean. A 3-parameter fit needs >= 4 rungs, so the check needs
  >= 4 rungs too, and the refit on 3 rungs is then exactly determined.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.core.fmt import num
from orchestrator.report.scaling.laws import Chinchilla, PowerLaw, crossovers, fit_chinchilla, fit_power_law, multiplier
from orchestrator.report.scaling.rungs import Line, Rung, draws, points

__all__ = ["N_BOOT", "Fit", "Holdout", "Versus", "LineResult", "Scaling", "analyze", "fit_line", "holdout",
           "versus", "quantiles"]
N_BOOT = 200
BOOT_FAIL_MAX = 0.10
CONFIDENCE = 0.95
CROSS_SPAN = 100.0  # crossovers are searched up to this factor beyond the largest compute
INF_SHARE = 0.1  # a multiplier whose bootstrap has more infinite draws than this is not identifiable
PARAMS = {"C": ("E", "A", "alpha"), "N": ("E", "A", "alpha"), "ND": ("E", "A", "a", "B", "b")}
XCOL = {"C": "c", "N": "n"}
WHAT = {"C": "compute C", "N": "parameters N"}


@dataclass
class Fit:
    kind: str  # "C": against compute; "N": against parameters at fixed tokens; "ND": Chinchilla
    law: PowerLaw | Chinchilla | None  # None unless identifiable
    reason: str | None  # why it is not identifiable; None when it is
    boot: list = field(default_factory=list)  # the refit of each resample (None: failed)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    rungs: int = 0

    def values(self) -> dict[str, float]:
        """The parameters in the units of the data (A of E + A * C^(-alpha))."""
        return _params(self.law) if self.law is not None else {}


@dataclass
class Holdout:
    rung: Rung  # the held-out (largest) rung
    predicted: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    reason: str | None = None

    @property
    def error(self) -> float:
        return self.predicted - self.rung.mean

    @property
    def error_pct(self) -> float:
        return 100.0 * self.error / self.rung.mean


@dataclass
class Versus:
    line: Line
    base: Line
    at: list[tuple[str, float, float, float, float, bool]] = field(default_factory=list)
    # (rung label, C, multiplier, CI low, CI high, baseline's C beyond its largest rung)
    crossings: list[float] = field(default_factory=list)
    cross_share: float = math.nan  # share of resamples whose curves cross in the window
    window: tuple[float, float] = (math.nan, math.nan)
    reason: str | None = None
    unidentified: dict[str, str] = field(default_factory=dict)  # rung label -> why its multiplier is not identifiable


@dataclass
class LineResult:
    line: Line
    fits: dict[str, Fit]
    holdout: Holdout | None


@dataclass
class Scaling:
    lines: list[LineResult]
    versus: list[Versus]
    n_boot: int
    seed: int
    mode: str
    notes: list[str] = field(default_factory=list)


def _params(law: PowerLaw | Chinchilla) -> dict[str, float]:
    if isinstance(law, PowerLaw):
        return {"E": law.E, "A": law.a_raw, "alpha": law.alpha}
    return {"E": law.E, "A": law.A * law.n_ref ** law.a, "a": law.a, "B": law.B * law.d_ref ** law.b, "b": law.b}


def quantiles(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of resampled values; infinities allowed (no interpolation)."""
    v = np.asarray([x for x in values if not math.isnan(x)], np.float64)
    if not len(v):
        return (math.nan, math.nan)
    lo, hi = np.quantile(v, [(1 - confidence) / 2, (1 + confidence) / 2], method="inverted_cdf")
    return float(lo), float(hi)


# ------------------------------------------------------------------------------ identifiability

def _min_rungs(kind: str) -> int:
    return len(PARAMS[kind]) + 1


def shape_problem(rungs: list[Rung], x: str) -> str | None:
    """Flat or non-monotone (beyond 2 standard errors of the pooled seed spread), else None."""
    rs = sorted(rungs, key=lambda r: r.get(x))
    means = [r.mean for r in rs]
    ns = [len(r.values) for r in rs]
    df = sum(n - 1 for n in ns)
    sd = math.sqrt(sum((n - 1) * r.std ** 2 for r, n in zip(rs, ns) if n > 1) / df) if df else 0.0

    def two_se(i: int, j: int) -> float:
        return 2.0 * sd * math.sqrt(1 / ns[i] + 1 / ns[j])

    rises = [(means[j] - means[i], i, j) for i in range(len(rs)) for j in range(i + 1, len(rs))
             if means[j] - means[i] > two_se(i, j)]
    if rises:  # the largest rise of more than 2 standard errors
        _, i, j = max(rises)
        return (f"the metric rises with {WHAT.get(x.upper(), x)} by more than 2 standard errors: {num(means[i], 4)} at "
                        f"{rs[i].label} -> {num(means[j], 4)} at {rs[j].label} (2 standard errors: "
                f"{num(two_se(i, j), 2)}); a decreasing power law does not describe it")
    drop = means[0] - means[-1]
    if drop <= two_se(0, len(rs) - 1):
        change = means[-1] - means[0]
        return (f"the curve is flat: {num(means[0], 4)} at {rs[0].label} -> {num(means[-1], 4)} at {rs[-1].label}, "
                f"a change of {'+' if change > 0 else ''}{num(change, 3)}, not a fall beyond 2 standard errors "
                f"({num(two_se(0, len(rs) - 1), 2)})")
    return None


def precheck(rungs: list[Rung], kind: str, mode: str, min_rungs: int) -> str | None:
    cols = {"C": ["c"], "N": ["n"], "ND": ["n", "d"]}[kind]
    names = ", ".join(PARAMS[kind])
    if mode == "max":
        return ("the metric is higher-is-better; a power law E + A * x^(-alpha) describes a metric that falls "
                "with scale")
    for col in cols:
        if any(not (math.isfinite(r.get(col)) and r.get(col) > 0) for r in rungs):
            what = {"c": "training FLOPs (model/flops_per_token)", "n": "parameters (model/params)",
                    "d": "tokens"}[col]
            return f"some rung has no {what}"
    if any(v <= 0 for r in rungs for v in r.values.values()):
        return "the metric is not positive everywhere; the fit works on log residuals"
    distinct = len({tuple(r.get(c) for c in cols) for r in rungs})
    if distinct < min_rungs:
        return (f"{distinct} rung(s) for {len(PARAMS[kind])} parameters ({names}); the fit needs >= {min_rungs}"
                + (" (parameters + 1)" if min_rungs == _min_rungs(kind) else ""))
    if kind == "ND":
        few = [w for w, c in (("N", "n"), ("D", "d")) if len({r.get(c) for r in rungs}) < 3]
        if few:  # with two values an exponent and its amplitude trade off freely
            return (f"{' and '.join(few)} take(s) fewer than 3 distinct values; each exponent needs >= 3 to be "
                    "separated from its amplitude")
        return None
    return shape_problem(rungs, cols[0])


# ------------------------------------------------------------------------------ fits

def _refit(line: Line, kind: str, law, draw, drop_key):
    if kind == "ND":
        n, y, used = points(line, draw, "n", drop_key)
        d, _, _ = points(line, draw, "d", drop_key)
        return fit_chinchilla(n, d, y, start=law), used
    x, y, used = points(line, draw, XCOL[kind], drop_key)
    return fit_power_law(x, y, start=law), used


def fit_line(line: Line, kind: str, samples: list[dict], mode: str, drop_key: tuple | None = None,
             min_rungs: int | None = None) -> Fit:
    """One line's fit of one kind, with its bootstrap (``samples``: the draws), or the reason it
    is not identifiable."""
    rungs = [r for r in line.rungs if r.key != drop_key]
    need = _min_rungs(kind) if min_rungs is None else min_rungs
    reason = precheck(rungs, kind, mode, need)
    if reason:
        return Fit(kind, None, reason, rungs=len(rungs))
    law, _ = _refit(line, kind, None, None, drop_key)
    if law is None:
        return Fit(kind, None, "the optimizer found no finite optimum", rungs=len(rungs))
    if law.at_bound():
        return Fit(kind, None, f"an exponent ended at a bound of its range (0.001 to 5): "
                               f"{', '.join(f'{k} = {num(v, 3)}' for k, v in _params(law).items())}",
                   rungs=len(rungs))
    boot = []
    for draw in samples:
        b, used = _refit(line, kind, law, draw, drop_key)
        boot.append(b if b is not None and used == len(rungs) and not b.at_bound() else None)
    failed = sum(b is None for b in boot)
    if samples and failed > BOOT_FAIL_MAX * len(samples):
        return Fit(kind, None, f"the bootstrap does not converge: {failed} of {len(samples)} refits failed or "
                               "ended at a bound", boot, rungs=len(rungs))
    ok = [_params(b) for b in boot if b is not None]
    ci = {k: quantiles([p[k] for p in ok]) for k in PARAMS[kind]}
    return Fit(kind, law, None, boot, ci, len(rungs))


def holdout(line: Line, samples: list[dict], mode: str) -> Holdout | None:
    """Refit without the largest rung (by compute) and predict it; None for a line of one rung."""
    if len(line.rungs) < 2:
        return None
    top = line.rungs[-1]
    if len(line.rungs) < _min_rungs("C"):
        return Holdout(top, reason=f"{len(line.rungs)} rungs; the check needs >= {_min_rungs('C')} (3 "
                                   "parameters, refitted on all rungs but the largest)")
    fit = fit_line(line, "C", samples, mode, drop_key=top.key, min_rungs=_min_rungs("C") - 1)
    if fit.law is None:
        return Holdout(top, reason=f"the refit without {top.label} is not identifiable: {fit.reason}")
    preds = [float(b.predict(top.c)) for b in fit.boot if b is not None]
    return Holdout(top, float(fit.law.predict(top.c)), quantiles(preds))


def kinds(line: Line) -> list[str]:
    """C always; N at fixed tokens when parameters vary; Chinchilla when both vary."""
    ns = {r.n for r in line.rungs if math.isfinite(r.n)}
    ds = {r.d for r in line.rungs if math.isfinite(r.d)}
    if len(ns) > 1 and len(ds) == 1:
        return ["C", "N"]
    if len(ns) > 1 and len(ds) > 1:
        return ["C", "ND"]
    return ["C"]


# ------------------------------------------------------------------------------ against the baseline

def versus(var: LineResult, base: LineResult) -> Versus:
    """Multipliers of a variant against the baseline at each measured rung, and crossovers."""
    out = Versus(var.line, base.line)
    fv, fb = var.fits["C"], base.fits["C"]
    if fv.law is None or fb.law is None:
        who = [w for w, f in (("the baseline's", fb), ("this variant's", fv)) if f.law is None]
        out.reason = (f"{who[0]} fit against compute is not identifiable" if len(who) == 1 else
                      "neither fit against compute is identifiable")
        return out
    pairs = [(b, v) for b, v in zip(fb.boot, fv.boot) if b is not None and v is not None]
    base_max = max(r.c for r in base.line.rungs)
    for r in var.line.rungs:
        m = multiplier(fb.law, fv.law, r.c)
        boot = [multiplier(b, v, r.c) for b, v in pairs]
        lo, hi = quantiles(boot)
        out.at.append((r.label, r.c, m, lo, hi, m * r.c > base_max))
        share = sum(math.isinf(x) for x in boot) / len(boot) if boot else 0.0
        if math.isinf(m):
            out.unidentified[r.label] = (
                f"the variant's fitted loss there ({num(float(fv.law.predict(r.c)), 4)}) is below the baseline's "
                f"fitted floor E = {num(fb.law.E, 4)}: the fitted floors cross, so the infinity is an extrapolation "
                "of two fits, not evidence")
        elif share > INF_SHARE:
            out.unidentified[r.label] = (f"{100 * share:.0f}% of the bootstrap draws are infinite (more than "
                                         f"{100 * INF_SHARE:.0f}%): the interval has no upper end the data support")
    lo_c = min(min(r.c for r in var.line.rungs), min(r.c for r in base.line.rungs))
    hi_c = max(max(r.c for r in var.line.rungs), base_max) * CROSS_SPAN
    out.window = (lo_c, hi_c)
    out.crossings = crossovers(fb.law, fv.law, lo_c, hi_c)
    if pairs:
        out.cross_share = sum(bool(crossovers(b, v, lo_c, hi_c, points=60)) for b, v in pairs) / len(pairs)
    return out


def analyze(lines: list[Line], mode: str, seed: int = 0, n_boot: int = N_BOOT) -> Scaling:
    """Fits, hold-out checks and multipliers of every line (see the module docstring)."""
    samples = draws(lines, n_boot, seed)
    results = []
    for ln in lines:
        fits = {k: fit_line(ln, k, samples, mode) for k in kinds(ln)}
        results.append(LineResult(ln, fits, holdout(ln, samples, mode)))
    vs = []
    for res in results:
        if res.line.is_baseline:
            continue
        base = next((b for b in results if b.line.is_baseline and b.line.rest == res.line.rest), None)
        if base is not None:
            vs.append(versus(res, base))
    notes = [] if any(r.line.is_baseline for r in results) else ["no baseline line: no multipliers"]
    return Scaling(results, vs, n_boot, seed, mode, notes)


def metrics(s: Scaling, slug) -> dict[str, float]:
    """``scaling/<line>/<name>`` -> value for the parent MLflow run (finite values only)."""
    out: dict[str, Any] = {}
    for res in s.lines:
        pre = f"scaling/{slug(res.line.label)}"
        for kind, fit in res.fits.items():
            sub = pre if kind == "C" else f"{pre}/{kind}"
            for k, v in fit.values().items():
                out[f"{sub}/{k}"] = v
                lo, hi = fit.ci.get(k, (math.nan, math.nan))
                out[f"{sub}/{k}_ci_low"], out[f"{sub}/{k}_ci_high"] = lo, hi
        h = res.holdout
        if h is not None and h.reason is None:
            out[f"{pre}/holdout_predicted"], out[f"{pre}/holdout_measured"] = h.predicted, h.rung.mean
            out[f"{pre}/holdout_error"], out[f"{pre}/holdout_error_pct"] = h.error, h.error_pct
    for v in s.versus:
        pre = f"scaling/{slug(v.line.label)}"
        if v.at and v.at[-1][0] not in v.unidentified:
            _, c, m, lo, hi, _ = v.at[-1]
            out.update({f"{pre}/multiplier_at_max": m, f"{pre}/multiplier_at_max_ci_low": lo,
                        f"{pre}/multiplier_at_max_ci_high": hi, f"{pre}/multiplier_at_max_flops": c})
        if v.crossings:
            out[f"{pre}/crossover_flops"] = v.crossings[0]
    return {k: float(x) for k, x in out.items() if isinstance(x, (int, float)) and math.isfinite(x)}
