"""The paper's downstream task suites by name, and the task definitions this project generates.

A suite is a list of harness task names and the few-shot count the paper used. ``plan`` expands
the names a user gives (suites and task names, in order, each task once) into ``(task, shots)``
pairs. Torch-free and harness-free: sweep files are checked with it without importing either.

The paper's tables (arXiv 2502.09245) and how their tasks map onto the harness's definitions:

- ``paper-table-1`` (Table 1, 1B GQA, LM Evaluation Harness, 3-shot): MultiRC, WiC, QNLI, ARC-E,
  ARC-C are the harness's ``multirc``, ``wic``, ``qnli``, ``arc_easy``, ``arc_challenge``. KV and
  Induction are no harness tasks: ``lime_kv`` and ``lime_induction`` are this project's own
  definitions (``orchestrator.evaluation.localtasks``; the paper does not publish its prompts).
- ``paper-glue`` (Table 7, GLUE and SuperGLUE, 3-shot): ``copa``, ``multirc``, ``wic``, ``qnli``,
  ``wnli``.
- ``paper-qa`` (Table 8, QA, 3-shot): ``arc_easy``, ``arc_challenge``, ``hellaswag``,
  ``openbookqa``.
- ``paper-360m`` (Table 6, the matched 360M comparison): the paper used LightEval (SmolLM2's
  suite, nine tasks) and names ARC-C, CSQA, HellaSwag and GSM8K among them; here the harness's
  ``arc_challenge``, ``commonsense_qa``, ``hellaswag`` and ``gsm8k`` at their own shot counts
  (0, and 5 for GSM8K). Where the definitions differ: LightEval scores ARC and HellaSwag as cloze
  (the answer text ranked by its length-normalised log-likelihood; the harness reports ``acc``
  and ``acc_norm``, the suite's table uses ``acc``), scores CommonsenseQA as cloze over the answer
  texts (the harness's ``commonsense_qa`` ranks the letters A-E after listing the options, a
  format small models are near chance on), and its GSM8K prompt and answer extraction differ (the
  harness: 5-shot "Question: ... Answer:", exact match after ``#### ``, strict and flexible).
  The other five LightEval tasks are not named by the paper and are left out.
- ``lime-local``: the generated tasks only (KV, Induction and a multiple-choice cloze of the
  built-in corpus); no hub, so CPU sweeps and tests evaluate offline.
"""
from __future__ import annotations

from dataclasses import dataclass

from lime_arch.errors import ConfigError

# Task definitions this project generates (orchestrator.evaluation.localtasks), by harness name
KV, INDUCTION, CLOZE = "lime_kv", "lime_induction", "lime_pydoc_cloze"
LOCAL_TASKS = (KV, INDUCTION, CLOZE)
# The gold answer's bits per byte and loss of a multiple-choice task (orchestrator.evaluation.variants)
GOLD_SUFFIX = "_bpb"


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str
    tasks: tuple[str, ...]
    num_fewshot: int | None  # the paper's shots (None: each task's own default)
    source: str  # where in the paper


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} registered twice")
    SUITES[suite.name] = suite
    return suite


register_suite(Suite(name="paper-table-1", tasks=("multirc", "wic", "qnli", "arc_easy", "arc_challenge", KV, INDUCTION),
                     num_fewshot=3, source="Table 1 (1B GQA, LM Evaluation Harness, 3-shot)"))
register_suite(Suite(name="paper-glue", tasks=("copa", "multirc", "wic", "qnli", "wnli"), num_fewshot=3,
                     source="Table 7 (GLUE and SuperGLUE, 3-shot)"))
register_suite(Suite(name="paper-qa", tasks=("arc_easy", "arc_challenge", "hellaswag", "openbookqa"), num_fewshot=3,
                     source="Table 8 (QA, 3-shot)"))
register_suite(Suite(name="paper-360m", tasks=("arc_challenge", "commonsense_qa", "hellaswag", "gsm8k"),
                     num_fewshot=None, source="Table 6 (the 360M comparison; the paper used LightEval)"))
register_suite(Suite(name="lime-local", tasks=(KV, INDUCTION, CLOZE), num_fewshot=None,
                     source="this project's generated tasks (no hub)"))


def is_task_name(name: str) -> bool:
    """A name the harness could know: letters, digits and ``_ - .`` (no paths, no spaces)."""
    return bool(name) and all(c.isalnum() or c in "_-." for c in name)


def plan(names: tuple[str, ...] | list[str], num_fewshot: int | None = None,
         key: str = "tasks") -> list[tuple[str, int | None]]:
    """``(task, shots)`` in the order given, each task once (its first mention wins); suites expand
    to their tasks at the suite's shot count; ``num_fewshot`` overrides every count (None keeps
    the suite's, else the task's own default). ConfigError naming ``key`` for a bad name."""
    if isinstance(names, str) or not names:
        raise ConfigError(f"{key}: a non-empty list of task or suite names; suites: {', '.join(SUITES)}")
    out: dict[str, int | None] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or not is_task_name(name):
            raise ConfigError(f"{key}[{i}]: {name!r} is not a task or suite name (letters, digits, '_', '-', '.'); "
                              f"suites: {', '.join(SUITES)}")
        suite = SUITES.get(name)
        for task in (suite.tasks if suite else (name,)):
            shots = num_fewshot if num_fewshot is not None else (suite.num_fewshot if suite else None)
            out.setdefault(task, shots)
    return list(out.items())


def gold_variant(task: str) -> str:
    """The name of a multiple-choice task's gold-answer loss variant (``arc_easy_bpb``)."""
    return task + GOLD_SUFFIX


def base_of_variant(name: str) -> str | None:
    """``arc_easy_bpb`` -> ``arc_easy``; None for a name that is no variant's."""
    return name[: -len(GOLD_SUFFIX)] if name.endswith(GOLD_SUFFIX) and len(name) > len(GOLD_SUFFIX) else None
