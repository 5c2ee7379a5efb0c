"""A cost budget for sequential seeds (``decide.budget`` in a sweep file, ``--budget``): in trials,
core-hours or GPU-hours, or several at once (each is a limit).

Before each wave (``waves.decide_wave``), for every undecided comparison:

- the seeds it needs: ``reach.seeds_needed`` at its observed median and sd (the typical differences
  at that median and spread, through the real sign sequence; the same projection the margin's reach
  uses with a median of 0), at least one more wave;
- what reaching them costs beyond what was launched: its own extra seeds plus the baseline's, each
  at the expected cost of one trial of that arm (``Ledger``).

A comparison whose projected cost exceeds what the budget has left, in any of its units, ends
"inconclusive at budget" (``verdict.AT_BUDGET``) with its projection, and its arm gets no more
seeds; the others continue. The next wave is then priced: if it does not fit, it gets fewer seeds
per arm; if even one seed per arm does not fit, the budget is spent and every remaining undecided
comparison ends inconclusive at budget.

Why this keeps the error rate: every sequence covers at every number of seeds at once, so any
stopping rule, this one included, keeps each comparison's error at its level; stopping at budget
only ever stops a sequence earlier, and a stopped sequence says nothing ("inconclusive"), so it can
only remove verdicts, never add one (``tests/orchestrator/decide/test_budget.py`` checks both
on simulated sweeps through the real stopping code).

The expected cost of a trial: 1 trial; its hours are the mean measured wall time of that arm's
trials times the cores (or GPUs) each trial holds. An arm none of whose trials has a measured time
gets the measured hours per planned training FLOP of the others times its own planned FLOPs (the
dry-run estimate, ``orchestrator.sweep.spec.estimate``); before any trial has a measured time the
hours cannot be projected, and only a trials budget prices the waves.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from orchestrator.decide import reach
from orchestrator.decide.verdict import BUDGET_UNITS as WORDS

UNITS = tuple(WORDS)


def _num(x: float) -> str:
    return f"{x:.0f}" if x == int(x) and abs(x) < 1e15 else f"{x:.3g}"


def _rec(x: float) -> float | str | None:
    """A number for a JSON record: 4 significant digits; inf as "inf", nan (not known) as null."""
    return float(f"{x:.4g}") if math.isfinite(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else None


def _unrec(x: Any) -> float:
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
        return {u: _rec(v) for u, v in zip(UNITS, self.values())}

    @classmethod
    def from_record(cls, d: dict | None) -> Cost:
        return cls(*(_unrec((d or {}).get(u)) for u in UNITS))


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
            per_hour[a] = float(np.mean(hs))
        elif measured and flops and all(flops.get(b, 0) > 0 for b, _ in measured) and flops.get(a, 0) > 0:
            rate = sum(h for _, h in measured) / sum(flops[b] for b, _ in measured)
            per_hour[a] = rate * flops[a]
        elif measured:
            per_hour[a] = float(np.mean([h for _, h in measured]))
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


@dataclass(frozen=True)
class Projection:
    """Why a comparison ended inconclusive at budget: what it needed and what was left."""

    look: int
    n: int  # the seeds its sequence rests on
    median: float  # of its differences at that look
    sd: float
    seeds: int | None  # seeds per arm a decision needs at that median and sd (None: more than reach.LIMIT)
    cost: Cost  # what reaching them would cost beyond what was launched
    left: Cost  # what the budget had left
    spent_out: bool = False  # ended because the budget was spent, not by its own projection

    def text(self, units: tuple[str, ...], limits: tuple[str, ...] | None = None) -> str:
        """In words; the costs in ``units``, what was left in ``limits`` (the budget's units; default ``units``)."""
        left = self.left.text(limits or units)
        need = f"about {self.seeds}" if self.seeds is not None else f"more than {reach.LIMIT}"
        head = (f"at look {self.look} ({self.n} seeds, median {self.median:.3g}, sd {self.sd:.3g}) a decision needs "
                f"{need} seeds per arm")
        if self.spent_out:
            return (f"{head}; the budget is spent: one more seed for it and the baseline costs "
                    f"{self.cost.text(units)}, {left} left")
        if self.seeds is None:
            return f"{head}: more than any budget ({left} left)"
        return f"{head}: {self.cost.text(units)} more, above the {left} left"

    def record(self) -> dict:
        return {"look": self.look, "n": self.n, "median": _rec(self.median), "sd": _rec(self.sd),
                "need": self.seeds, "cost": self.cost.record(), "left": self.left.record(), "spent": self.spent_out}

    @classmethod
    def from_record(cls, d: dict) -> Projection:
        return cls(look=int(d.get("look", 0)), n=int(d.get("n", 0)), median=_unrec(d.get("median")),
                   sd=_unrec(d.get("sd")), seeds=d.get("need"), cost=Cost.from_record(d.get("cost")),
                   left=Cost.from_record(d.get("left")), spent_out=bool(d.get("spent")))


def screen(arms: list[tuple[Hashable, np.ndarray, int]], baseline: Hashable, base_launched: int, size: int,
           budget: Budget, ledger: Ledger, level: float, margin: float | None,
           look: int) -> tuple[list, dict[Hashable, Projection], int]:
    """(the variants that continue, {variant: Projection} of those that end inconclusive at budget,
    the next wave's seeds per arm) for the undecided ``arms`` (variant, its differences, its launched
    seeds) before a wave of ``size`` seeds per arm. See the module docstring."""
    left = budget.left(ledger.spent)
    keep, ended = [], {}
    pb = ledger.trial(baseline)
    for v, d, nv in arms:
        d = np.asarray(d, np.float64)
        if len(d) < 2:  # no spread yet: nothing to project; the wave's own price still applies below
            keep.append(v)
            continue
        sd, med = float(d.std(ddof=1)), float(np.median(d))
        need = reach.seeds_needed(sd, level, margin, med)
        if need is None:
            cost = Cost(math.inf, math.inf, math.inf)
        else:
            target = max(need, nv + size)  # undecided now: at least one more wave
            cost = ledger.trial(v).times(target - nv) + pb.times(max(0, target - base_launched))
        if budget.over(cost, ledger.spent):
            ended[v] = Projection(look, len(d), med, sd, need, cost, left)
        else:
            keep.append(v)
    while keep and size >= 1 and budget.over(wave_cost([baseline, *keep], ledger, size), ledger.spent):
        size -= 1  # a smaller wave that fits
    if keep and size < 1:  # not even one seed per arm: the budget is spent
        for v, d, _ in arms:
            if v in keep:
                d = np.asarray(d, np.float64)
                sd, med = (float(d.std(ddof=1)), float(np.median(d))) if len(d) >= 2 else (math.nan, math.nan)
                need = reach.seeds_needed(sd, level, margin, med) if len(d) >= 2 else None
                ended[v] = Projection(look, len(d), med, sd, need, ledger.trial(v) + pb, left, spent_out=True)
        keep = []
    return keep, ended, size


def wave_cost(variants: list, ledger: Ledger, size: int) -> Cost:
    """What a wave of ``size`` seeds for ``variants`` (the baseline among them) costs."""
    one = Cost(0.0)
    for v in variants:
        one = one + ledger.trial(v)
    return one.times(size)
