"""Data sources of the training engine: corpora (builtin, text, hf) and synthetic tasks.

Importing the package registers every source; ``make_batches(DataConfig)`` builds one.
"""
from orchestrator.engine.data import corpus, tasks  # noqa: F401  (registers the sources)
from orchestrator.engine.data.registry import IGNORE, SOURCES, check_source, make_batches, register_source

__all__ = ["IGNORE", "SOURCES", "check_source", "make_batches", "register_source"]
