"""Wall-clock speedups (issue 35): how many times faster in wall-clock time a variant reaches its final
validation loss than the baseline reaches it, with an interval.

W = M x F: the compute multiplier M (``orchestrator.report.multiplier``: the baseline's FLOPs to reach
the variant's final ``val/loss`` over the variant's FLOPs) times the throughput ratio F, the variant's
training FLOPs per second over the baseline's: F = (s_b / s_v) (c_v / c_b), the measured step-time
ratio (baseline over variant) times the ratio of FLOPs per step (variant over baseline: the runs' own
accounting, exact, which turns the multiplier's FLOPs back into steps). With steps n and step times
s, M = n_b c_b / (n_v c_v), so W = n_b s_b / (n_v s_v): the baseline's time to the variant's loss
over the variant's time. Where the FLOPs per step are equal, F is the step-time ratio.

The step times are measured for the report, never taken from the trials (theirs are co-scheduled,
``orchestrator.report.cosched``): ``lime report --throughput`` builds both models at the sweep's shape
(``shapes``) in one process and times them in R interleaved, paired rounds (``lime bench``'s pairing,
``orchestrator.bench.throughput``, passed in as ``measure``: the report layer stays torch-free). The
round ratios are saved in ``throughput.json`` (``store``), which later reports read.

Interval. A multiplier comparison has the level 1 - a of its family (Bonferroni: 1 - alpha/m). The
speedup's interval multiplies two intervals whose errors add up to at most a: the multiplier's by
the verdict rule and the median step-time ratio's sign interval over the R rounds (fixed R, set
before measuring), times c_v / c_b. With a fixed number of seeds the multiplier's factor is its own
interval at 1 - a (the one its verdict prints), whose exact error is e = 2 P(Bin(n, 1/2) <= k - 1) at
its depth k (a function of n and a only, ``signs.fixed_error``), and the rounds spend the rest, a - e:
at 6-9 seeds an even split (1 - a/2 each) would leave the multiplier's factor the whole line wherever
its own interval is only just finite. After sequential seeds (no exact error) each gets a/2.
Both quantities are positive and the product increases in each, so where both intervals hold,
[M_lo F_lo, M_hi F_hi] holds M F; by Bonferroni both hold with probability >= 1 - a, and summed over
the comparisons the speedups hold together at 1 - alpha like the multipliers. Estimand: the median
multiplier over seeds times the median throughput ratio over rounds on the measuring machine (each
median is exp of the median log, as the multiplier's). Identical models at identical shapes have
F = 1 by construction: the speedup is the multiplier, at the multiplier's own level.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core.fmt import same_value
from orchestrator.decide import rule, signs
from orchestrator.decide.verdict import UNTESTED
from orchestrator.report.compare.results import PairedAnalysis, PairedRow
from orchestrator.report.multiplier import Multipliers
from orchestrator.report.wallclock import store
from orchestrator.report.wallclock.shapes import Need, needs

__all__ = ["DEFAULT_ROUNDS", "MAX_ROUNDS", "Speedup", "WallClock", "auto_rounds", "build", "speedup"]
DEFAULT_ROUNDS, MAX_ROUNDS = 12, 200
FASTER, SLOWER, UNDECIDED, UNDECIDABLE, NOT_TESTED = "faster", "slower", "not decided", "cannot decide", "not tested"
Measure = Callable[[dict[str, dict], list[tuple[str, str]], int], dict]


@dataclass(frozen=True)
class Speedup:
    """One comparison's wall-clock speedup and its two factors, each with its interval at ``level``."""

    need: Need
    multiplier: float
    m_low: float
    m_high: float
    step_ratio: float  # baseline / variant step time, exp of the median log over rounds (1: same model)
    s_low: float
    s_high: float
    level: float  # the rounds' interval (1 - (a - e), or 1 - a/2; the multiplier's own level for the same model)
    speedup: float
    low: float
    high: float
    confidence: float  # the product's level: 1 - a
    verdict: str
    rounds: int = 0
    step_ms: tuple[float, float] = (math.nan, math.nan)  # median step of the baseline, of the variant
    note: str = ""
    m_level: float = math.nan  # the multiplier factor's level (1 - e, or 1 - a/2 after sequential seeds)

    @property
    def throughput(self) -> float:
        """F: the variant's training FLOPs per second over the baseline's."""
        return self.step_ratio * self.need.flops_ratio


@dataclass
class WallClock:
    rows: dict[str, list[Speedup]] = field(default_factory=dict)  # scope -> rows
    measured: dict[str, Any] = field(default_factory=dict)  # throughput.json's record; {} when none was used
    absent: str = ""  # why there is no speedup: not measured, or a stale file ("" with rows, or with no multiplier)
    skipped: list[Need] = field(default_factory=list)  # comparisons without one shape per side (``Need.why``)

    def row(self, scope: str, variant: Any) -> Speedup | None:
        return next((s for s in self.rows.get(scope, []) if same_value(s.need.variant, variant)), None)


def _median_exp(logs: np.ndarray) -> float:
    return float(np.exp(np.median(logs))) if len(logs) else math.nan


def _verdict(low: float, high: float) -> str:
    if not (low > 0 and math.isfinite(high)):
        return UNDECIDABLE
    return FASTER if low > 1 else SLOWER if high < 1 else UNDECIDED


