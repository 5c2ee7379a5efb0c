"""The report's "Unstable trials" section: trials the stability monitor tagged or that diverged,
listed beside the verdicts, and the sensitivity of every verdict to them.

- Unstable: a trial whose run is tagged ``stability=spiky`` (``orchestrator.engine.stability``:
  a loss or gradient-norm spike) or whose status is ``diverged`` (the trainer's non-finite loss).
- Sensitivity: the verdicts recomputed with those trials set aside, by the same function that made
  the report's verdicts (``verdicts_without``'s ``decide``: the report's own pipeline, families
  included), and which of them move. Nothing is dropped from the report's tables: the line says
  what would change, never changes it. A diverged trial is no sample already (no final metric),
  so only spiky finished trials can move a verdict.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from lime_arch.errors import ConfigError
from orchestrator.core.fmt import cell_text, table
from orchestrator.core.status import TrialStatus
from orchestrator.report.compare.results import PairedAnalysis

SPIKY = "spiky"  # orchestrator.engine.stability.SPIKY (the report does not import the engine)
TAG_COL, STEPS_COL = "tags.stability", "tags.stability_steps"
COUNTS = ("stability/train_loss_spikes", "stability/grad_norm_spikes", "stability/val_loss_spikes")


def unstable_mask(df: pd.DataFrame) -> pd.Series:
    """True for every spike-tagged or diverged trial."""
    spiky = df[TAG_COL].astype(str).eq(SPIKY) if TAG_COL in df.columns else pd.Series(False, index=df.index)
    return spiky | df["status"].astype(str).eq(str(TrialStatus.DIVERGED))


def verdict_map(analyses: list[PairedAnalysis]) -> dict[str, str]:
    """``"<scope>: <variant> vs <baseline>"`` (and every all-pairs comparison) -> its verdict."""
    out = {}
    for pa in analyses:
        for r in pa.rows:
            out[f"{pa.scope}: {cell_text(r.variant)} vs {cell_text(pa.baseline)}"] = r.verdict
        for p in pa.pairs:
            out[f"{pa.scope}: {cell_text(p.a)} vs {cell_text(p.b)}"] = p.verdict
    return out


def moved(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``comparison: old -> new`` for every verdict that differs (or disappears) without the trials."""
    return [f"{k}: {v} -> {after.get(k, 'not compared')}" for k, v in before.items() if after.get(k) != v]


def _count(v: Any) -> str:
    return str(int(v)) if isinstance(v, (int, float)) and math.isfinite(v) else ""


def section(df: pd.DataFrame, sdf: pd.DataFrame, axis: str, analyses: list[PairedAnalysis],
            decide: Callable[[pd.DataFrame], list[PairedAnalysis]]) -> list[str]:
    """The markdown lines (none when every trial is stable). ``df``: every trial; ``sdf``: the trials
    the statistics use; ``analyses``: the report's decided tables; ``decide``: the same pipeline
    applied to a frame of trials."""
    bad = df[unstable_mask(df)]
    if bad.empty:
        return []
    rows = []
    for _, r in bad.iterrows():
        steps = r.get(STEPS_COL)
        rows.append([cell_text(r[axis]), cell_text(r.get("seed")), str(r["status"]),
                     str(r.get(TAG_COL)) if isinstance(r.get(TAG_COL), str) else "",
                     *(_count(r.get(c)) for c in COUNTS),
                     steps if isinstance(steps, str) and steps else ""])
    lines = ["", "## Unstable trials", "",
             "Trials the stability monitor tagged (a loss or gradient-norm spike, robust z >= the engine's "
             "threshold against the series' own trailing window) or that diverged. They stay in every table; "
             "the sensitivity line says which verdicts move if they are set aside.", "",
             *table([axis, "seed", "status", "stability", "train loss spikes", "grad norm spikes", "val loss spikes",
                    "spikes at"], rows), ""]
    ids = set(bad["trial_id"])
    metric = analyses[0].metric if analyses else None
    mine = sdf[sdf["trial_id"].isin(ids)]
    finite = pd.to_numeric(mine[metric], errors="coerce").map(math.isfinite) if metric in mine else False
    n_used = int((mine["status"].astype(str).eq(str(TrialStatus.FINISHED)) & finite).sum())
    if n_used == 0:  # the tables hold none of them (diverged: no final metric): nothing to recompute
        said = ("this trial is no sample of the tables (no finite final metric), so no verdict rests on it"
                if len(ids) == 1 else f"none of these {len(ids)} trials is a sample of the tables (no finite final "
                "metric), so no verdict rests on them")
        return lines + [f"Sensitivity: {said}."]
    try:
        after = verdict_map(decide(sdf[~sdf["trial_id"].isin(ids)]))
    except (ConfigError, ValueError, KeyError) as e:
        return lines + [f"Sensitivity: the verdicts could not be recomputed without these {len(ids)} trials ({e})."]
    change = moved(verdict_map(analyses), after)
    what = f"without these {len(ids)} trials ({n_used} of them samples of the tables)"
    if not change:
        return lines + [f"Sensitivity: {what}, no verdict moves."]
    return lines + [f"Sensitivity: {what}, {len(change)} verdict(s) move:", "",
                    *(f"- {c}" for c in change)]
