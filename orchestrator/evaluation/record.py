"""An evaluation's results on a trial's MLflow run (the names: ``orchestrator.core.eval_names``).

The run is usually finished already: metrics, tags and artifacts are added to it without
touching its status. Metrics are logged at step 0 (an end-of-trial scalar, as ``final/*``); the
``eval/primary`` tag merges with what an earlier evaluation of other tasks wrote, so a run
evaluated in two goes has one table of tasks. Each task's per-document results go to
``eval/items/<task>.json`` (``orchestrator.core.eval_items``; a task evaluated again under a new
key replaces its file).
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core import eval_items as per_item
from orchestrator.core import eval_names as names
from orchestrator.core.tracking import client

if TYPE_CHECKING:
    from orchestrator.evaluation.harness import Outcome


def done_keys(run) -> dict[str, str]:
    """task -> the key its score was computed under, from a run's ``eval/<task>/config`` tags; a
    task without its ``eval/<task>/items`` tag was scored before per-document results were logged
    and is left out (evaluated again, to the same scores, for them)."""
    out = {}
    tags = run.data.tags
    for k, v in tags.items():
        if k.startswith(names.METRIC_PREFIX) and k.endswith("/config"):
            task = k[len(names.METRIC_PREFIX):-len("/config")]
            if names.items_tag(task) in tags:
                out[task] = v
    return out


def log_outcome(run_id: str, outcome: Outcome, *, settings_tag: str | None = None, cl=None) -> None:
    """Metrics, tags, the harness's JSON and the per-document results of ``outcome`` on the run ``run_id``."""
    from mlflow.entities import Metric, RunTag

    cl = cl or client()
    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(v), ts, 0) for k, v in sorted(outcome.metrics().items())]
    for i in range(0, len(metrics), 500):
        cl.log_batch(run_id, metrics=metrics[i:i + 500])
    run = cl.get_run(run_id)
    primary = json.loads(run.data.tags.get(names.PRIMARY_TAG) or "{}")
    primary.update({t: [m, hib] for t, (m, hib) in outcome.primary.items()})
    tags = [RunTag(names.config_tag(t), k) for t, k in outcome.keys.items()]
    tags += [RunTag(names.items_tag(t), str(len(outcome.items.get(t, {}).get("doc_id", [])))) for t in outcome.keys]
    tags.append(RunTag(names.PRIMARY_TAG, json.dumps(primary)))
    if settings_tag:
        tags.append(RunTag(names.SETTINGS_TAG, settings_tag))
    cl.log_batch(run_id, tags=tags)
    if outcome.harness:
        digest = hashlib.sha256(json.dumps(sorted(outcome.keys.items())).encode()).hexdigest()[:10]
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / f"harness_results_{digest}.json"
            p.write_text(json.dumps(outcome.harness, indent=1, sort_keys=True))
            cl.log_artifact(run_id, str(p), names.ARTIFACT_DIR)
    if outcome.items:
        with tempfile.TemporaryDirectory() as d:
            for task, table in outcome.items.items():
                (Path(d) / names.items_file(task)).write_text(per_item.dumps(table))
            cl.log_artifacts(run_id, d, names.ITEMS_DIR)


def mark_complete(run_id: str, settings_tag: str, cl=None) -> None:
    """Nothing left to evaluate under these settings (every task skipped as already scored)."""
    (cl or client()).set_tag(run_id, names.SETTINGS_TAG, settings_tag)
