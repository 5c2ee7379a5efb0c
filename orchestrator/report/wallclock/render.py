"""The wall-clock speedups in a report: the Verdicts section's "Worth in wall-clock time" part, the
ranking's column, summary.csv's columns and the parent run's metrics.

summary.csv (each variant's row of each scope; empty where there is none): ``wall_clock_speedup``,
``wall_clock_speedup_ci_low`` / ``_ci_high`` / ``_level`` / ``_verdict``, ``throughput_ratio`` (F, the
variant's training FLOPs per second over the baseline's), ``step_time_ratio`` (the measured baseline /
variant step time) with ``_ci_low`` / ``_ci_high`` at ``throughput_level`` (each factor's level),
``flops_per_step_ratio`` and ``throughput_rounds``. Metrics: ``wallclock/<variant>/speedup``,
``.../ci_low``, ``.../ci_high``, ``.../throughput_ratio``; per depth ``wallclock/<variant>/<scope>/...``.
"""
from __future__ import annotations

import math
from typing import Any

from orchestrator.core.fmt import cell_text, norm_value, num, slug
from orchestrator.report.multiplier.render import times
from orchestrator.report.wallclock import UNDECIDABLE, Speedup, WallClock

HEADING = "### Worth in wall-clock time (speedup)"
COLUMNS = ("wall_clock_speedup", "wall_clock_speedup_ci_low", "wall_clock_speedup_ci_high", "wall_clock_speedup_level",
           "wall_clock_speedup_verdict", "throughput_ratio", "step_time_ratio", "step_time_ratio_ci_low",
           "step_time_ratio_ci_high", "throughput_level", "flops_per_step_ratio", "throughput_rounds")
WORDS = {"faster": "faster: it reaches its loss in less wall-clock time than the baseline needs for it",
         "slower": "slower: the baseline reaches the variant's loss in less wall-clock time",
         "not decided": "not decided: the interval holds 1x"}


def pct(level: float) -> str:
    return f"{level * 100:.4g}%"


def machine(rec: dict[str, Any]) -> str:
    """Where and how the throughput was measured, from throughput.json's record."""
    m = rec.get("machine") or {}
    dev = m.get("gpu") if m.get("device") == "cuda" else m.get("cpu")
    before, after = (rec.get("load_before") or [math.nan])[0], (rec.get("load_after") or [math.nan])[0]
    load = f", load average {num(before, 3)} before and {num(after, 3)} after"
    return (f"{m.get('device', '?')} ({dev or '?'}), {m.get('dtype', '?')}, {rec.get('threads', '?')} thread(s), "
            f"clock {rec.get('clock', '?')}{load}; torch {m.get('torch', '?')}, commit `{rec.get('commit', '?')}`, "
            f"measured {rec.get('created', '?')}")


def sentence(s: Speedup, scope: str) -> str:
    where = "" if scope == "all" else f" ({scope})"
    name = f"**{cell_text(s.need.variant)}**{where}"
    parts = f"{times(s.multiplier)} the compute x {times(s.throughput)} the throughput"
    if s.rounds:
        measured = (f" Measured: step-time ratio baseline / variant {num(s.step_ratio, 4)} [{num(s.s_low, 4)}, "
                    f"{num(s.s_high, 4)}] ({pct(s.level)}, sign interval over {s.rounds} rounds; median step "
                    f"{num(s.step_ms[0], 4)} ms for the baseline, {num(s.step_ms[1], 4)} ms for the variant) x FLOPs "
                    f"per step ratio {num(s.need.flops_ratio, 4)}; the "
                    f"multiplier at {pct(s.m_level)}: [{times(s.m_low)}, {times(s.m_high)}].")
    else:
        measured = " The baseline's model at its shape: throughput ratio 1 by construction, nothing measured."
    note = f" ({s.note})" if s.note else ""
    if s.verdict == "not tested":
        return f"- {name}: {times(s.speedup)} the wall-clock speed ({parts}); not tested{note}."
    word = (f"cannot decide: too few seeds or rounds for a finite interval (the multiplier's at {pct(s.m_level)}, "
            f"the rounds' at {pct(s.level)})"
            if s.verdict == UNDECIDABLE else WORDS[s.verdict])
    return (f"- {name}: {times(s.speedup)} the wall-clock speed ({parts}), {pct(s.confidence)} interval "
            f"[{times(s.low)}, {times(s.high)}]; {word}{note}.{measured}")


