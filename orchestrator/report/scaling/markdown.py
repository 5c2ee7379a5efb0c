"""The markdown of the scaling section (``orchestrator.report.scaling.fits``'s numbers, the depth view
of ``orchestrator.report.scaling.depth``): fixed order and formatting, so the same runs give the
same bytes."""
from __future__ import annotations

import math

from orchestrator.core.fmt import cell, cell_text, num, sci, table
from orchestrator.report.scaling import depth
from orchestrator.report.scaling.fits import BOOT_FAIL_MAX, CROSS_SPAN, Fit, Scaling, Versus
from orchestrator.report.scaling.laws import HUBER_DELTA
from orchestrator.report.scaling.rungs import Line
from orchestrator.report.stats import rule

__all__ = ["section"]
FORMS = {"C": "L(C) = E + A * C^(-alpha), C = training FLOPs",
         "N": "L(N) = E + A * N^(-alpha), N = parameters, at fixed tokens",
         "ND": "L(N, D) = E + A * N^(-a) + B * D^(-b), N = parameters, D = tokens (Chinchilla)"}


def _ci(v: float, lo: float, hi: float, sci_fmt: bool = False) -> str:
    f = sci if sci_fmt else (lambda x: num(x, 4))
    return f"{f(v)} [{f(lo)}, {f(hi)}]"


def rungs_table(s: Scaling) -> list[str]:
    rows = []
    for res in s.lines:
        for r in res.line.rungs:
            sd = f" ± {num(r.std, 3)}" if len(r.values) > 1 else ""
            rows.append([cell(res.line.label), cell(r.label), sci(r.c), sci(r.n), sci(r.d), str(len(r.values)),
                         f"{num(r.mean, 5)}{sd}"])
    return table(["variant", "rung", "C (FLOPs)", "N (params)", "D (tokens)", "seeds", "mean ± std"], rows)


def fits_table(s: Scaling, kind: str) -> list[str]:
    names = {"C": ("E", "A", "alpha"), "N": ("E", "A", "alpha"), "ND": ("E", "A", "a", "B", "b")}[kind]
    rows, reasons = [], []
    for res in s.lines:
        fit: Fit | None = res.fits.get(kind)
        if fit is None:
            continue
        if fit.law is None:
            rows.append([cell(res.line.label), str(fit.rungs)] + ["-"] * len(names) + ["not identifiable"])
            reasons.append(f"- `{res.line.label}`: not identifiable: {fit.reason}.")
            continue
        vals = fit.values()
        ok = sum(b is not None for b in fit.boot)
        rows.append([cell(res.line.label), str(fit.rungs)]
                    + [_ci(vals[k], *fit.ci[k], sci_fmt=k in ("A", "B")) for k in names]
                    + [f"fitted ({ok}/{len(fit.boot)} resamples)"])
    if not rows:
        return []
    return table(["variant", "rungs"] + [f"{k} [95% CI]" for k in names] + ["status"], rows) + (
        [""] + reasons if reasons else [])


def holdout_table(s: Scaling) -> list[str]:
    rows, reasons = [], []
    for res in s.lines:
        h = res.holdout
        if h is None:
            continue
        if h.reason:
            reasons.append(f"- `{res.line.label}`: no hold-out check: {h.reason}.")
            continue
        r = h.rung
        se = r.std / math.sqrt(len(r.values)) if len(r.values) > 1 else math.nan
        rows.append([cell(res.line.label), cell(r.label), sci(r.c), _ci(h.predicted, *h.ci),
                     f"{num(r.mean, 5)} ± {num(se, 2)}", num(h.error, 3), f"{h.error_pct:+.2f}%",
                     "yes" if h.ci[0] <= r.mean <= h.ci[1] else "no"])
    if not rows:
        return reasons
    out = table(["variant", "held-out rung", "C", "predicted [95% CI]", "measured mean ± SE", "error",
                 "error %", "measured in CI"], rows)
    return out + ([""] + reasons if reasons else [])


def _multiplier_text(m: float, lo: float, hi: float) -> str:
    def f(x: float) -> str:
        return "inf" if math.isinf(x) else num(x, 3)
    return f"{f(m)}x [{f(lo)}, {f(hi)}]"