def speedup(need: Need, m: PairedRow, ratios: list[float] | None, sequential: bool,
            step_ms: tuple[float, float] = (math.nan, math.nan)) -> Speedup:
    """The speedup of one comparison (see the module docstring): ``m`` its multiplier row (diffs: the
    per-seed log-multipliers), ``ratios`` the measured rounds' step-time ratios variant / baseline
    (None for the same model and shape)."""
    log_m = np.asarray(m.diffs, np.float64)
    phi = need.flops_ratio
    point_m = _median_exp(log_m)
    s_logs = np.zeros(1) if ratios is None else -np.log(np.asarray(ratios, np.float64))
    point_s = _median_exp(s_logs)
    rounds = 0 if ratios is None else len(ratios)
    if m.verdict == UNTESTED or not len(log_m) or not 0 < m.confidence < 1:
        nan = math.nan
        return Speedup(need, point_m, nan, nan, point_s, nan, nan, nan, point_m * point_s * phi, nan, nan, nan,
                       NOT_TESTED, rounds, step_ms, m.note or "its multiplier is not tested")
    if ratios is None:  # the same model: F = c_v / c_b = 1, the multiplier's interval at its own level
        level = m_level = m.confidence
        m_lo, m_hi, s_lo, s_hi = math.exp(m.ci_low), math.exp(m.ci_high), 1.0, 1.0
    else:
        a = 1.0 - m.confidence
        e = math.inf if sequential else signs.fixed_error(len(log_m), m.confidence)
        exact = e < a  # else a sequence, or a whole-line interval: the even split
        spent = e if exact else a / 2.0
        m_level, level = 1.0 - spent, 1.0 - (a - spent)
        iv = rule.median_interval(log_m, m.confidence if exact else m_level, sequential)
        m_lo, m_hi = math.exp(iv.low), math.exp(iv.high)
        s_lo, s_hi = (math.exp(x) for x in signs.sign_interval(s_logs, level))
    low, high = m_lo * s_lo * phi, m_hi * s_hi * phi
    return Speedup(need, point_m, m_lo, m_hi, point_s, s_lo, s_hi, level, point_m * point_s * phi, low, high,
                   m.confidence, _verdict(low, high), rounds, step_ms, m.note, m_level)


def auto_rounds(mult: Multipliers) -> int:
    """``DEFAULT_ROUNDS``, or more where the smallest level 1 - a/2 of the multiplier comparisons needs more
    rounds for a finite sign interval (``signs.min_seeds``), at most ``MAX_ROUNDS``."""
    levels = [1.0 - (1.0 - r.confidence) / 2.0 for rows in mult.rows.values() for r in rows if 0 < r.confidence < 1]
    need = signs.min_seeds(max(levels)) if levels else 0
    return min(MAX_ROUNDS, max(DEFAULT_ROUNDS, need))


def not_measured(sweep: str) -> str:
    return (f"not measured. `lime report {sweep} --throughput` measures each variant's training throughput against "
            "the baseline's at this sweep's shape, in one process (interleaved, paired rounds), and saves it as "
            f"{store.FILE} beside the report; the sweep's own step times are never used for it")


def build(df: pd.DataFrame, axis: str, blocks: list[str], tables: list[PairedAnalysis], mult: Multipliers,
          out_dir: Path, sweep: str, measure: Measure | None = None, rounds: int | None = None) -> WallClock:
    """The speedups of the multiplier's comparisons; with ``measure`` (``lime report --throughput``), the
    throughput measured first and saved (``rounds``: None for ``auto_rounds``)."""
    if not mult.rows:
        if measure is not None:
            print("note: no compute multiplier, so no wall-clock speedup: nothing measured", file=sys.stderr)
        return WallClock()
    got, shapes = needs(df, axis, blocks, tables)
    tested = [n for n in got if not n.why and mult.row(n.scope, n.variant) is not None]
    pairs = sorted({(n.base, n.var) for n in tested if not n.same})
    path = Path(out_dir) / store.FILE
    if measure is not None and pairs:
        n = rounds or auto_rounds(mult)
        print(f"measuring the throughput of {len(pairs)} pair(s) of models, {n} paired rounds each", file=sys.stderr)
        store.save(path, sweep, shapes, measure({h: shapes[h] for p in pairs for h in p}, pairs, n))
        print(f"wrote {path}", file=sys.stderr)
    elif measure is not None:
        print("note: every variant has the baseline's model and shape: nothing to measure", file=sys.stderr)
    entries, record, why = store.load(path, sweep, pairs) if pairs else ({}, {}, "")
    skipped = [n for n in got if n.why and mult.row(n.scope, n.variant) is not None]
    if pairs and not entries:
        return WallClock(absent=why or not_measured(sweep), skipped=skipped)
    out: dict[str, list[Speedup]] = {}
    for n in tested:
        e = entries.get((n.base, n.var))
        ms = (math.nan, math.nan) if e is None else tuple(float((e.get("step_ms") or {}).get(k, math.nan))
                                                          for k in ("baseline", "variant"))
        out.setdefault(n.scope, []).append(speedup(n, mult.row(n.scope, n.variant), None if n.same else e["ratios"],
                                                   mult.sequential, ms))
    return WallClock(out, record, "", skipped)
