"""The "Sequential seeds" section of a sweep run with ``lime sweep run --until-decided`` (or a
``decide:`` block): per comparison its confidence sequence after each wave, the seeds it used and
its verdict, and the trials the sweep used against the fixed-seed design the planner would have
asked for (``orchestrator.report.planner.fixed_design``: the verdict rule's seeds for the planner's
effect, from an upper confidence bound of this sweep's sd).
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from orchestrator.core.fmt import cell_text, num, table
from orchestrator.decide import rule
from orchestrator.report.compare.results import PairedAnalysis
from orchestrator.report.planner import fixed_design


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


def lines(pa: PairedAnalysis, waves: dict[int, str], decide: Any, ref: Any, mode: str) -> list[str]:
    if not pa.paired or not pa.rows:
        return []
    level = pa.rows[0].confidence
    body = []
    for r in pa.rows:
        d = np.asarray(r.diffs, np.float64)
        seq = []
        for n in _looks(r, waves):
            iv = rule.decide(d[:n], level, "min", sequential=True).interval
            seq.append(f"{n}: [{num(iv.low, 3)}, {num(iv.high, 3)}]" if iv.finite else f"{n}: (-inf, inf)")
        body.append([cell_text(r.variant), str(r.n), r.verdict, "; ".join(seq)])
    design = (f"waves of {decide.wave} seed(s), at most {decide.max_seeds} per arm" if decide is not None else "waves")
    out = ["", "## Sequential seeds", "",
           f"Seeds were added in {design}: after each wave every comparison's confidence sequence at "
           f"{100 * level:.4g}% was looked at, a decided comparison got no more seeds, the undecided ones and the "
           f"baseline got the next wave ({len(waves)} look(s) recorded on the parent run). Each sequence covers "
           "at every number of seeds at once, so stopping when it is decided keeps the error rate.", "",
           *table(["variant", "seeds used", "verdict", "sequence after each look (seeds: interval)"], body)]
    return out + _compute(pa, level, ref, mode)


def _compute(pa: PairedAnalysis, level: float, ref: Any, mode: str) -> list[str]:
    used = sum(len(v) for v in pa.values.values())
    plan = fixed_design(pa, level, ref)
    if plan is None:
        return ["", f"Trials used: {used}. No fixed design to compare with (no finite sd yet)."]
    n_fixed, why = plan
    fixed = n_fixed * len(pa.values)
    saved = fixed - used
    verb = f"saves {saved}" if saved >= 0 else f"costs {-saved} more"
    pct = f" ({100 * saved / fixed:.0f}%)" if fixed and math.isfinite(fixed) else ""
    return ["", f"Compute: {used} finished trials against the fixed design's {fixed} ({n_fixed} seeds x "
            f"{len(pa.values)} arms: {why}); the sequential design {verb} trials{pct}."]
