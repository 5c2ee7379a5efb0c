"""Per-item results of an evaluation: what each scored document got, per task, so that a report
can pair two models document by document (``orchestrator.report.eval_items``).

The harness is run with ``log_samples=True``; its samples (a dict per document and answer
filter, with the document, the model's responses and the per-document metric values) are reduced
here to one small table per task:

- ``doc_id``: the document's index in the task's scored split (the harness's ``doc_id``);
- ``doc_hash``: the first 12 hex digits of the harness's hash of the document, so a reader can
  check that two runs scored the same documents under the same index;
- ``metrics``: per metric, the per-document value (0/1 for ``acc`` and ``exact_match``, the gold
  answer's bits per byte for ``<task>_bpb``), named as the run's ``eval/<task>/<metric>``
  metrics are (``<metric>_<filter>`` when a task has several answer filters). Only scalar values
  are kept: a metric whose per-document value is a tuple (f1, mcc, the weighted perplexities)
  has no per-document score and is left out;
- ``key``: the task's ``eval/<task>/config`` key, so a file is read only with the scores it
  belongs to.

The file is ``eval/items/<task>.json`` on the trial's run (written by ``orchestrator.evaluation.record``),
a few kilobytes for 200 documents: the run is the one store of a trial's evaluation. Torch-free
and harness-free (the report reads these files).
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from lime_arch.errors import ConfigError

FORMAT = 1
HASH_CHARS = 12


def _scalar(v: Any) -> float | None:
    """A per-document value as a float; None for a tuple or anything else that is no number."""
    if isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)):
        return float(v)
    return None


def from_samples(samples: dict[str, list[dict]], keys: dict[str, str]) -> dict[str, dict]:
    """task -> its per-item table, for the tasks of ``keys`` (task -> its config key) that have
    samples. Documents in ``doc_id`` order; a metric with a non-scalar value on any document is
    left out."""
    out = {}
    for task, key in keys.items():
        rows = samples.get(task) or []
        if not rows:
            continue
        filters = {r.get("filter", "none") for r in rows}
        docs: dict[int, dict[str, Any]] = {}
        hashes: dict[int, str] = {}
        dropped: set[str] = set()
        for r in rows:
            flt = r.get("filter", "none")
            doc = int(r["doc_id"])
            hashes.setdefault(doc, str(r.get("doc_hash", ""))[:HASH_CHARS])
            for metric in r.get("metrics", []):
                name = metric if flt == "none" or len(filters) == 1 else f"{metric}_{flt}"
                v = _scalar(r.get(metric))
                if v is None:
                    dropped.add(name)
                docs.setdefault(doc, {})[name] = v
        ids = sorted(docs)
        names = sorted({n for d in docs.values() for n in d} - dropped)
        if not names:
            continue
        out[task] = {"format": FORMAT, "task": task, "key": key, "doc_id": ids,
                     "doc_hash": [hashes[i] for i in ids],
                     "metrics": {n: [_compact(docs[i].get(n)) for i in ids] for n in names}}
    return out


def _compact(v: float | None) -> float | int | None:
    """0/1 as integers (the files stay small), NaN as null (JSON has no NaN)."""
    if v is None or not math.isfinite(v):
        return None
    return int(v) if v == int(v) and abs(v) < 2**53 else v


def dumps(table: dict) -> str:
    return json.dumps(table, separators=(",", ":"), sort_keys=True)


def loads(text: str, where: str = "items") -> dict:
    """A per-item table from its JSON, checked: ConfigError naming ``where`` and the field."""
    try:
        t = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: a JSON object of per-item results, got {type(t).__name__}")
    for field in ("task", "key", "doc_id", "doc_hash", "metrics"):
        if field not in t:
            raise ConfigError(f"{where}.{field}: missing")
    n = len(t["doc_id"])
    if len(t["doc_hash"]) != n:
        raise ConfigError(f"{where}.doc_hash: {len(t['doc_hash'])} hashes for {n} documents")
    if not isinstance(t["metrics"], dict):
        raise ConfigError(f"{where}.metrics: a mapping metric -> per-document values")
    for name, values in t["metrics"].items():
        if not isinstance(values, list) or len(values) != n:
            raise ConfigError(f"{where}.metrics.{name}: {n} per-document values expected")
    return t


def values(table: dict, metric: str) -> dict[tuple[int, str], float]:
    """(doc_id, doc_hash) -> the metric's value (NaN for a document without one); {} when the
    table has no such metric."""
    col = table["metrics"].get(metric)
    if col is None:
        return {}
    return {(int(i), str(h)): (math.nan if v is None else float(v))
            for i, h, v in zip(table["doc_id"], table["doc_hash"], col)}
