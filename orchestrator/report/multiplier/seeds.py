"""The per-seed compute multipliers of a report's paired tables.

For every comparison of a paired table (a variant against the baseline on the blocks both have:
a seed, or a seed with the other blocking factors, ``by_seed``) and every block: the variant's
final validation loss (the last ``val/loss`` evaluation of its run, its final model's loss) and its
training FLOPs at that evaluation (step x its FLOPs per step: 3 x ``model/flops_per_token`` x tokens
per step, ``orchestrator.report.runs``, from ``lime_arch.accounting``); the FLOPs the baseline's run
on the same block needs to reach that loss, off its own ``val/loss`` curve (``curve.reach``); the
multiplier is the second over the first, and its log is the per-block sample of the verdict.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.core.fmt import norm_value, to_float
from orchestrator.report.compare.by_seed import block_key
from orchestrator.report.compare.results import PairedAnalysis
from orchestrator.report.multiplier.curve import Reach, reach
from orchestrator.report.render.figures import finished

CURVE = "val/loss"
History = Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]
DECIMALS = 10  # of a log-multiplier: a relative 1e-10 of the multiplier
NO_CURVE, NO_FLOPS, ONE_EVAL = "no `val/loss` curve", "no `model/flops_per_token`", "a single `val/loss` evaluation"


@dataclass(frozen=True)
class SeedValue:
    """One block of one comparison: the variant's final loss and FLOPs, and what the baseline needs."""

    scope: str
    variant: Any
    block: Any
    target: float  # the variant's final val/loss (its last evaluation)
    flops: float  # the variant's training FLOPs at that evaluation
    reach: Reach | None  # None: no value (``why``)
    why: str = ""

    @property
    def log_m(self) -> float:
        """log(the baseline's FLOPs to reach ``target`` / ``flops``), rounded to ``DECIMALS``; NaN without a
        value. Why rounded: the logs of ~1e15 FLOPs carry float noise of ~1e-14, and two models with the
        same curve would otherwise differ by it, seed by seed, and get a verdict from it (``by_seed.snap``)."""
        return round(self.reach.log_c - math.log(self.flops), DECIMALS) if self.reach is not None else math.nan


def runs_by_block(df: pd.DataFrame, axis: str, blocks: list[str]) -> dict[tuple[str, Any], tuple[str, float]]:
    """(axis value as text, block) -> (run id, FLOPs per step) of the finished trials (the first of a
    repeated block: a paired table has none)."""
    keys = [b for b in dict.fromkeys(blocks) if b in df.columns and b != axis]
    out: dict[tuple[str, Any], tuple[str, float]] = {}
    if not keys:
        return out
    for _, r in finished(df).iterrows():
        out.setdefault((str(norm_value(r[axis])), block_key(r, keys)),
                       (str(r["run_id"]), to_float(r.get("flops_per_step"))))
    return out


def curve(histories: History, run_id: str, fps: float) -> tuple[np.ndarray, np.ndarray] | str:
    """(log training FLOPs, val/loss) of a run's evaluations after step 0, in step order; or why none."""
    h = histories.get(run_id, {}).get(CURVE)
    if h is None:
        return NO_CURVE
    s, v = np.asarray(h[0], np.float64), np.asarray(h[1], np.float64)
    ok = (s > 0) & np.isfinite(v)
    if not ok.any():
        return NO_CURVE
    if not (math.isfinite(fps) and fps > 0):
        return NO_FLOPS
    order = np.argsort(s[ok], kind="stable")
    return np.log(s[ok][order] * fps), v[ok][order]


def pair(scope: str, variant: Any, block: Any, var_run: tuple[str, float] | None,
         base_run: tuple[str, float] | None, histories: History) -> SeedValue:
    """The multiplier of one block (see the module docstring)."""
    def none(why: str) -> SeedValue:
        return SeedValue(scope, variant, block, math.nan, math.nan, None, why)

    if var_run is None or base_run is None:
        return none("no finished run")
    vc, bc = curve(histories, *var_run), curve(histories, *base_run)
    if isinstance(vc, str):
        return none(f"the variant's run has {vc}")
    if isinstance(bc, str):
        return none(f"the baseline's run has {bc}")
    if len(bc[0]) < 2:
        return none(f"the baseline's run has {ONE_EVAL}")
    target, flops = float(vc[1][-1]), float(math.exp(vc[0][-1]))
    return SeedValue(scope, variant, block, target, flops, reach(bc[0], bc[1], target))


def table_values(pa: PairedAnalysis, runs: dict, histories: History) -> dict[Any, list[SeedValue]]:
    """variant -> one ``SeedValue`` per block of its comparison with the baseline (in the table's order)."""
    base = str(norm_value(pa.baseline))
    return {r.variant: [pair(pa.scope, r.variant, b, runs.get((str(norm_value(r.variant)), b)), runs.get((base, b)),
                             histories) for b in r.seeds] for r in pa.rows}
