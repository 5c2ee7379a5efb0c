"""Interval -> verdict: every verdict is read off its printed interval, so they cannot disagree.

One rule for the fixed-n design (the interval is ``intervals.paired_interval``) and the sequential
one (``sequential.confidence_sequence``), at the family's level (``families``):

1. fewer than 2 shared seeds: "not tested";
2. the interval is the whole line: "cannot decide" (no data at this n could give a finite
   interval: the sign-flip test needs 6 seeds at 95%, more at a family's level);
3. it excludes 0: "better" or "worse", from the side and the metric's direction;
4. a margin is set and the interval lies inside (-margin, +margin): "equivalent within margin".
   A two-sided 1 - a interval inside the margin is two one-sided tests (TOST), each at a / 2;
5. otherwise "not decided" (the report adds the minimal detectable effect).

A "better" or "worse" interval that also lies inside the margin is flagged ``within_margin``: a
real difference smaller than what the sweep calls negligible.

The margin (``report.margin``, ``decide.margin``, ``--margin``): an absolute difference in the
metric's units (``0.01``) or a percentage of the baseline's mean (``"1%"``), for the report's metric,
or a mapping metric -> either (``{final/val_loss: 0.01, val/accuracy: 1%}``). Its text form, which
the parent run records, is ``0.01``, ``1%`` or ``final/val_loss=0.01;val/accuracy=1%``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lime_arch.errors import ConfigError

if TYPE_CHECKING:  # only annotated here: the margin parsing a sweep file's check reads stays free of scipy
    from orchestrator.decide.intervals import Interval

BETTER, WORSE, EQUIVALENT, UNDECIDED, UNDECIDABLE, UNTESTED, BASELINE = (
    "better", "worse", "equivalent within margin", "not decided", "cannot decide", "not tested", "baseline")
DECIDED = (BETTER, WORSE, EQUIVALENT)
# the outcome of a sequential comparison stopped by the cost budget (``decide.budget``): not a verdict
# read off an interval (its interval says "not decided"), but why it got no more seeds
AT_BUDGET = "inconclusive at budget"
BUDGET_UNITS = {"trials": "trials", "core_hours": "core-hours", "gpu_hours": "GPU-hours"}  # key -> words
MAX_WORDS = ("acc", "exact", "score")


def metric_mode(metric: str, mode: str | None = None) -> str:
    """"min" or "max": the sweep's ``report.mode`` when given, else from the metric's name."""
    if mode in ("min", "max"):
        return mode
    return "max" if any(w in metric for w in MAX_WORDS) else "min"


def improvement(diff: float, mode: str) -> float:
    """A difference variant - baseline turned so that positive is better."""
    return -diff if mode == "min" else diff


@dataclass(frozen=True)
class Verdict:
    word: str
    within_margin: bool = False  # a better/worse interval that also lies inside the margin


def verdict(iv: Interval, mode: str, margin: float | None = None) -> Verdict:
    """The verdict of one comparison from its interval (variant - baseline) and absolute margin."""
    if iv.n < 2 or math.isnan(iv.low) or math.isnan(iv.high):
        return Verdict(UNTESTED)
    if not iv.finite:
        return Verdict(UNDECIDABLE)
    inside = margin is not None and margin > 0 and -margin < iv.low and iv.high < margin
    if iv.low > 0 or iv.high < 0:
        side = iv.low if iv.low > 0 else iv.high
        return Verdict(BETTER if improvement(side, mode) > 0 else WORSE, inside)
    return Verdict(EQUIVALENT if inside else UNDECIDED)


def contradiction(word: str, low: float, high: float, better: str, margin: float | None) -> str | None:
    """Why a verdict disagrees with its interval [low, high] (None: it does not). ``better`` is
    "lower" or "higher"; ``margin`` the absolute margin (None or NaN: none)."""
    has_margin = margin is not None and math.isfinite(margin) and margin > 0
    finite = math.isfinite(low) and math.isfinite(high)
    excludes = finite and (low > 0 or high < 0)
    inside = has_margin and finite and -margin < low and high < margin
    if word in (BETTER, WORSE):
        want_low = (word == BETTER) == (better == "higher")  # the interval must be above 0
        ok = low > 0 if want_low else high < 0
        return None if finite and ok else f"{word} but the interval [{low:g}, {high:g}] does not exclude 0 on that side"
    if word == EQUIVALENT:
        return None if inside and not excludes else (
            f"{word} but the interval [{low:g}, {high:g}] is not inside +-{margin}")
    if word == UNDECIDED:
        if excludes:
            return f"{word} but the interval [{low:g}, {high:g}] excludes 0"
        return f"{word} but the interval [{low:g}, {high:g}] lies inside the margin +-{margin}" if inside else None
    if word == UNDECIDABLE:
        return None if not finite else f"{word} but the interval [{low:g}, {high:g}] is finite"
    return None


# -- margins ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Margin:
    """An equivalence margin: ``value`` in the metric's units, or percent of the baseline's mean."""

    value: float
    relative: bool

    def absolute(self, base_mean: float) -> float | None:
        if not self.relative:
            return self.value
        return self.value / 100.0 * abs(base_mean) if math.isfinite(base_mean) and base_mean else None

    def text(self) -> str:
        return f"{self.value:g}%" if self.relative else f"{self.value:g}"


METRIC_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.@-]+)+\Z")
MAX_PERCENT = 100.0  # a relative margin is below the baseline's whole mean: any equivalence at 100% is vacuous
_PCT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*%\s*\Z")


def parse_margin(v: Any, where: str = "report.margin") -> Margin:
    """One margin: a number > 0 (absolute) or "X%" with X > 0 (relative to the baseline's mean)."""
    if isinstance(v, bool):
        raise ConfigError(f"{where}: must be a number > 0 or a percentage like '1%', got {v!r}")
    if isinstance(v, (int, float)):
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{where}: must be > 0 (an absolute difference in the metric's units), got {v!r}")
        return Margin(float(v), False)
    if isinstance(v, str):
        m = _PCT.match(v)
        if m and float(m.group(1)) >= MAX_PERCENT:  # a margin as wide as the baseline's mean decides nothing
            raise ConfigError(f"{where}: a percentage must be above 0 and below {MAX_PERCENT:g}% of the baseline's "
                              f"mean, such as '1%' (or give an absolute margin in the metric's units), got {v!r}")
        if m and float(m.group(1)) > 0:
            return Margin(float(m.group(1)), True)
        try:
            return parse_margin(float(v), where)
        except ValueError:
            pass
    raise ConfigError(f"{where}: must be a number > 0 (metric units) or a percentage like '1%' of the baseline's "
                      f"mean, got {v!r}")


def parse_margins(v: Any, where: str = "report.margin") -> dict[str | None, Margin]:
    """A margin setting -> {metric or None (the report's metric): Margin}; {} for None."""
    if v is None or v == "":
        return {}
    if isinstance(v, dict):
        if not v:
            raise ConfigError(f"{where}: an empty mapping; give metric: margin pairs or one margin")
        for k in v:  # a metric's name: ``final/val_loss``, ``eval/<task>/<metric>`` (a bare word never is)
            if not isinstance(k, str) or not METRIC_NAME.match(k):
                raise ConfigError(f"{where}: {k!r} is not a metric name; name metrics as logged, like "
                                  "final/val_loss or eval/<task>/<metric>")
        return {str(k): parse_margin(x, f"{where}.{k}") for k, x in v.items()}
    if isinstance(v, str) and "=" in v:  # the recorded text of a mapping
        out = {}
        for part in v.split(";"):
            key, _, val = part.partition("=")
            out[key.strip()] = parse_margin(val.strip(), f"{where}.{key.strip()}")
        return out
    return {None: parse_margin(v, where)}


def margins_text(margins: dict[str | None, Margin]) -> str | None:
    """The text the parent run records (``parse_margins`` reads it back)."""
    if not margins:
        return None
    if list(margins) == [None]:
        return margins[None].text()
    return ";".join(f"{k}={m.text()}" for k, m in margins.items())


def margin_for(margins: dict[str | None, Margin], metric: str, report_metric: str) -> Margin | None:
    """The margin of ``metric``: its own entry, else the unnamed one when it is the report's metric."""
    if metric in margins:
        return margins[metric]
    return margins.get(None) if metric == report_metric else None


def check_margin_metrics(margins: dict[str | None, Margin], logged: list[str], sweep: str,
                         where: str = "report.margin") -> None:
    """ConfigError when a margin names a metric no run of the sweep logs (it would apply to nothing)."""
    for k in margins:
        if k is not None and k not in logged:
            raise ConfigError(f"{where}.{k}: {k!r} is not logged by any run of sweep {sweep!r}; metrics: "
                              f"{sorted(logged)}")


def table_contradictions(rows: list[dict[str, Any]]) -> list[str]:
    """Every row of a report's summary.csv or pairs.csv whose verdict its interval contradicts
    (columns verdict, diff_ci_low, diff_ci_high, better, margin); [] when none does."""
    out = []
    for r in rows:
        word = str(r.get("verdict", ""))
        if word not in (BETTER, WORSE, EQUIVALENT, UNDECIDED, UNDECIDABLE):
            continue
        lo, hi, m = (_float(r.get(k)) for k in ("diff_ci_low", "diff_ci_high", "margin"))
        why = contradiction(word, lo, hi, str(r.get("better", "lower")), m)
        if why:
            name = r.get("variant") if "variant" in r else f"{r.get('a')} vs {r.get('b')}"
            out.append(f"{r.get('scope', '')}: {name}: {why}")
    return out


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