def lines(w: WallClock) -> list[str]:
    """The "Worth in wall-clock time" part of the Verdicts section ([] without compute multipliers)."""
    skipped = [f"- **{cell_text(n.variant)}**{'' if n.scope == 'all' else f' ({n.scope})'}: no speedup: {n.why}."
               for n in w.skipped]
    if w.absent:
        return ["", HEADING, "", f"Wall-clock speedup: {w.absent}."]
    if not w.rows:
        return ["", HEADING, "", *skipped] if skipped else []
    where = (f"Measured for this report in one process on {machine(w.measured)} (`throughput.json`)."
             if w.measured else "Every variant has the baseline's model and shape, so nothing was measured.")
    out = ["", HEADING, "",
           "How many times faster in wall-clock time a variant reaches its final `val/loss` than the baseline "
           "reaches it: its compute multiplier (above) times its throughput ratio, its training FLOPs per second over "
           "the baseline's: the measured step-time ratio (baseline / variant) times the ratio of FLOPs per step "
           "(variant / baseline, the runs' accounting, which turns the multiplier's FLOPs back into steps). The step "
           "times come from the two models built at the sweep's shape (the trials' resolved model, batch, sequence "
           "length, gradient accumulation, device, dtype, compile and threads) and timed side by side in interleaved "
           "paired rounds as `lime bench` times them (a variant's step between two of the baseline's, its ratio to "
           "their mean), never from the trials' own step times. " + where + " Interval: the multiplier's own interval "
           "(its verdict's, at 1 - a, the multiplier family's level; its exact error e = 2 P(Bin(n, 1/2) <= k - 1) "
           "at its depth k) and the step-time ratio's sign interval at 1 - (a - e), multiplied end by end (after "
           "sequential seeds: each at 1 - a/2); both hold together at 1 - a (Bonferroni), so the speedups hold "
           "together at the multiplier family's level (docs/STATISTICS.md).", ""]
    for scope, rows in w.rows.items():
        out += [sentence(s, scope) for s in rows]
    return out + skipped


def ranking(w: WallClock) -> dict[str, str] | None:
    """variant (as text) -> the ranking's cell; None where no speedup is shown."""
    rows = w.rows.get("all", [])
    if not rows:
        return None
    return {str(norm_value(s.need.variant)): times(s.speedup) + (f" [{times(s.low)}, {times(s.high)}]"
                                                                 if s.low == s.low else "") for s in rows}


def add_columns(rows: list[dict[str, Any]], w: WallClock) -> None:
    """summary.csv's speedup columns (in place; empty where a row has none)."""
    for row in rows:
        vals: dict[str, Any] = dict.fromkeys(COLUMNS, math.nan)
        s = None if row.get("baseline") else w.row(row["scope"], row["variant"])
        if s is not None:
            vals.update(zip(COLUMNS, (s.speedup, s.low, s.high, s.confidence, s.verdict, s.throughput, s.step_ratio,
                                      s.s_low, s.s_high, s.level, s.need.flops_ratio, s.rounds)))
        row.update(vals)


def metrics(w: WallClock) -> dict[str, float]:
    out = {}
    for scope, rows in w.rows.items():
        for s in rows:
            key = f"wallclock/{slug(cell_text(s.need.variant))}" + ("" if scope == "all" else f"/{slug(scope)}")
            out.update({f"{key}/speedup": s.speedup, f"{key}/ci_low": s.low, f"{key}/ci_high": s.high,
                        f"{key}/throughput_ratio": s.throughput})
    return out
