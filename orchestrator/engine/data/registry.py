"""The data-source registry: a source is a function DataConfig -> data object, plus an optional
cheap ``check`` run before any data is read. ``make_batches`` is the trainer's only entry point.

The corpus sources live in ``corpus.py``, the synthetic tasks in ``tasks.py``; importing
``orchestrator.engine.data`` registers both. A new source is one function with
``@register_source("name", check=...)`` in a module that the package imports, and its name in
``orchestrator.engine.trial_config.CORPUS_SOURCES``: ``SOURCES`` is that module's registry, whose names
are declared there (so configs are validated without loading data) and which refuses a function
under any other name.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.engine.trial_config import SOURCES, DataConfig

IGNORE = -100  # target id of masked positions (synthetic prompts, padding)
CHECKS: dict[str, Callable[[DataConfig], None]] = {}


def register_source(name: str, check: Callable[[DataConfig], None] | None = None):
    """Decorator: ``fn(DataConfig) -> data object`` is the source ``name`` (a declared name,
    ``orchestrator.engine.trial_config.SOURCES``); ``check`` runs before any data is read."""
    def deco(fn: Callable[[DataConfig], Any]):
        SOURCES.add(name, fn)
        if check is not None:
            CHECKS[name] = check
        return fn

    return deco


def check_source(cfg: DataConfig) -> None:
    """Cheap checks before any compute: the source exists, its files exist, its options fit."""
    SOURCES.lookup(cfg.source)
    check = CHECKS.get(cfg.source)
    if check is not None:
        check(cfg)


def make_batches(cfg: DataConfig):
    """The data object of a trial (the interface is described in ``corpus.py``)."""
    check_source(cfg)
    return SOURCES[cfg.source](cfg)
