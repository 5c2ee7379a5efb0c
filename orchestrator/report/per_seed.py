"""``per_seed.csv``: every sample a report's verdicts rest on, one row per (table, variant, block).

A reader (and ``tests/orchestrator/report/test_per_seed.py``) recomputes every interval of
``summary.csv`` from it: the rows of one ``scope`` and ``variant`` with ``paired`` true, in file
order, have the ``diff`` values the interval was computed from (``orchestrator.report.compare.decisions``:
``paired_interval(diffs, ci_level, resample_seed)`` for a fixed-seed sweep, the confidence
sequence for a sequential one). Columns:

- ``scope`` (``all`` or ``n_layers=<d>``), ``metric``, ``axis``, ``variant``, ``baseline`` (the
  baseline's own rows are true);
- ``block``: the seed, or the seed with the other blocking factors (``seed=0,lr=0.001``);
- ``value``: the variant's metric on that block; ``baseline_value``: the baseline's on the same
  block (empty where it has none);
- ``diff``: value - baseline_value as the verdict used it (rounded to 12 significant digits of the
  values' scale, ``by_seed.snap``), empty where the block is not paired;
- ``paired``: whether the block is one of the comparison's pairs; ``resample_seed``: the seed of the
  sign-flip interval's resampling (a report's ``seed``);
- ``log_multiplier``, ``multiplier_read``: a variant's compute multiplier on that block, as its log
  (the sample of the multiplier's verdict), and how it was read (``orchestrator.report.multiplier.render``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from orchestrator.core.fmt import norm_value, order_key
from orchestrator.report.compare.results import PairedAnalysis


def _block(b: Any, names: list[str] | None = None) -> str:
    if not isinstance(b, tuple):
        return str(b)
    if names and len(names) == len(b):
        return ",".join(f"{n}={v}" for n, v in zip(names, b))
    return ",".join(map(str, b))


def rows(analyses: list[PairedAnalysis], blocks: list[str] | None = None, resample_seed: int = 0,
         extra: Callable[[str, Any, Any], dict] | None = None) -> list[dict]:
    """The per_seed.csv rows of a report's paired tables (the pooled one, then one per depth);
    ``extra(scope, variant, block)``: more columns of a row (the same keys for every row)."""
    out = []
    for pa in analyses:
        base = pa.values.get(pa.baseline, {}) if pa.baseline is not None else {}
        by_variant = {r.variant: r for r in pa.rows}
        for variant, vals in pa.values.items():
            r = by_variant.get(variant)
            paired = dict(zip(r.seeds, r.diffs)) if r is not None else {}
            order = list(r.seeds) if r is not None else []  # the interval's order first
            order += sorted((b for b in vals if b not in paired), key=order_key)
            for b in order:
                out.append({"scope": pa.scope, "metric": pa.metric, "axis": pa.axis, "variant": norm_value(variant),
                            "baseline": variant == pa.baseline, "block": _block(b, blocks), "value": vals[b],
                            "baseline_value": base.get(b, math.nan), "diff": paired.get(b, math.nan),
                            "paired": b in paired, "resample_seed": resample_seed,
                            **(extra(pa.scope, variant, b) if extra else {})})
    return out
