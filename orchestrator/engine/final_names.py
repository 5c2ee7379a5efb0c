"""The names of the end-of-trial metrics (``final/...``) a trial logs, in one place: the engine
logs them under these names (``Trainer.final_metrics``, ``CostHook``, ``RouterPruneHook``, the
task sources' ``evaluate``), and a sweep file is checked against them (``trial_finals``), so a
report or a margin naming a metric that no trial of the sweep will log is refused with the file,
before any work, rather than at report time. Torch-free.
"""
from __future__ import annotations

from orchestrator.core.record import FINAL_VAL_LOSS, FINAL_VAL_LOSS_SE

FINAL, VAL = "final/", "val/"
VAL_PPL = "final/val_ppl"
LOSS = (FINAL_VAL_LOSS, FINAL_VAL_LOSS_SE, VAL_PPL)  # every finished trial (Trainer.final_metrics)
STEP_TIME, TRAIN_MEM = "final/step_time_ms", "final/train_mem_mb"  # CostHook: the trial's cost
COST = (STEP_TIME, TRAIN_MEM)
PRUNED, ROUTER_WEIGHTS = "final/pruned_weights", "final/router_weights"  # RouterPruneHook: the paper's Table 5
PRUNED_FRACTION, SKIPPED = "final/pruned_fraction", "final/skipped_sources"
PRUNE = (PRUNED, ROUTER_WEIGHTS, PRUNED_FRACTION, SKIPPED)  # with model.router_prune
# a synthetic task source's held-out scores (orchestrator.engine.data.tasks), logged as val/... and
# again as final/...: the exact-match accuracy, per group of examples (arithmetic: ops<k>), and the
# fraction of generations without an extractable answer
TASK_ACCURACY, TASK_MALFORMED = "val/accuracy", "val/malformed"


def task_group(group: str) -> str:
    """``val/accuracy_<group>`` ("" : the accuracy over every example)."""
    return TASK_ACCURACY if group == "" else f"{TASK_ACCURACY}_{group}"


def final_of(key: str) -> str:
    """A task source's ``val/<x>`` as the final metric ``final/<x>``."""
    return FINAL + key.split("/", 1)[1]


def trial_finals(cfg, tasks) -> tuple[set[str], tuple[str, ...]]:
    """(the final metrics a finished trial of ``cfg`` logs, prefixes of the ones whose names its
    data decide); ``tasks``: the names of the synthetic task sources (``orchestrator.tasks.TASKS``)."""
    names, prefixes = set(LOSS) | set(COST), ()
    if cfg.model_config().router_prune is not None:
        names |= set(PRUNE)
    if cfg.data.source in tasks:
        names |= {final_of(TASK_ACCURACY), final_of(TASK_MALFORMED)}
        prefixes = (final_of(task_group("")) + "_",)
    return names, prefixes
