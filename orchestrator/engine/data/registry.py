"""The data-source loaders: a source is a function DataConfig -> data object; ``make_batches``
is the trainer's only entry point.

Which sources exist and their cheap checks are declared torch-free in
``orchestrator.engine.sources`` (configs are validated there without importing this package);
here each declared name gets its loader. The corpus loaders live in ``corpus.py``, the synthetic
tasks in ``tasks.py``; importing ``orchestrator.engine.data`` registers both. A new source is its
check with ``@corpus_source("name")`` in ``orchestrator/engine/sources.py`` and its loader with
``@register_source("name")`` in a module that this package imports: ``SOURCES`` refuses a loader
under an undeclared name.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.engine.sources import SOURCES, check_source
from orchestrator.engine.trial_config import DataConfig

IGNORE = -100  # target id of masked positions (synthetic prompts, padding)


def register_source(name: str):
    """Decorator: ``fn(DataConfig) -> data object`` is the loader of the source ``name`` (a
    declared name, ``orchestrator.engine.sources.SOURCES``)."""
    def deco(fn: Callable[[DataConfig], Any]):
        SOURCES.add(name, fn)
        return fn

    return deco


def make_batches(cfg: DataConfig):
    """The data object of a trial (the interface is described in ``corpus.py``)."""
    check_source(cfg)
    return SOURCES.lookup(cfg.source)(cfg)
