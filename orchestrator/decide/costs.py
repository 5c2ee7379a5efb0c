"""What a sequential sweep spends and may spend (``decide.budget`` / ``--budget``; the pricing of the
waves is ``orchestrator.decide.budget``): amounts in trials, core-hours and GPU-hours (``Cost``), the
budget's limits (``Budget``), and the ledger of a running sweep (``Ledger``: what was spent, what one
more trial of each arm is expected to cost).

The expected cost of a trial: 1 trial; its hours are the mean measured wall time of that arm's
trials times the cores (or GPUs) each trial holds. An arm none of whose trials has a measured time
gets the measured hours per planned training FLOP of the others times its own planned FLOPs (the
dry-run estimate, ``orchestrator.sweep.spec.estimate``); before any trial has a measured time the
hours are not known (nan), and only a trials budget prices the waves. Free of scipy: the sweep
file's record (``orchestrator.sweep.mlflow_runs``) writes the budget's text with it.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import Any

from orchestrator.decide.verdict import BUDGET_UNITS as WORDS

UNITS = tuple(WORDS)


def _num(x: float) -> str:
    return f"{x:.0f}" if x == int(x) and abs(x) < 1e15 else f"{x:.3g}"


def to_json(x: float) -> float | str | None:
    """A number for a JSON record: 4 significant digits; inf as "inf", nan (not known) as null."""
    return float(f"{x:.4g}") if math.isfinite(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else None


def from_json(x: Any) -> float:
    return math.nan if x is None else float(x)  # float("inf") reads "inf"


@dataclass(frozen=True)
class Cost:
    """An amount in every unit of a budget (``inf``: more than any budget; ``nan``: not known yet)."""

    trials: float = 0.0
    core_hours: float = 0.0
    gpu_hours: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(self.values(), other.values())))

    def times(self, k: float) -> Cost:
        return Cost(*(a * k if k else 0.0 for a in self.values()))  # 0 x inf is nothing, not nan

    def values(self) -> tuple[float, float, float]:
        return (self.trials, self.core_hours, self.gpu_hours)

    def text(self, units: tuple[str, ...] = UNITS) -> str:
        parts = []
        for u in units:
            v = getattr(self, u)
            parts.append(f"{'unknown' if math.isnan(v) else 'unbounded' if math.isinf(v) else _num(v)} {WORDS[u]}")
        return ", ".join(parts)

    def record(self) -> dict[str, Any]:
        """JSON-safe: 4 significant digits; inf as "inf", nan (not known) as null."""
        return {u: to_json(v) for u, v in zip(UNITS, self.values())}

    @classmethod
    def from_record(cls, d: dict | None) -> Cost:
        return cls(*(from_json((d or {}).get(u)) for u in UNITS))


@dataclass(frozen=True)
class Budget:
    """What a sequential sweep may cost at most; None: no limit in that unit."""

    trials: int | None = None
    core_hours: float | None = None
    gpu_hours: float | None = None

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(u for u in UNITS if getattr(self, u) is not None)

    def left(self, spent: Cost) -> Cost:
        return Cost(*(math.inf if getattr(self, u) is None else getattr(self, u) - getattr(spent, u) for u in UNITS))

    def over(self, cost: Cost, spent: Cost) -> list[str]:
        """The units in which ``cost`` exceeds what is left after ``spent`` (a nan cost: not known,
        never over)."""
        left = self.left(spent)
        return [u for u in self.units if getattr(cost, u) > getattr(left, u) + 1e-9]

    def text(self) -> str:
        """In words: ``60 trials, 2 core-hours``."""
        return ", ".join(f"{_num(getattr(self, u))} {WORDS[u]}" for u in self.units)

    def to_text(self) -> str:
        """As the parent run records it (``sweep.decide.budget``) and ``--budget`` takes it:
        ``trials=60,core_hours=2``."""
        return ",".join(f"{u}={getattr(self, u)!r}" for u in self.units)

    @classmethod
    def parse(cls, text: str | None) -> Budget | None:
        """``to_text``'s inverse (None for no text)."""
        if not text:
            return None
        kw = {}
        for part in text.split(","):
            key, _, value = part.partition("=")
            kw[key.strip()] = int(value) if key.strip() == "trials" else float(value)
        return cls(**kw)

    @classmethod
    def of(cls, spec) -> Budget | None:
        """From a sweep file's ``decide.budget`` (``orchestrator.sweep.blocks.BudgetSpec``) or None."""
        return None if spec is None else cls(**{f.name: getattr(spec, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Ledger:
    """What the sweep has spent, and the expected cost of one more trial of each arm."""

    spent: Cost
    per_trial: dict  # arm -> Cost
    basis: str = ""  # how the hours were estimated, in words

    def trial(self, arm: Hashable) -> Cost:
        return self.per_trial.get(arm, Cost(trials=1.0, core_hours=math.nan, gpu_hours=math.nan))


def count(launched: dict[Hashable, set]) -> Ledger:
    """Trials only: every launched trial counts; hours are not known."""
    unknown = Cost(0.0, math.nan, math.nan)
    return Ledger(Cost(float(sum(len(s) for s in launched.values())), math.nan, math.nan),
                  {a: Cost(1.0) + unknown for a in launched}, "no measured trial times")


def measure(launched: dict[Hashable, set], walls: dict[Hashable, dict], cores: float, gpus: float,
            flops: dict[Hashable, float] | None = None) -> Ledger:
    """The ledger from the launched trials and the measured wall seconds of those that have one
    (``walls``: arm -> {seed: seconds}); ``cores``/``gpus``: what one trial holds (per worker times
    workers); ``flops``: each arm's planned training FLOPs per trial (the dry run's). See the module
    docstring for the estimate."""
    hours = {a: [w / 3600.0 for s, w in walls.get(a, {}).items() if s in launched.get(a, ()) and w >= 0]
             for a in launched}
    measured = [(a, h) for a, hs in hours.items() for h in hs]
    per_hour: dict[Hashable, float] = {}
    for a, hs in hours.items():
        if hs:
            per_hour[a] = sum(hs) / len(hs)
        elif measured and flops and all(flops.get(b, 0) > 0 for b, _ in measured) and flops.get(a, 0) > 0:
            rate = sum(h for _, h in measured) / sum(flops[b] for b, _ in measured)
            per_hour[a] = rate * flops[a]
        elif measured:
            per_hour[a] = sum(h for _, h in measured) / len(measured)
        else:
            per_hour[a] = math.nan
    per_trial = {a: Cost(1.0, h * cores, h * gpus) for a, h in per_hour.items()}
    spent_h = 0.0
    for a, seeds in launched.items():
        for s in seeds:  # a launched trial without a measured time: its arm's expected hours
            w = walls.get(a, {}).get(s)
            spent_h += w / 3600.0 if w is not None and w >= 0 else (per_hour[a] if math.isfinite(per_hour[a]) else 0.0)
    n = sum(len(s) for s in launched.values())
    if not measured:
        return Ledger(Cost(float(n), math.nan, math.nan), per_trial, "no trial has a measured time yet")
    basis = (f"measured wall time of {len(measured)} trial(s) x {_num(cores)} core(s)"
             + (f", {_num(gpus)} GPU(s)" if gpus else "") + " per trial")
    return Ledger(Cost(float(n), spent_h * cores, spent_h * gpus), per_trial, basis)


def wave_cost(variants: list, ledger: Ledger, size: int) -> Cost:
    """What a wave of ``size`` seeds for ``variants`` (the baseline among them) costs."""
    one = Cost(0.0)
    for v in variants:
        one = one + ledger.trial(v)
    return one.times(size)
