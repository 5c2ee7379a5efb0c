"""One evaluation: a model, its tokenizer and ``EvalSettings`` -> the harness's scores.

``evaluate`` resolves and checks the tasks (``orchestrator.evaluation.checks``; nothing has run
yet when that fails), builds them with their shots, adds the gold-loss variant of every
multiple-choice task (``gold_loss``), skips the tasks whose key says they were scored already
(``skip``: a run's ``eval/<task>/config`` tags), and runs ``lm_eval.simple_evaluate`` on
``LimeLM`` with fixed seeds (the harness's defaults: the same few-shot examples every time).

What comes back (``Outcome``): per task every metric the harness reports with its standard
error, named ``eval/<task>/<metric>`` (a metric of a task with several answer filters, such as
GSM8K's strict and flexible extraction, is ``<metric>_<filter>``), the task's primary metric (its
first, the one the report's tables use) and direction, its shots and key, the harness's
results as JSON (without the per-example samples), and per task the per-document results
(``items``: ``orchestrator.core.eval_items``, what a report pairs document by document).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core import eval_items as per_item
from orchestrator.core import eval_names
from orchestrator.evaluation.adapter import LimeLM
from orchestrator.evaluation.checks import Resolved, resolve
from orchestrator.evaluation.settings import EvalSettings
from orchestrator.evaluation.variants import gold_loss_task

BOOTSTRAP_ITERS = 1000  # the harness's bootstrap of non-mean metrics (f1, mcc); seeded by the harness
QUIET = ("lm_eval", "lm-eval", "datasets", "evaluate", "transformers", "accelerate")


@dataclass
class Score:
    task: str
    metric: str
    value: float
    stderr: float
    higher_is_better: bool


@dataclass
class Outcome:
    scores: list[Score] = field(default_factory=list)
    primary: dict[str, tuple[str, bool]] = field(default_factory=dict)  # task -> (metric, higher is better)
    shots: dict[str, int] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # task -> what decided its score (settings.task_key)
    skipped: list[str] = field(default_factory=list)  # scored before with the same key
    harness: dict[str, Any] = field(default_factory=dict)  # the harness's results (JSON-able)
    requests: dict[str, int] = field(default_factory=dict)  # what the adapter answered
    items: dict[str, dict] = field(default_factory=dict)  # task -> per-document results (``core.eval_items``)

    def metrics(self) -> dict[str, float]:
        """``eval/<task>/<metric>`` and ``eval/<task>/<metric>_stderr`` (finite values only)."""
        out = {}
        for s in self.scores:
            for name, v in ((s.metric, s.value), (s.metric + "_stderr", s.stderr)):
                if isinstance(v, float) and math.isfinite(v):
                    out[eval_names.metric_key(s.task, name)] = v
        return out


def quiet() -> None:
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def build_tasks(resolved: Resolved, settings: EvalSettings) -> dict[str, Any]:
    """Task objects by name, in plan order, shots set; the gold-loss variants of the
    multiple-choice ones (``gold_loss``) after their task."""
    out: dict[str, Any] = {}
    for name, shots, variant_only in resolved.tasks:
        for leaf_name, task in resolved.manager.load([name])["tasks"].items():
            if shots is not None:
                task.set_config(key="num_fewshot", value=shots)
            elif task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)
            mc = task.get_config("output_type") == "multiple_choice"
            if not variant_only:
                out.setdefault(leaf_name, task)
            if mc and (settings.gold_loss or variant_only):
                variant = gold_loss_task(task)
                out.setdefault(variant.config.task, variant)
    return out


def evaluate(model, tokenizer, settings: EvalSettings, *, skip: dict[str, str] | None = None,
             resolved: Resolved | None = None, key: str = "eval") -> Outcome:
    """Score a model (eval mode, on its device) on the settings' tasks (see the module)."""
    from lm_eval import simple_evaluate

    quiet()
    resolved = resolved or resolve(settings, key)
    tasks = build_tasks(resolved, settings)
    outcome = Outcome()
    todo = []
    for name, task in tasks.items():
        shots = int(task.get_config("num_fewshot") or 0)
        k = settings.task_key(name, shots, getattr(task, "VERSION", None))
        if skip and skip.get(name) == k:
            outcome.skipped.append(name)
            continue
        outcome.keys[name], outcome.shots[name] = k, shots
        todo.append(task)
    if not todo:
        return outcome
    lm = LimeLM(model, tokenizer, batch_size=settings.batch_size, max_length=settings.max_length,
                max_gen_toks=settings.max_gen_toks)
    res = simple_evaluate(model=lm, tasks=todo, limit=settings.limit, task_manager=resolved.manager,
                          log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS)
    outcome.harness = json_safe(res)
    # the per-document results, kept small (the samples themselves hold every document and response)
    outcome.items = per_item.from_samples(res.get("samples") or {}, outcome.keys)
    outcome.requests = dict(lm.stats)
    for name in outcome.keys:
        _scores(name, res["results"].get(name, {}), res.get("higher_is_better", {}).get(name, {}), outcome)
    return outcome


def _scores(task: str, results: dict, better: dict, outcome: Outcome) -> None:
    """The metrics of one task from the harness's ``"metric,filter"`` keys."""
    values: dict[tuple[str, str], float] = {}
    errors: dict[tuple[str, str], float] = {}
    for k, v in results.items():
        if "," not in k:
            continue
        metric, flt = k.split(",", 1)
        target = errors if metric.endswith("_stderr") else values
        target[(metric.removesuffix("_stderr"), flt)] = _number(v)
    filters = {f for _, f in values}
    for (metric, flt), v in values.items():
        name = metric if flt == "none" or len(filters) == 1 else f"{metric}_{flt}"
        hib = bool(better.get(metric, True))
        outcome.scores.append(Score(task, name, v, errors.get((metric, flt), math.nan), hib))
        if task not in outcome.primary and math.isfinite(v):
            outcome.primary[task] = (name, hib)


def _number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan  # the harness writes "N/A" for a standard error it did not compute


def json_safe(res: dict) -> dict:
    """The harness's results as plain JSON (its own serializer for functions and numpy values)."""
    from lm_eval.utils import handle_non_serializable

    slim = {k: v for k, v in res.items() if k != "samples"}
    return json.loads(json.dumps(slim, default=handle_non_serializable))
