"""What a downstream evaluation runs: ``EvalSettings``, the sweep file's ``eval:`` block and the
flags of ``lime eval`` alike. Torch-free and harness-free (sweep files are validated with it).

- ``tasks``: harness task names and suite names (``orchestrator.evaluation.suites``), in order.
- ``num_fewshot``: the shots of every task (default: the suite's, else the task's own).
- ``limit``: at most this many examples per task (an integer), or this fraction of them (a
  number in (0, 1)), as the harness's ``--limit``; default: all.
- ``batch_size``: sequences per forward pass.
- ``include``: folders of harness task YAML files (local task definitions, ``dataset_path: json``
  with ``dataset_kwargs: {data_files: ...}``), searched before the harness's own tasks.
- ``gold_loss``: also score every multiple-choice task by its gold answer's bits per byte and
  loss (``<task>_bpb``, ``orchestrator.evaluation.variants``).
- ``max_length``: the context in tokens (default: the model's ``max_seq_len``); longer requests
  are truncated from the left, as the harness expects.
- ``max_gen_toks``: the generation budget of a generative task that sets none.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, field
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator
from pydantic.dataclasses import dataclass

from orchestrator.core.eval_items import FORMAT as ITEMS_FORMAT
from orchestrator.core.validation import CONFIG, Bool, FieldError, Int, Str, validate
from orchestrator.evaluation import suites


def _limit(v: Any) -> Any:
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be an integer >= 1 (examples per task) or a fraction in (0, 1), got {v!r}")
    if isinstance(v, int) and v >= 1:
        return v
    if isinstance(v, float) and 0 < v < 1:
        return v
    raise ValueError(f"must be an integer >= 1 (examples per task) or a fraction in (0, 1), got {v!r}")


@dataclass(kw_only=True, config=CONFIG)
class EvalSettings:
    tasks: Annotated[list[Str], Field(strict=True, description="a non-empty list of task or suite names")]
    num_fewshot: Annotated[Int, Field(ge=0)] | None = None
    limit: Annotated[Any, BeforeValidator(_limit)] = None
    batch_size: Annotated[Int, Field(ge=1)] = 16
    include: Annotated[list[Str], Field(strict=True)] = field(default_factory=list)
    gold_loss: Bool = True
    max_length: Annotated[Int, Field(ge=2)] | None = None
    max_gen_toks: Annotated[Int, Field(ge=1)] = 256

    @field_validator("tasks")
    @classmethod
    def _names(cls, tasks: list[str]) -> list[str]:
        if not tasks:
            raise ValueError(f"a non-empty list of task or suite names; suites: {', '.join(suites.SUITES)}")
        for i, name in enumerate(tasks):
            if not suites.is_task_name(name):
                raise FieldError(f"{name!r} is not a task or suite name (letters, digits, '_', '-', '.'); "
                                 f"suites: {', '.join(suites.SUITES)}", at=f"[{i}]")
        return tasks

    def plan(self) -> list[tuple[str, int | None]]:
        """``(task, shots)`` of every task, suites expanded (``suites.plan``)."""
        return suites.plan(self.tasks, self.num_fewshot)

    def task_key(self, task: str, shots: int, version: Any) -> str:
        """What decides a task's score besides the model: its shots, the limit, the context, the
        generation budget and the task's version. A run whose tag holds this key for the task has
        its score already (a resumed or retried trial is not evaluated again)."""
        blob = json.dumps({"task": task, "shots": shots, "limit": self.limit, "max_length": self.max_length,
                           "max_gen_toks": self.max_gen_toks, "version": str(version)}, sort_keys=True)
        return f"{shots}-shot,limit={self.limit},{hashlib.sha256(blob.encode()).hexdigest()[:10]}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings_hash(settings: EvalSettings, step: int) -> str:
    """The ``eval/settings`` tag of a trial evaluated completely under ``settings`` at ``step``
    (``items``: the per-document results' format; trials evaluated before them are evaluated again)."""
    blob = json.dumps({"settings": settings.to_dict(), "step": int(step), "items": ITEMS_FORMAT}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def eval_settings(data: Any, key: str = "eval") -> EvalSettings:
    """``EvalSettings`` from a mapping, or a ConfigError naming ``key`` and the field."""
    return validate(EvalSettings, data, prefix=f"{key}." if key else "", top=key or "eval")
