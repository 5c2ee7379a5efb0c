"""The MLflow names of downstream evaluation, shared by the evaluator that writes them
(``orchestrator.evaluation.record``) and the report that reads them (``orchestrator.report.evaluation``).

- metrics ``eval/<task>/<metric>`` and ``eval/<task>/<metric>_stderr`` (the harness's standard
  error), logged at step 0 like the other end-of-trial scalars;
- tag ``eval/primary``: JSON ``{task: [metric, higher_is_better], ...}`` in evaluation order, the
  metric of each task that the report's tables use;
- tag ``eval/<task>/config``: what decided the task's score besides the model (shots, limit,
  context, generation budget, the task's version; ``EvalSettings.task_key``): a task whose tag
  holds the same key is not evaluated again;
- tag ``eval/settings``: a hash of a sweep's ``eval:`` block and the checkpoint's step, set once a
  trial's evaluation under it is complete (the sweep does not dispatch it again);
- artifacts under ``eval/``: the harness's results JSON of each evaluation.
"""
from __future__ import annotations

METRIC_PREFIX = "eval/"
PRIMARY_TAG = "eval/primary"
SETTINGS_TAG = "eval/settings"
ARTIFACT_DIR = "eval"
STDERR_SUFFIX = "_stderr"


def config_tag(task: str) -> str:
    return f"{METRIC_PREFIX}{task}/config"


def metric_key(task: str, metric: str) -> str:
    return f"{METRIC_PREFIX}{task}/{metric}"
