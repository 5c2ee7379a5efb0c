"""Router kinds: one module per kind (``identity``, ``mean``, ``linear``, ``same_head``,
``per_dim``), the shared base and registry (``base``), and what the buffered kinds share
(``buffered``). A router declares its kind by name (``kind = KindName("linear")``,
``lime_arch.router_base``); building a router loads every kind (``load``). What a new kind
implements: ``base``'s docstring.

This package's ``__init__`` imports nothing heavy: a router's kind name is checked against the
module names without loading torch."""
from __future__ import annotations

import functools
import importlib
import pkgutil


@functools.cache
def load():
    """Import every module of this package (each kind module registers its kind) and return the
    kind registry, ``base.ROUTER_KINDS`` (in module-name order: identity, linear, mean, ...)."""
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")
    return importlib.import_module(f"{__name__}.base").ROUTER_KINDS
