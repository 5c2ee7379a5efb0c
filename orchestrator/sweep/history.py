"""A sweep's history in its MLflow record: the seeds and waves it grew by, and which of its trials
are done. The record is the one store; ``lime_sweep.json`` (``orchestrator.sweep.local_state``)
only caches it, and Ray's experiment folders only say what Ray has queued.

- ``record_launch``: what a launch adds to the parent run once tracking is open: the first
  launch's seeds (``sweep.base_seeds``), one param per seed extension (``sweep.seeds.extend-<k>``:
  its seeds; ``sweep.values.extend-<k>``: a wave's compared axis and values), the seeds in effect
  as tags, and the resolved sweep with every seed.
- ``from_record``: the same history read back from the parent run whose trials are the file's
  (apart from its seeds), in the shape of the cache: what ``orchestrator.sweep.extend.prepare``
  plans from when ``lime_sweep.json`` is gone.
- ``reconcile``: Ray's saved trial states with the record: a trial whose run finished is done
  whatever Ray saved (its folder may be gone); used by the resume (``extend.tuners``), ``finish``
  and ``lime sweep status``.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.core import outbox, record
from orchestrator.core.record import cast_param
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, missing_store
from orchestrator.sweep.files import resolved_yaml
from orchestrator.sweep.mlflow_runs import RAY_DONE
from orchestrator.sweep.schema import SweepSpec

EXT_PREFIX = "extend-"


def fmt_seeds(seeds: list) -> str:
    return ", ".join(str(s) for s in seeds)


def _seeds(text: str | None) -> list | None:
    if text is None:
        return None
    return [cast_param(s) for s in text.split(",") if s.strip()]


def extensions(params: dict[str, str]) -> list[dict]:
    """The seed extensions a parent's params record, in order: [{name, seeds[, axis, values]}]."""
    out = []
    for key, text in params.items():
        name = key[len(record.SEED_EXTENSION):]
        if not (key.startswith(record.SEED_EXTENSION) and name.startswith(EXT_PREFIX)
                and name[len(EXT_PREFIX):].isdigit()):
            continue
        ext: dict[str, Any] = {"name": name, "seeds": _seeds(text)}
        wave = params.get(record.SEED_VALUES + name)
        if wave is not None:
            ext.update(json.loads(wave))
        out.append(ext)
    return sorted(out, key=lambda e: int(e["name"][len(EXT_PREFIX):]))


def base_seeds(params: dict[str, str], tags: dict[str, str]) -> list | None:
    """The first launch's seeds: recorded, else (a parent of an older version that grew) the seeds
    in effect less the extensions' seeds; None when the record does not say."""
    recorded = _seeds(params.get(record.BASE_SEEDS))
    if recorded is not None:
        return recorded
    grown = {s for e in extensions(params) for s in e["seeds"]}
    in_effect = _seeds(record.ParentTags.of(tags).seeds)
    return [s for s in in_effect if s not in grown] if grown and in_effect else None


def from_record(spec: SweepSpec, uri: str) -> dict:
    """The history of ``spec``'s sweep from its parent run in the record, shaped as the cache
    (``lime_sweep.json``); {} when the store, the experiment or such a parent is not there. Reads
    only: a local store that does not exist is not created."""
    if missing_store(uri) is not None:
        return {}
    cl = outbox.PatientClient(client(uri))  # a server away is waited for, then one line, as the driver's
    exp = cl.get_experiment_by_name(spec.name)
    if exp is None:
        return {}
    runs = cl.search_runs([exp.experiment_id], f"tags.{record.ROLE} = '{record.PARENT}'", max_results=50,
                          order_by=["attributes.start_time DESC"])
    for run in runs:
        state = _state_of(spec, run.data.params, run.data.tags)
        if state is not None:
            return {**state, "name": spec.name, "parent_run_id": run.info.run_id, "tracking_uri": uri,
                    "experiment_id": exp.experiment_id,
                    "launches": int(record.ParentTags.of(run.data.tags).launches or 0)}
    return {}


def _state_of(spec: SweepSpec, params: dict[str, str], tags: dict[str, str]) -> dict | None:
    """The cache's keys for a parent whose first launch ran ``spec``'s trials with some seeds;
    None for another sweep's parent (other trials)."""
    fp = params.get(record.FINGERPRINT)
    axis = spec.seed_axis() if spec.search is None else None
    if axis is None:
        return {"fingerprint": fp} if fp == spec.fingerprint() else None
    base = base_seeds(params, tags)
    file_seeds = list(spec.grid[axis])
    candidates = [base] if base is not None else [file_seeds[:k] for k in range(len(file_seeds), 0, -1)]
    seeds = next((c for c in candidates if c and spec.with_seeds(c).fingerprint() == fp), None)
    if seeds is None:
        return None
    exts = extensions(params)
    return {"fingerprint": fp, "base_seeds": seeds, "base_fingerprint": fp, "extensions": exts,
            "seeds": seeds + [s for e in exts for s in e["seeds"]]}


def record_launch(cl, parent: str, launch) -> None:
    """The launch's seeds on the parent run (``launch``: ``orchestrator.sweep.extend.Launch``):
    params for what is new (a param cannot change), and after a growth the seeds and trial count
    in effect as tags and the resolved sweep with every seed (what ran)."""
    from mlflow.entities import Param

    spec, parts = launch.spec, launch.parts
    if parts[0].seeds is None:  # no seed axis: nothing can grow
        return
    want = {record.BASE_SEEDS: fmt_seeds(parts[0].seeds)}
    for p in parts[1:]:
        want[record.SEED_EXTENSION + p.name] = fmt_seeds(p.seeds)
        if p.values is not None:
            want[record.SEED_VALUES + p.name] = json.dumps({"axis": p.axis, "values": list(p.values)})
    have = cl.get_run(parent).data.params
    new = [Param(k, v) for k, v in want.items() if k not in have]
    if new:
        cl.log_batch(parent, params=new)
    if len(parts) == 1:
        return
    axis = spec.seed_axis()
    record.ParentTags(seeds=fmt_seeds(spec.grid[axis]), n_trials=str(spec.n_trials())).write(cl, parent)
    if any(q.key.startswith(record.SEED_EXTENSION) for q in new) and spec.resolved:
        resolved = dict(spec.resolved)
        resolved["grid"] = {**(resolved.get("grid") or {}), axis: list(spec.grid[axis])}
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / f"{spec.name}.resolved.yaml"
            path.write_text(f"# {spec.name}: the sweep file with its extends chain applied and the seeds in effect "
                            "(what ran)\n" + resolved_yaml(resolved))
            cl.log_artifact(parent, str(path), "sweep")


def done_trials(runs) -> set[str]:
    """The trial ids whose run in the record is done (finished or diverged): never trained again."""
    out = set()
    for run in runs:
        try:
            if TrialStatus(run.data.tags.get(record.STATUS)).done:
                out.add(run.data.tags.get(record.TRIAL_ID, ""))
        except ValueError:
            continue
    return out


def reconcile(saved: dict[str, str], done: set[str] | frozenset) -> dict[str, str]:
    """Trial id -> Ray state: Ray's saved states (``saved``) corrected by the record (``done``: the
    trial ids whose runs finished, ``done_trials``): a trial done in the record is ``TERMINATED``
    whatever Ray saved or lost; the others keep Ray's state (absent: neither queued nor done)."""
    return {**saved, **dict.fromkeys(done, RAY_DONE)}
