"""Data sources of the training engine: corpora (builtin, text, hf) and synthetic tasks.

Importing the package registers every source's loader; ``make_batches(DataConfig)`` builds one.
The sources' names and cheap checks are declared torch-free in ``orchestrator.engine.sources``.
"""
from orchestrator.engine.data import corpus, tasks  # noqa: F401  (registers the sources)
from orchestrator.engine.data.registry import IGNORE, SOURCES, check_source, make_batches, register_source

__all__ = ["IGNORE", "SOURCES", "check_source", "make_batches", "register_source"]
