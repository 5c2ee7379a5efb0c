"""Synthetic reasoning tasks of the paper (arXiv 2502.09245): ``arithmetic`` (step-by-step reduction of
integer expressions), ``prosqa`` (path finding over "Every X is a Y." facts) and ``kv-recall``.

``make_task(name, **params)`` builds one; ``task.generate(split, n, seed)`` draws deterministic
examples whose prompts never occur in two splits; ``task.encode`` gives ids and the target-only
loss mask; ``task.score`` exact-matches the answer extracted from a generation. See ``base`` for
the shared conventions and each task module for its format.
"""
from orchestrator.tasks import arithmetic, kv_recall, prosqa  # noqa: F401  (imported to register the tasks)
from orchestrator.tasks.arithmetic import ArithmeticTask, reduce_expression
from orchestrator.tasks.base import SPLITS, TASKS, CharVocab, Example, Task, make_task, register_task, split_of
from orchestrator.tasks.kv_recall import KVRecallTask
from orchestrator.tasks.prosqa import ProsQATask

__all__ = [
    "SPLITS", "TASKS", "ArithmeticTask", "CharVocab", "Example", "KVRecallTask", "ProsQATask", "Task",
    "make_task", "reduce_expression", "register_task", "split_of",
]
