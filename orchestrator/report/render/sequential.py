"""The "Sequential seeds" section of a sweep run with ``lime sweep run --until-decided`` (or a
``decide:`` block): per comparison its confidence sequence after each wave, the seeds it used and
its verdict, whether the equivalence margin (fixed at the first look) was within reach at the cap,
and the trials the sweep used against two fixed-seed designs, each a fair comparison of a different
question:

- the fixed design with the same seed cap (every arm run to ``max_seeds``): what the stopping saved;
- the fixed design with the same power for the planner's effect (``planner.fixed_design`` at the
  sequential design's own simulated power, ``verdict_power.sequential_seeds``): what the same
  chance of a decision costs without looking. The planner's usual 80%-power design is said beside
  it only as what 80% would take: a sequential run with less power is not cheaper than it in any
  useful sense (the audit's "72 trials against 528 (86% fewer)" compared a run of 4.5% power with
  an 80%-power design).

With a cost budget (``decide.budget``): the budget, what the sweep spent against it (trials and
core-hours, from the last look's record) and each comparison a look ended "inconclusive at budget"
with its projection (``orchestrator.decide.budget``); its row in the table says so beside its verdict.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from orchestrator.core.fmt import cell_text, num, table
from orchestrator.decide.budget import Projection
from orchestrator.decide.costs import Budget, Cost
from orchestrator.decide.verdict import AT_BUDGET
from orchestrator.report.compare.results import PairedAnalysis
from orchestrator.report.planner import fixed_design, needs
from orchestrator.report.stats import rule, verdict_power

NOT_VALID = "not valid after optional stopping"  # the label of every fixed-n number of a sequential report


def _looks(row, waves: dict[int, str]) -> list[int]:
    """The numbers of seeds at which this comparison was looked at (the recorded waves), up to its own."""
    ns = []
    for text in waves.values():
        try:
            n = json.loads(text).get("n", {}).get(cell_text(row.variant))
        except (ValueError, AttributeError):
            continue
        if isinstance(n, int) and 2 <= n <= row.n and n not in ns:
            ns.append(n)
    return ns if ns and ns[-1] == row.n else ns + [row.n]


def lines(pa: PairedAnalysis, waves: dict[int, str], decide: Any, ref: Any, mode: str,
          margin: float | None = None) -> list[str]:
    """``margin``: the absolute margin the waves used (fixed at the first look), or None."""
    if not pa.paired or not pa.rows:
        return []
    level = pa.rows[0].confidence
    ended, _ = _budget_records(waves)
    body = []
    for r in pa.rows:
        d = np.asarray(r.diffs, np.float64)
        seq = []
        for n in _looks(r, waves):
            iv = rule.sequence(d[:n], level)
            seq.append(f"{n}: [{num(iv.low, 3)}, {num(iv.high, 3)}]" if iv.finite else f"{n}: (-inf, inf)")
        word = f"{r.verdict} ({AT_BUDGET})" if cell_text(r.variant) in ended else r.verdict
        body.append([cell_text(r.variant), str(r.n), word, "; ".join(seq)])
    design = (f"waves of {decide.wave} seed(s), at most {decide.max_seeds} per arm" if decide is not None else "waves")
    out = ["", "## Sequential seeds", "",
           f"Seeds were added in {design}: after each wave every comparison's confidence sequence at "
           f"{100 * level:.4g}% was looked at, a decided comparison got no more seeds, the undecided ones and the "
           f"baseline got the next wave ({len(waves)} look(s) recorded on the parent run). Each sequence covers "
           "at every number of seeds at once, so stopping when it is decided keeps the error rate.", "",
           *table(["variant", "seeds used", "verdict", "sequence after each look (seeds: interval)"], body),
           "", f"The fixed-n numbers elsewhere in this report (p-values, Holm, Wilcoxon, Mann-Whitney, Kruskal-Wallis, "
               f"Friedman, t intervals of the means) assume the seeds were fixed in advance: they are {NOT_VALID} "
               "and are labelled so; the verdicts are the sequences above."]
    return (out + reach(pa, waves, decide, level, margin) + _compute(pa, waves, decide, level, ref)
            + budget(pa, waves, decide))


def first_look(pa: PairedAnalysis, waves: dict[int, str]) -> int:
    """The seeds per comparison at the first recorded look (the smallest look of any comparison)."""
    return min((_looks(r, waves)[0] for r in pa.rows), default=2)


def reach(pa: PairedAnalysis, waves: dict[int, str], decide: Any, level: float, margin: float | None) -> list[str]:
    """Whether the margin could be met at the cap: the seeds the sequence needs to lie inside +-margin
    with a true difference of 0 at the sd each comparison showed at the first look."""
    if margin is None or decide is None:
        return []
    n0, out = first_look(pa, waves), []
    for r in pa.rows:
        d = np.asarray(r.diffs, np.float64)[:n0]
        if len(d) < 2:
            continue
        sd = float(d.std(ddof=1))
        need = rule.margin_seeds(sd, margin, level)
        if need is None or need > decide.max_seeds:
            out.append(f"`{cell_text(r.variant)}`: sd {num(sd, 3)} at the first look ({len(d)} seeds) needs "
                       + (f"{need} seeds" if need is not None else "more than 100000 seeds")
                       + f" for an \"equivalent\" verdict even with a true difference of 0: out of reach at the cap of "
                         f"{decide.max_seeds}")
    if not out:
        return ["", f"The margin +-{margin:g} (fixed at the first look, used by every look and by this "
                    f"report's verdicts) was within reach at the cap of {decide.max_seeds} seeds for every comparison."]
    return ["", f"The margin +-{margin:g} (fixed at the first look, used by every look and by this report's "
                "verdicts) was out of reach at the cap for " + "; ".join(out) + "."]


def _compute(pa: PairedAnalysis, waves: dict[int, str], decide: Any, level: float, ref: Any) -> list[str]:
    used, arms = sum(len(v) for v in pa.values.values()), len(pa.values)
    out = [f"Compute: {used} finished trials."]
    if decide is not None:
        cap = decide.max_seeds * arms
        out.append(f"Against a fixed design with the same cap ({decide.max_seeds} seeds x {arms} arms = {cap} trials, "
                   f"the seeds the run could have used): {_saving(cap - used, cap)}.")
    hard = min(needs(pa, ref), key=lambda x: x.dz, default=None)
    plan = fixed_design(pa, level, ref)
    if hard is None or plan is None or decide is None or not math.isfinite(hard.dz):
        return ["", " ".join(out + ["No design of equal power to compare with (no finite sd yet, or no cap)."])]
    n0 = first_look(pa, waves)
    _, pw = verdict_power.sequential_seeds(level, hard.dz, max(2, n0), decide.wave, decide.max_seeds)
    same = verdict_power.verdict_seeds(level, hard.dz, max(pw, 1e-9))
    same_text = (f"{same} seeds x {arms} arms = {same * arms} trials: {_saving(same * arms - used, same * arms)}"
                 if same is not None else f"more than {verdict_power.MAX_SEEDS} seeds per arm (the planner's cap)")
    out.append(f"For the planner's effect, {hard.why} (d_z {num(hard.dz, 3)} with the sd upper bound of "
               f"`{cell_text(hard.variant)}`, the comparison hardest to decide), this sequential design had a "
               f"simulated power of {100 * pw:.1f}%; a fixed design with the same power needs {same_text}.")
    fixed = plan.seeds * arms
    if pw < verdict_power.TARGET:
        out.append(f"A fixed design with {verdict_power.TARGET:.0%} power would need {plan.seeds_text()} seeds per arm "
                   f"({fixed} trials or more); this sequential design does not have that power, so its trials are "
                   "not a saving against it.")
    else:
        out.append(f"Against the fixed design with {verdict_power.TARGET:.0%} power ({plan.seeds_text()} seeds x "
                   f"{arms} arms = {fixed} trials: {plan.why}): {_saving(fixed - used, fixed)}.")
    return ["", " ".join(out)]


def _saving(saved: int, fixed: int) -> str:
    if saved >= 0:
        return f"saves {saved} trials" + (f" ({100 * saved / fixed:.0f}%)" if fixed else "")
    return f"costs {-saved} trials more" + (f" ({-100 * saved / fixed:.0f}% more)" if fixed else "")


def _budget_records(waves: dict[int, str]) -> tuple[dict[str, Projection], Cost | None]:
    """({variant text: its projection} of the comparisons a look ended inconclusive at budget, what the
    last look that recorded it had spent)."""
    ended, spent = {}, None
    for text in waves.values():
        try:
            w = json.loads(text)
        except ValueError:
            continue
        if not isinstance(w, dict):
            continue
        ended.update({k: Projection.from_record(p) for k, p in (w.get("ended") or {}).items()})
        spent = Cost.from_record(w["spent"]) if w.get("spent") else spent
    return ended, spent


def budget(pa: PairedAnalysis, waves: dict[int, str], decide: Any) -> list[str]:
    """The budget (``decide.budget``), what was spent against it, and each comparison that ended
    inconclusive at budget with the projection that ended it."""
    b = Budget.parse(getattr(decide, "budget", None))
    if b is None:
        return []
    ended, spent = _budget_records(waves)
    units = tuple(dict.fromkeys(("trials", "core_hours", *b.units)))
    used = sum(len(v) for v in pa.values.values())
    out = [f"Budget (`decide.budget`): {b.text()}. Spent against it: "
           + (f"{spent.text(units)} (at the last look; hours are the trials' measured wall times x the cores or GPUs "
              "each held)." if spent is not None else f"{used} finished trials (no look recorded its spending).")]
    if ended:
        out.append("Inconclusive at budget (no more seeds; the verdict is the sequence's at the seeds it had): "
                   + "; ".join(f"`{v}`: {p.text(units, b.units)}" for v, p in ended.items()) + ".")
    else:
        out.append("No comparison ended inconclusive at budget.")
    return ["", " ".join(out)]
