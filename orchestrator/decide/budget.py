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

What a trial is expected to cost, and what the sweep spent: ``orchestrator.decide.costs``.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace

import numpy as np

from orchestrator.decide import reach
from orchestrator.decide.costs import Budget, Cost, Ledger, from_json, to_json, wave_cost


@dataclass(frozen=True)
class Projection:
    """What an undecided comparison needs at a look and what that costs against what was left (why it
    ended inconclusive at budget, or that it fits)."""

    look: int
    n: int  # the seeds its sequence rests on
    median: float  # of its differences at that look
    sd: float
    seeds: int | None  # seeds per arm a decision needs at that median and sd (None: more than reach.LIMIT)
    cost: Cost  # what reaching them would cost beyond what was launched
    left: Cost  # what the budget had left
    spent_out: bool = False  # ended because the budget was spent, not by its own projection
    fits: bool = False  # the projected cost fits what is left (the comparison continues)

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
        return f"{head}: {self.cost.text(units)} more, {'within' if self.fits else 'above'} the {left} left"

    def record(self) -> dict:
        return {"look": self.look, "n": self.n, "median": to_json(self.median), "sd": to_json(self.sd),
                "need": self.seeds, "cost": self.cost.record(), "left": self.left.record(), "spent": self.spent_out}

    @classmethod
    def from_record(cls, d: dict) -> Projection:
        return cls(look=int(d.get("look", 0)), n=int(d.get("n", 0)), median=from_json(d.get("median")),
                   sd=from_json(d.get("sd")), seeds=d.get("need"), cost=Cost.from_record(d.get("cost")),
                   left=Cost.from_record(d.get("left")), spent_out=bool(d.get("spent")))


def screen(arms: list[tuple[Hashable, np.ndarray, int]], baseline: Hashable, base_launched: int, size: int,
           budget: Budget, ledger: Ledger, level: float, margin: float | None,
           look: int) -> tuple[list, dict[Hashable, Projection], int, dict[Hashable, Projection]]:
    """(the variants that continue, {variant: Projection} of those that end inconclusive at budget,
    the next wave's seeds per arm, {variant: Projection} of every arm with a spread, the continuing
    ones' too) for the undecided ``arms`` (variant, its differences, its launched seeds) before a
    wave of ``size`` seeds per arm. See the module docstring."""
    left = budget.left(ledger.spent)
    keep, ended, projected = [], {}, {}
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
        fits = not budget.over(cost, ledger.spent)
        projected[v] = Projection(look, len(d), med, sd, need, cost, left, fits=fits)
        if fits:
            keep.append(v)
        else:
            ended[v] = projected[v]
    while keep and size >= 1 and budget.over(wave_cost([baseline, *keep], ledger, size), ledger.spent):
        size -= 1  # a smaller wave that fits
    if keep and size < 1:  # not even one seed per arm: the budget is spent
        n = {v: len(d) for v, d, _ in arms}
        for v in keep:
            p = projected.get(v) or Projection(look, n[v], math.nan, math.nan, None, Cost(), left)
            ended[v] = replace(p, cost=ledger.trial(v) + pb, spent_out=True, fits=False)
        keep = []
    return keep, ended, size, projected
