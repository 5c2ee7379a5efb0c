"""The metrics a sweep file names (``report.metric``, ``search.metric``, the metrics of
``report.margin`` and ``decide.margin``) against the ones its trials will log, which the file
says: the engine's final metrics for each trial's data and model
(``orchestrator.engine.final_names``) and ``eval/<task>/<metric>`` for the tasks of its ``eval:``
block. A ``final/`` or ``eval/`` name that no trial will log is one ConfigError line with the file,
before any work (it used to fail only at report time). The per-step namespaces (``val/``,
``train/``, ``analysis/``, ...) are not checked by name.
"""
from __future__ import annotations

from orchestrator.core.eval_names import METRIC_PREFIX
from orchestrator.decide.verdict import parse_margins
from orchestrator.engine.final_names import FINAL, trial_finals
from orchestrator.evaluation.suites import gold_variant
from orchestrator.tasks import TASKS


def named(spec) -> list[tuple[str, str]]:
    """(where, metric) of every metric the file names, the report's first."""
    out = [("report.metric", spec.report.metric)]
    if spec.search is not None:
        out.append(("search.metric", spec.search.metric))
    for where, text in (("report.margin", spec.report.margin),
                        ("decide.margin", spec.decide.margin if spec.decide is not None else None)):
        out += [(where, m) for m in parse_margins(text, where) if m is not None]
    return out


def unknown(spec, configs) -> tuple[str, str] | None:
    """(where, why) of the first metric the file names that no trial of ``configs`` (the sweep's
    TrialConfigs) will log; None when every one may be logged."""
    finals: set[str] = set()
    prefixes: set[str] = set()
    for cfg in configs:
        names, pre = trial_finals(cfg, TASKS)
        finals |= names
        prefixes |= set(pre)
    for where, metric in named(spec):
        text = problem(metric, finals, prefixes, spec.eval)
        if text:
            return where, text
    return None


def problem(metric: str, finals: set[str], prefixes: set[str], ev) -> str | None:
    """Why no trial will log ``metric`` (None: one may)."""
    evals = ("eval metrics: eval/<task>/<metric> for the tasks of its eval: block" if ev is not None else
             "eval metrics: none (no eval: block)")
    if metric.startswith(FINAL):
        if metric in finals or any(metric.startswith(p) for p in prefixes):
            return None
        listed = sorted(finals) + [p + "<group>" for p in sorted(prefixes)]
        return f"{metric!r} is not a metric this sweep's trials log; final metrics: {', '.join(listed)}; {evals}"
    if not metric.startswith(METRIC_PREFIX):
        return None
    task = metric[len(METRIC_PREFIX):].split("/", 1)[0]
    if ev is None:
        return f"{metric!r} needs an eval: block with the task {task!r}; this sweep evaluates no downstream task"
    planned = [t for t, _ in ev.plan()]
    names = set(planned) | ({gold_variant(t) for t in planned} if ev.gold_loss else set())
    if task in names or any(task.startswith(t + "_") for t in planned):  # a harness group's subtasks: <group>_<x>
        return None
    return f"{metric!r}: task {task!r} is not evaluated; the eval: block's tasks: {', '.join(planned)}"