def versus_lines(s: Scaling) -> list[str]:
    rows, words = [], []
    for v in s.versus:
        if v.reason:
            words.append(f"- `{v.line.label}` vs `{v.base.label}`: no multiplier: {v.reason}.")
            continue
        for i, (label, c, m, lo, hi, extra) in enumerate(v.at):
            tag = " (largest)" if i == len(v.at) - 1 else ""
            shown = (f"not identifiable: {v.unidentified[label]}" if label in v.unidentified
                     else _multiplier_text(m, lo, hi))
            rows.append([cell(v.line.label), cell(label) + tag, sci(c), shown, "yes" if extra else "no"])
        words.append("- " + _cross_text(v, s))
    head = ["variant", "at rung", "C", "multiplier [95% CI]", "baseline's curve extrapolated"]
    if not rows:
        return words
    return table(head, rows) + ([""] + words if words else [])


def _cross_text(v: Versus, s: Scaling) -> str:
    base_max = max(r.c for r in v.base.rungs)
    share = "" if math.isnan(v.cross_share) else (
        f"; the resampled curves cross in this window in {100 * v.cross_share:.0f}% of the resamples")
    window = f"between {sci(v.window[0])} and {sci(v.window[1])} FLOPs ({CROSS_SPAN:g}x the largest rung)"
    if not v.crossings:
        return f"`{v.line.label}` and `{v.base.label}`: the fitted curves do not cross {window}{share}."
    parts = []
    for c in v.crossings:
        where = "inside the measured range" if c <= base_max else "extrapolated beyond the largest rung"
        parts.append(f"{sci(c)} FLOPs ({where})")
    return f"`{v.line.label}` and `{v.base.label}`: the fitted curves cross at {', '.join(parts)}{share}."


def depth_lines(views: list[depth.DepthView], metric: str, mode: str, margin=None,
                verdicts: dict | None = None) -> list[str]:
    """``verdicts``: (variant, depth) -> the verdict of the report's per-depth table."""
    if not views:
        return []
    out = ["", "### Depth (fixed width)", "",
           f"`{metric}` against the number of layers, per variant, and the difference to the baseline at "
           f"each depth (paired over the seeds both have, {rule.label(depth.LEVEL)} interval of one comparison: "
           "the family-corrected verdicts are the per-depth tables above). The plot is `depth.png` (see Plots).",
           ""]
    for i, v in enumerate(views):
        out += [""] if i else []
        rows = []
        for r in v.rows:
            def ms(g):
                if g is None:
                    return "-"
                sd = f" ± {num(g.std, 3)}" if len(g.values) > 1 else ""
                return f"{num(g.mean, 5)}{sd} (n={len(g.values)})"
            diff = "-" if math.isnan(r.diff) else f"{num(r.diff, 3)} [{num(r.ci[0], 3)}, {num(r.ci[1], 3)}]"
            rows.append([str(r.depth), ms(r.base), ms(r.var), diff])
        out += table(["n_layers", f"{v.base.label} (baseline)", v.line.label,
                      f"difference [{rule.label(depth.LEVEL)}]"], rows)
        out += [""] + [f"- {t}" for t in depth.statements(v, metric, mode, margin, _of(verdicts, v))]
    return out


def _of(verdicts: dict | None, v: depth.DepthView) -> dict:
    """One view's verdicts per depth, from (variant, depth) keys; none for a line split by another
    factor (the per-depth verdicts pool that factor, so they are not this line's)."""
    if v.line.rest:
        return {}
    return {d: x for (var, d), x in (verdicts or {}).items() if var == cell_text(v.line.value)}


def summary(s: Scaling, views: list[depth.DepthView], metric: str, verdicts: dict | None = None) -> list[str]:
    """The findings in one place: multiplier at the largest rung, hold-out errors, depth trend."""
    out = []
    for v in s.versus:
        name = f"`{v.line.label}` vs `{v.base.label}`"
        if v.reason:
            out.append(f"- {name}: no compute multiplier ({v.reason}).")
        else:
            label, c, m, lo, hi, _ = v.at[-1]
            cross = ("the curves do not cross" if not v.crossings
                     else f"the curves cross at {sci(v.crossings[0])} FLOPs")
            mult = (f"not identifiable ({v.unidentified[label]})" if label in v.unidentified
                    else _multiplier_text(m, lo, hi))
            out.append(f"- {name}: effective compute multiplier {mult} at {label} (C = {sci(c)}); {cross}.")
    for res in s.lines:
        h = res.holdout
        if h is not None and h.reason is None:
            inside = "inside" if h.ci[0] <= h.rung.mean <= h.ci[1] else "outside"
            out.append(f"- `{res.line.label}`: the fit without {h.rung.label} predicts it {h.error_pct:+.2f}% off "
                       f"the measured mean ({inside} the prediction's 95% CI).")
    for dv in views:
        if dv.trend is not None:
            out.append("- " + depth.trend_text(dv, metric, _of(verdicts, dv)))
    return (["", "### Summary", ""] + out + [""]) if out else [""]


