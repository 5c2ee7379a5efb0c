"""The data-source registry: a source is a function DataConfig -> data object, plus an optional
cheap ``check`` run before any data is read. ``make_batches`` is the trainer's only entry point.

The corpus sources live in ``corpus.py``, the synthetic tasks in ``tasks.py``; importing
``orchestrator.engine.data`` registers both. A new source is one function with
``@register_source("name", check=...)`` in a module that the package imports, and its name in
``orchestrator.engine.trial_config.DATA_SOURCES`` (so configs can be validated without loading data).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.engine.trial_config import DataConfig

IGNORE = -100  # target id of masked positions (synthetic prompts, padding)
SOURCES: dict[str, Callable[[DataConfig], Any]] = {}
CHECKS: dict[str, Callable[[DataConfig], None]] = {}


def register_source(name: str, check: Callable[[DataConfig], None] | None = None):
    def deco(fn):
        SOURCES[name] = fn
        if check is not None:
            CHECKS[name] = check
        return fn

    return deco


def check_source(cfg: DataConfig) -> None:
    """Cheap checks before any compute: the source exists, its files exist, its options fit."""
    if cfg.source not in SOURCES:
        raise ConfigError(f"data.source: unknown source {cfg.source!r}; allowed: {', '.join(SOURCES)}")
    check = CHECKS.get(cfg.source)
    if check is not None:
        check(cfg)


def make_batches(cfg: DataConfig):
    """The data object of a trial (the interface is described in ``corpus.py``)."""
    check_source(cfg)
    return SOURCES[cfg.source](cfg)
