"""The sequential design on plain data: after each wave of seeds, which comparisons are decided and
which variants get the next wave (``lime sweep run --until-decided``; the same code runs the
simulations of ``tests/orchestrator/decide/test_waves.py`` and ``test_budget.py``).

After every wave each variant's paired differences variant - baseline (on the seeds both finished)
get the verdict rule (``rule.decide``: the sign confidence sequence of the median difference, the
mean's mixture sequence beside it) at the baseline family's Bonferroni level 1 - alpha / m, m the
number of variants. A decided
comparison (better, worse, equivalent within margin) gets no more seeds, and its sequence stops
there; the undecided ones and the baseline get ``wave`` more seeds, until a variant has been
launched with ``max_seeds`` seeds ("not decided at the cap"). Because every sequence covers at every
number of seeds at once, stopping when it is decided keeps each comparison's error rate below
alpha / m and the family's below alpha, however many waves there are.

With a cost budget (``Design.budget``, ``orchestrator.decide.budget``) each undecided comparison is
priced before the wave: one whose projected cost exceeds what is left ends "inconclusive at budget"
and gets no more seeds, and the wave shrinks to what the budget can pay for. Stopping earlier
removes verdicts and never adds one, so the error control above is unchanged.

``run_waves`` is the loop: ``fetch()`` gives what finished (and what was launched), ``launch``
runs the next wave (Ray Tune in a sweep), ``record`` keeps each wave's decisions (on the parent
run, so a killed driver resumes the sequence where it was: the loop starts from whatever finished),
``meter(launched)`` what was spent and what a trial costs (``costs.Ledger``; without it, trials only).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from orchestrator.decide import budget as budgets
from orchestrator.decide import costs, rule
from orchestrator.decide.families import BASELINE, Family
from orchestrator.decide.intervals import Interval
from orchestrator.decide.verdict import AT_BUDGET, DECIDED, UNDECIDABLE, UNDECIDED, UNTESTED, Verdict

Values = dict[Hashable, dict[Any, float]]  # variant -> {seed: finished metric}


@dataclass(frozen=True, kw_only=True)
class Design:
    """What the sequential design needs to know, fixed before the first wave."""

    baseline: Hashable
    variants: tuple  # the compared values besides the baseline, in report order
    mode: str  # "min" or "max"
    alpha: float
    margin: float | None  # absolute, metric units
    max_seeds: int  # seeds per arm at most
    wave: int  # seeds added per wave
    budget: costs.Budget | None = None  # what the sweep may cost at most

    @property
    def family(self) -> Family:
        return Family(BASELINE, len(self.variants), self.alpha)


@dataclass(frozen=True)
class Decision:
    variant: Hashable
    seeds: tuple  # the common seeds the sequence rests on, in order
    interval: Interval
    verdict: Verdict
    launched: int  # seeds this variant was launched with
    mean: Interval | None = None  # the mean's confidence sequence, shown beside the verdict's (median)
    flag: str = ""  # outlier or strong skew (``rule.flag``)
    projection: budgets.Projection | None = None  # why it ended inconclusive at budget

    @property
    def decided(self) -> bool:
        return self.verdict.word in DECIDED

    @property
    def final(self) -> bool:
        """It gets no more seeds whatever the cap: decided, or ended at budget."""
        return self.decided or self.verdict.word == AT_BUDGET


@dataclass
class Wave:
    index: int  # 1 for the first look
    decisions: list[Decision]
    next_variants: list = field(default_factory=list)  # the baseline first; empty when done
    next_seeds: list = field(default_factory=list)
    done: bool = False
    why: str = ""
    spent: costs.Cost | None = None  # with a budget: what the sweep had spent at this look
    next_cost: costs.Cost | None = None  # with a budget: what the next wave costs
    ended: dict = field(default_factory=dict)  # variant -> Projection: ended at budget at this look
    projected: dict = field(default_factory=dict)  # variant -> Projection of every undecided one priced here

    def record(self) -> dict[str, Any]:
        """The wave as plain data (what the parent run keeps, JSON)."""
        out = {"n": {str(d.variant): len(d.seeds) for d in self.decisions},
               "verdict": {str(d.variant): d.verdict.word for d in self.decisions},
               "next": [str(v) for v in self.next_variants], "seeds": list(self.next_seeds)}
        if self.spent is not None:
            out["spent"] = self.spent.record()
            out["ended"] = {str(v): p.record() for v, p in self.ended.items()}
            out["projected"] = {str(v): p.seeds for v, p in self.projected.items()}  # seeds per arm needed
            if self.next_cost is not None:
                out["next_cost"] = self.next_cost.record()
        return out


def differences(values: Values, variant: Hashable, baseline: Hashable) -> tuple[tuple, np.ndarray]:
    """The seeds both finished (in order) and the per-seed differences variant - baseline."""
    a, b = values.get(variant, {}), values.get(baseline, {})
    seeds = tuple(sorted(set(a) & set(b), key=lambda s: (str(type(s)), s)))
    return seeds, np.array([a[s] - b[s] for s in seeds], np.float64)


def decide_wave(values: Values, launched: dict[Hashable, set], design: Design, index: int,
                frozen: dict[Hashable, Decision] | None = None, ledger: costs.Ledger | None = None,
                stopped: dict[Hashable, budgets.Projection] | None = None) -> Wave:
    """The decisions after a wave and the next wave (see the module docstring). ``frozen``: the
    comparisons decided (or ended at budget) at an earlier look (they keep their decision);
    ``stopped``: those a resumed driver read as ended at budget; ``ledger``: the budget's spending
    (default: the launched trials, ``costs.count``)."""
    level = design.family.level
    decisions = []
    for v in design.variants:
        if frozen and v in frozen:
            decisions.append(frozen[v])
            continue
        seeds, d = differences(values, v, design.baseline)
        r = rule.decide(d, level, design.mode, design.margin, sequential=True, seeds=seeds)
        dec = Decision(v, seeds, r.interval, r.verdict, len(launched.get(v, ())), r.mean, r.flag)
        if stopped and v in stopped:
            dec = replace(dec, verdict=Verdict(AT_BUDGET), projection=stopped[v])
        decisions.append(dec)
    open_ = [d for d in decisions if not d.final and d.launched < design.max_seeds]
    wave = Wave(index, decisions)
    size = max(1, min(design.wave, design.max_seeds - max((d.launched for d in open_), default=0)))
    if design.budget is not None:
        ledger = ledger or costs.count(launched)
        wave.spent = ledger.spent
        if open_:
            arms = [(d.variant, differences(values, d.variant, design.baseline)[1], d.launched) for d in open_]
            nb = len(launched.get(design.baseline, ()))
            keep, wave.ended, size, wave.projected = budgets.screen(arms, design.baseline, nb, size, design.budget,
                                                                    ledger, level, design.margin, index)
            wave.decisions = decisions = [replace(d, verdict=Verdict(AT_BUDGET), projection=wave.ended[d.variant])
                                          if d.variant in wave.ended else d for d in decisions]
            open_ = [d for d in open_ if d.variant in keep]
            wave.next_cost = costs.wave_cost([design.baseline, *keep], ledger, size) if keep else None
    if not open_:
        capped = [d for d in decisions if not d.final]
        spent = [d for d in decisions if d.verdict.word == AT_BUDGET]
        wave.done = True
        why = ([f"{len(capped)} comparison(s) not decided at the cap of {design.max_seeds} seeds"] if capped else [])
        why += [f"{len(spent)} comparison(s) inconclusive at budget"] if spent else []
        wave.why = "; ".join(why) or "every comparison is decided"
        return wave
    every = set().union(*launched.values()) if launched else set()
    top = max((s for s in every if isinstance(s, int)), default=-1)
    wave.next_seeds = list(range(top + 1, top + 1 + size))
    wave.next_variants = [design.baseline] + [d.variant for d in open_]
    words = {UNDECIDABLE: "too few seeds for a finite sequence", UNDECIDED: "not decided", UNTESTED: "not tested"}
    wave.why = "; ".join(f"{d.variant}: {words.get(d.verdict.word, d.verdict.word)} at {len(d.seeds)} seeds"
                         for d in open_)
    return wave


def run_waves(fetch: Callable[[], tuple[Values, dict[Hashable, set]]],
              launch: Callable[[list, list], None], design: Design,
              record: Callable[[Wave], None] = lambda w: None, first_index: int = 1,
              max_waves: int = 1000, meter: Callable[[dict], costs.Ledger] | None = None,
              stopped: dict[Hashable, budgets.Projection] | None = None) -> list[Wave]:
    """Decide, launch the next wave, repeat until done (see the module docstring). ``stopped``: the
    comparisons a resumed driver finds ended at budget at an earlier look."""
    waves: list[Wave] = []
    frozen: dict[Hashable, Decision] = {}
    for index in range(first_index, first_index + max_waves):
        values, launched = fetch()
        ledger = meter(launched) if meter is not None and design.budget is not None else None
        wave = decide_wave(values, launched, design, index, frozen, ledger, stopped)
        frozen.update({d.variant: d for d in wave.decisions if d.final})
        record(wave)
        waves.append(wave)
        if wave.done:
            return waves
        launch(wave.next_variants, wave.next_seeds)
    raise RuntimeError(f"run_waves: no decision after {max_waves} waves")
