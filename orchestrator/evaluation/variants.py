"""The gold answer's loss of a multiple-choice task: ``<task>_bpb``.

Accuracy of a small model on a multiple-choice task is a coarse, noisy number (an example is
right or wrong); the log-likelihood the model gives the gold answer moves smoothly with
training and ranks small models far more reliably (bits per byte: OLMo's downstream evaluator,
"perplexity/bits-per-byte rank small models more reliably than accuracy"). The variant reads the
same requests as its task (the log-likelihood of every choice after the same few-shot context)
and scores only the gold choice:

- ``bpb``: its negative log-likelihood in bits per UTF-8 byte of the text scored (the target
  delimiter and the choice, `` four`` after ``Answer:``), ``-ll / (ln 2 * bytes)`` (lower is
  better), averaged over examples;
- ``nll``: its negative log-likelihood in nats (lower is better), averaged over examples.

Both are means over examples, so the harness gives them its standard error of a mean. Bytes,
not tokens, make ``bpb`` comparable across tokenizers (a byte model and a GPT-2 model).
"""
from __future__ import annotations

import math

from orchestrator.evaluation.suites import gold_variant

METRICS = ("bpb", "nll")


def gold_index(task, doc) -> int | None:
    """The gold choice's index as the harness reads it (an index, a choice's text, or the first
    of several gold answers); None when it is not among the choices."""
    choices = task.doc_to_choice(doc)
    gold = task.doc_to_text(doc) if getattr(task, "multiple_input", False) else task.doc_to_target(doc)
    if isinstance(gold, list):
        gold = gold[0] if gold else None
    if isinstance(gold, str):
        gold = choices.index(gold) if gold in choices else (int(gold) if gold.strip().isdigit() else None)
    return gold if isinstance(gold, int) and 0 <= gold < len(choices) else None


def gold_loss(task, doc, results) -> dict[str, float]:
    """``process_results`` of the variant: ``results`` are the (log-likelihood, is-greedy) pairs
    of the choices, in the task's choice order."""
    g = gold_index(task, doc)
    if g is None:
        return {"bpb": math.nan, "nll": math.nan}
    ll = float(results[g][0])
    # the scored text is the target delimiter and the choice (" four" after "Answer:")
    text = (task.config.target_delimiter or "") + task.doc_to_choice(doc)[g]
    n_bytes = max(1, len(text.encode("utf-8")))
    return {"bpb": -ll / (math.log(2) * n_bytes), "nll": -ll}


def gold_loss_task(task):
    """The ``<task>_bpb`` variant of a built multiple-choice task (a new task object with the same
    data, prompts and few-shot settings)."""
    from lm_eval.api.task import ConfigurableTask

    cfg = task.config.to_dict(keep_callable=True)
    for key in ("tag", "group", "group_alias", "task_alias"):
        cfg.pop(key, None)
    cfg["task"] = gold_variant(task.config.task)
    cfg["metric_list"] = [{"metric": m, "aggregation": "mean", "higher_is_better": False} for m in METRICS]
    scorer = _GoldLoss()  # a process_results at construction: the metrics are then not looked up by name
    cfg["process_results"] = scorer
    variant = ConfigurableTask(config=cfg)
    scorer.task = variant
    return variant


class _GoldLoss:
    """``gold_loss`` bound to the variant task once it exists."""

    task = None

    def __call__(self, doc, results) -> dict[str, float]:
        return gold_loss(self.task, doc, results)
