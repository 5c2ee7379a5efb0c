"""The MLflow names of downstream evaluation, shared by the evaluator that writes them
(``orchestrator.evaluation.record``) and the report that reads them (``orchestrator.report.evaluation``).

- metrics ``eval/<task>/<metric>`` and ``eval/<task>/<metric>_stderr`` (the harness's standard
  error), logged at step 0 like the other end-of-trial scalars;
- tag ``eval/primary``: JSON ``{task: [metric, higher_is_better], ...}`` in evaluation order, the
  metric of each task that the report's tables use;
- tag ``eval/<task>/config``: what decided the task's score besides the model (shots, limit,
  context, generation budget, the task's version; ``EvalSettings.task_key``): a task whose tag
  holds the same key is not evaluated again;
- tag ``eval/<task>/items``: how many documents have per-document results in the task's
  ``eval/items/<task>.json`` ("0": the task's per-document values are no scalars); a task
  without it was scored before per-document results were logged and is evaluated again;
- tag ``eval/settings``: a hash of a sweep's ``eval:`` block and the checkpoint's step, set once a
  trial's evaluation under it is complete (the sweep does not dispatch it again);
- artifacts under ``eval/``: the harness's results JSON of each evaluation; under ``eval/items/``
  one ``<task>.json`` per task with its per-document results (``orchestrator.core.eval_items``).
"""
from __future__ import annotations

METRIC_PREFIX = "eval/"
PRIMARY_TAG = "eval/primary"
SETTINGS_TAG = "eval/settings"
ARTIFACT_DIR = "eval"
ITEMS_DIR = "eval/items"
STDERR_SUFFIX = "_stderr"


def config_tag(task: str) -> str:
    return f"{METRIC_PREFIX}{task}/config"


def items_tag(task: str) -> str:
    return f"{METRIC_PREFIX}{task}/items"


def metric_key(task: str, metric: str) -> str:
    return f"{METRIC_PREFIX}{task}/{metric}"


def items_file(task: str) -> str:
    """The file name of a task's per-document results under ``ITEMS_DIR``."""
    return f"{task}.json"
