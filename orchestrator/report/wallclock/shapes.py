"""Which two models each wall-clock speedup compares, and at which shape, from the trials' params.

A trial's **shape** is what decides the work of one of its training steps: the model it resolved
(its ``resolved.model.*`` params, less ``init_std`` and ``router_init``, which change the weights'
values and not the work), ``train.batch_size``, ``train.seq_len``, ``train.grad_accum``,
``train.device``, ``train.compile`` and ``train.threads``. Its **hash** (sha256 of the shape as
sorted JSON, 16 hex digits) names it in ``throughput.json``: a saved measurement is used only where
both hashes of a comparison are in it (``store``).

A comparison (one row of a paired table: a variant against the baseline on the blocks both have)
has one shape on each side when every finished trial of its blocks has the same one; a table
pooled over depths (or another factor that changes the model) has several, and gets no speedup in
that table, only in the tables of one depth each.
"""
from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

import pandas as pd

from orchestrator.core.fmt import norm_value, to_float
from orchestrator.report.compare.results import PairedAnalysis
from orchestrator.report.multiplier.seeds import runs_by_block
from orchestrator.report.render.figures import finished

MODEL = "params.resolved.model."
TRAIN = {"batch_size": None, "seq_len": None, "grad_accum": 1, "device": "auto", "compile": False, "threads": None}
NOT_WORK = ("init_std", "router_init")
NO_MODEL = "its runs carry no resolved model (`resolved.model.*` params) or no `train.batch_size`/`train.seq_len`"


@dataclass(frozen=True)
class Need:
    """One comparison's two models: their shape hashes (None with ``why``) and the ratio of their
    training FLOPs per step (the variant's over the baseline's, from the runs' accounting)."""

    scope: str
    variant: Any
    base: str | None
    var: str | None
    flops_ratio: float
    why: str = ""

    @property
    def same(self) -> bool:
        """The same model at the same shape: the throughput ratio is 1 by construction."""
        return self.base is not None and self.base == self.var


def _plain(v: Any) -> Any:
    v = norm_value(v)
    return None if isinstance(v, float) and not math.isfinite(v) else v


def shape_of(row: pd.Series) -> dict | None:
    """A trial's shape (see the module docstring), or None when its params do not say."""
    model: dict[str, Any] = {}
    for col in sorted(c for c in row.index if isinstance(c, str) and c.startswith(MODEL)):
        key, v = col[len(MODEL):], _plain(row[col])
        head, _, rest = key.partition(".")
        if head in NOT_WORK:
            continue
        if rest:  # a nested field (router_prune.top_p): a run without it has no value there
            if v is not None:
                sub = model.get(head)
                model[head] = {**(sub if isinstance(sub, dict) else {}), rest: v}
        elif not isinstance(model.get(head), dict):
            model[head] = v
    train = {k: _plain(row.get(f"params.train.{k}")) for k in TRAIN}
    if not model or train["batch_size"] is None or train["seq_len"] is None:
        return None
    return {"model": model, **{k: (TRAIN[k] if v is None else v) for k, v in train.items()}}


def shape_hash(shape: dict) -> str:
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def needs(df: pd.DataFrame, axis: str, blocks: list[str],
          tables: list[PairedAnalysis]) -> tuple[list[Need], dict[str, dict]]:
    """Every comparison of the paired tables with its two shapes; the shapes by hash."""
    runs = runs_by_block(df, axis, blocks)
    shapes: dict[str, dict] = {}
    by_run: dict[str, str | None] = {}
    for _, row in finished(df).iterrows():
        s = shape_of(row)
        by_run[str(row["run_id"])] = None if s is None else shape_hash(s)
        if s is not None:
            shapes.setdefault(shape_hash(s), s)
    out = []
    for pa in tables:
        if not (pa.paired and pa.baseline is not None):
            continue
        base = str(norm_value(pa.baseline))
        for r in pa.rows:
            v_runs = [runs[k] for b in r.seeds if (k := (str(norm_value(r.variant)), b)) in runs]
            b_runs = [runs[k] for b in r.seeds if (k := (base, b)) in runs]
            out.append(_need(pa.scope, r.variant, v_runs, b_runs, by_run))
    return out, shapes


def _need(scope: str, variant: Any, v_runs: list, b_runs: list, by_run: dict) -> Need:
    vs, bs = {by_run.get(rid) for rid, _ in v_runs}, {by_run.get(rid) for rid, _ in b_runs}
    ratio = _median_fps(v_runs) / _median_fps(b_runs) if v_runs and b_runs else math.nan
    if not v_runs or not b_runs:
        return Need(scope, variant, None, None, ratio, "no finished pair of runs")
    if None in vs | bs:
        return Need(scope, variant, None, None, ratio, NO_MODEL)
    if len(vs) > 1 or len(bs) > 1:
        return Need(scope, variant, None, None, ratio,
                    f"its trials have {max(len(vs), len(bs))} model shapes in this table (pooled over a factor that "
                    "changes the model, such as depth); see the tables of one shape")
    if not (math.isfinite(ratio) and ratio > 0):
        return Need(scope, variant, None, None, ratio, "no `model/flops_per_token` on its runs")
    return Need(scope, variant, next(iter(bs)), next(iter(vs)), ratio)


def _median_fps(runs: list) -> float:
    vals = [to_float(f) for _, f in runs]
    vals = [v for v in vals if math.isfinite(v)]
    return statistics.median(vals) if vals else math.nan
