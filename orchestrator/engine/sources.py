"""The data sources, declared torch-free: every source's name and its cheap check.

A config is validated against this module alone, before any data module (torch, tokenizers,
datasets) is imported: ``lime sweep run`` and ``lime train`` refuse a bad ``data`` section in a
fraction of a second. A source is declared here by its check, ``@corpus_source("name")`` on a
function ``DataConfig -> None`` that raises a one-line ``ConfigError`` (files exist, options fit;
nothing is read or downloaded); its loader, ``@register_source("name")`` in
``orchestrator/engine/data/``, may only use a declared name. Synthetic tasks are declared by the
task registry (``orchestrator.tasks.TASKS``): the source name is the task name, the check builds
the task from ``data.task`` without generating anything.

``SOURCES`` is the one table of names (a registry with declared names, corpora first, then the
tasks), into which the data modules register the loader of each name.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lime_arch.errors import ConfigError
from lime_arch.specs import Registry
from orchestrator.engine import datafiles
from orchestrator.engine.taskspec import build_task
from orchestrator.tasks import TASKS

CORPUS_TOKENIZERS = ("byte", "bpe")
CHECKS: dict[str, Callable[[Any], None]] = {}  # source name -> its cheap check of a DataConfig


def corpus_source(name: str):
    """Decorator: declare the corpus source ``name``, checked by the decorated function."""
    def deco(check: Callable[[Any], None]) -> Callable[[Any], None]:
        if name in CHECKS:
            raise ValueError(f"source {name!r} is declared already")
        CHECKS[name] = check
        return check

    return deco


def expand_paths(paths: list[str]) -> list[str]:
    """The files ``data.paths`` names (globs expanded, ``~`` too), in order, each non-empty UTF-8
    text (``orchestrator.engine.datafiles``); one line per miss."""
    return datafiles.expand(paths)


def _check_tokenizer(cfg) -> None:
    if cfg.tokenizer not in CORPUS_TOKENIZERS:
        raise ConfigError(f"data.tokenizer: {cfg.tokenizer!r} is not one of {', '.join(CORPUS_TOKENIZERS)}")


@corpus_source("builtin")
def _check_builtin(cfg) -> None:
    _check_tokenizer(cfg)


@corpus_source("text")
def _check_text(cfg) -> None:
    _check_tokenizer(cfg)
    if not cfg.paths:
        raise ConfigError("data.paths: the text source needs at least one file or glob")
    expand_paths(cfg.paths)


@corpus_source("hf")
def _check_hf(cfg) -> None:
    if os.path.sep in cfg.hf_name and not os.path.isdir(cfg.hf_name) and cfg.hf_name.startswith((".", "/", "~")):
        raise ConfigError(f"data.hf_name: local dataset folder {cfg.hf_name!r} does not exist")


CORPUS_SOURCES = tuple(CHECKS)  # the corpora (loaded by orchestrator.engine.data.corpus)
SOURCES = Registry("source", key="data.source", declared=(*CORPUS_SOURCES, *TASKS))
DATA_SOURCES = SOURCES.declared


def check_source(cfg) -> None:
    """Cheap checks of a DataConfig before any compute: the source exists, its files exist, its
    options (or task parameters) fit. Imports nothing heavy."""
    SOURCES.require(cfg.source)  # "data.source: unknown source ...; allowed: ..."
    if cfg.source in CHECKS:
        CHECKS[cfg.source](cfg)
    else:  # a synthetic task
        build_task(cfg.source, cfg)