def _size_words(lines: list[Line]) -> str:
    keys = sorted({k for ln in lines for r in ln.rungs for k in r.sizes})
    return ", ".join(f"`{k}`" for k in keys) or "tokens"


# measured by tests/orchestrator/report/test_scaling_fit.py::test_the_stated_bootstrap_coverage
COVERAGE_NOTE = ("a percentile bootstrap of seeds covers less than its 95% at the seed counts the shipped sweeps have "
                 "per rung (simulated for the mean of normal values: 76% at 3 seeds, 79% at 4, 87% at 6); the "
                 "coverage of the fitted parameters' and multipliers' intervals is not simulated and is no better: "
                 "read them as descriptive.")


def section(s: Scaling, views: list[depth.DepthView], metric: str, axis: str, plot: str | None,
            margin=None, verdicts: dict | None = None) -> list[str]:
    lines = [res.line for res in s.lines]
    kinds = [k for k in ("C", "N", "ND") if any(k in res.fits for res in s.lines)]
    out = ["", "## Scaling", "",
           f"The sweep varies {_size_words(lines)} besides `{axis}`: each value of `{axis}` is a line of rungs "
           f"(model sizes or training lengths), and `{metric}` is fitted per line. The fits minimize the Huber loss "
           f"(delta {HUBER_DELTA:g}) of log residuals with L-BFGS-B from a grid of starting points (Hoffmann et al. "
           f"2022, approach 3), one point per seed; CIs are percentile intervals of {s.n_boot} refits on seeds "
           f"resampled within each rung (seed {s.seed}; the same draws for every variant, so they stay paired). "
           f"Coverage: {COVERAGE_NOTE} "
           "A fit is not identifiable, and no parameters are shown, with fewer rungs than parameters + 1, a curve "
           "that is flat or rises beyond 2 standard errors, an exponent at a bound, or more than "
           f"{100 * BOOT_FAIL_MAX:.0f}% failed refits. With 3 parameters (E, A, alpha) a fit needs >= 4 rungs, and "
           "so does the hold-out check (its refit on 3 rungs is then exactly determined).", "",
           "### Rungs", ""] + rungs_table(s)
    for kind in kinds:
        title = {"C": "Fits against training compute", "N": "Fits against parameters (fixed tokens)",
                 "ND": "Fits against parameters and tokens"}[kind]
        out += ["", f"### {title}", "", f"{FORMS[kind]}; A in the units of the data.", ""] + fits_table(s, kind)
    hold = holdout_table(s)
    if hold:
        out += ["", "### Hold-out check", "",
                "The compute fit redone without each line's largest rung, predicting that rung: the error is "
                "the prediction minus the measured mean (the CI of the prediction from the same resamples).",
                ""] + hold
    vs = versus_lines(s)
    if vs:
        out += ["", "### Effective compute multiplier", "",
                "At the compute C of each of the variant's rungs: the compute the baseline's fitted curve needs to "
                "reach the variant's fitted loss at C, divided by C (> 1: the variant is worth that much more "
                "compute). Where the variant's fitted loss lies below the baseline's fitted floor E, or more than "
                "10% of the bootstrap draws are infinite, the multiplier is not identifiable and the table says "
                "why. The baseline's curve is extrapolated where that compute lies beyond its largest rung.",
                ""] + vs
    out += depth_lines(views, metric, s.mode, margin, verdicts)
    out += summary(s, views, metric, verdicts)
    if plot:
        out += [f"![Scaling fits]({plot})", "",
                "Points: seeds; markers: rung means; lines: fits with bootstrap 95% bands; right: the multiplier "
                "against C with its band."]
    return out + [f"- {n}" for n in s.notes]
