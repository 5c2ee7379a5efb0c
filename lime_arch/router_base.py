"""The router declaration and the router registry, torch-free (the registered routers are in
``lime_arch.routers``, which re-exports everything here; import from there).

A router class is a *declaration*: its name, its kind's name, its typed arguments and
``sources(l)`` (which buffered slots layer l reads: sorted, unique, always including l). That is
all a config check needs, so ``lime_arch.ModelConfig`` validates ``model.router`` without
importing torch. Building a router (``build_router``, or calling the class) makes its
implementation, the class mixed with the torch base ``lime_arch.router_module.RouterModule``
(``lime_arch.specs.Declared``): an ``nn.Module`` that is also an instance of the router class,
with one parameter per layer l >= 1 (``weights[l - 1]``) for the learned kinds, and answering
  ``weight(l)``   exactly the operand the mixer multiplies, in the layout of the router's
                  ``kind``, or None where nothing is multiplied (layer 0 and the parameter-free
                  kinds). The mixers use nothing else: a router that computes its weight (a
                  softmax over a parameter, say) overrides ``weight`` in its class (importing
                  torch inside the method) and routes correctly without telling anyone;
  ``dense(l)``    the same mixing as a dense (R, (l+1)*R) matrix ((R, (l+1)*R, Hd) per-dim), zeros
                  outside the sources: for analysis, plots and the concatenation reference.
A router of a prunable kind may carry top-p pruning masks (``router.prune``, ``lime_arch.prune``):
the mixers then run ``executed()``, a view with the kept sources and the masked weights.

A router declares its kind by name, ``kind = KindName("linear")``: a kind is one module of
``lime_arch.routing.kinds`` named after it, and reading ``Router.kind`` loads the kinds (torch)
and gives the registered ``RouterKind`` (a router may also name a ``RouterKind`` object itself).
The registry is a ``lime_arch.specs.SpecRegistry``: spec strings ``name`` or ``name-4-8``, every
argument required, typed and positive.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from lime_arch.errors import ConfigError
from lime_arch.specs import NAME, Declared, RequiredArg, SpecRegistry, spec_string

KINDS_PACKAGE = "lime_arch.routing.kinds"


class RouterArg(RequiredArg):
    """One typed argument of a router family (``RouterArg("j")``, ``RouterArg("scale", float, 0.5)``).
    Values are positive; ``example`` is the value used in error messages and by ``router_specs()``."""


class KindName:
    """A router kind by name, what a router class declares (``kind = KindName("linear")``).

    Torch-free: the name is checked against the kind modules (one per kind, ``same-head`` is
    ``same_head.py``) without importing them, so a typo fails when the router is declared. Read
    from a class (``FullRouter.kind``), it is the registered ``RouterKind``: the kinds load then."""

    def __init__(self, name: str):
        module = f"{KINDS_PACKAGE}.{name.replace('-', '_')}" if isinstance(name, str) and NAME.fullmatch(name) else None
        if module is None or importlib.util.find_spec(module) is None:
            raise ValueError(f"router kind {name!r}: no module {KINDS_PACKAGE}.<name> (one module per kind)")
        self.name = name

    def __repr__(self) -> str:
        return f"KindName({self.name!r})"

    def __get__(self, obj: Any, owner: type | None = None):
        return self.resolve()

    def resolve(self):
        """The registered ``RouterKind`` of this name (imports every kind module)."""
        kinds = importlib.import_module(KINDS_PACKAGE).load()
        if self.name not in kinds:
            raise TypeError(f"router kind {self.name!r}: its module registers no kind of that name")
        return kinds[self.name]


class Router(Declared):
    """Base class of the router declarations (see the module docstring). A subclass sets ``kind``,
    overrides ``sources`` and declares ``arguments``; the torch side is ``RouterModule``'s."""

    implementation = "lime_arch.router_module:RouterModule"
    name: ClassVar[str]
    kind: ClassVar[Any]  # a KindName (or a RouterKind); checked at registration
    arguments: ClassVar[tuple[RouterArg, ...]] = ()
    # the arguments counted in layers (first-<j>'s j): at most model.n_layers, where a larger value
    # routes exactly as the largest one does and the spec would say what the model cannot do
    depth_args: ClassVar[tuple[str, ...]] = ()

    @property
    def spec(self) -> str:
        return spec_string(self.name, self.arg_values)

    def sources(self, l: int) -> list[int]:
        return list(range(l + 1))


# the kinds whose weights top-p pruning applies to (``RouterKind.prunable``; ``lime_arch.prune``),
# by name so a config check reads them without torch (tests/lime_arch/test_prune.py keeps the two equal)
PRUNABLE_KINDS = frozenset({"linear"})


def kind_name(router_cls: type) -> str:
    """The name of a router class's kind, read torch-free (the ``KindName`` it declares)."""
    k = inspect.getattr_static(router_cls, "kind")
    return k.name


def check_router(spec: str, *, n_layers: int, key: str = "model.router") -> type[Router]:
    """Parse ``spec`` and check its layer-counted arguments against the model's depth (ConfigError,
    one line naming ``key`` and the allowed range); the router class."""
    cls, args = parse_router(spec)
    for name, value in zip((a.name for a in cls.arguments), args):
        if name in cls.depth_args and isinstance(n_layers, int) and value > n_layers:
            raise ConfigError(f"{key}: {spec!r}: {name} {value:g} is beyond the model's depth; allowed: 1 to "
                              f"{n_layers} (model.n_layers)")
    return cls


def check_prunable(router_cls: type, key: str = "model.router_prune") -> None:
    """A ConfigError unless the router's kind can be pruned (a learned kind with ``prunable``)."""
    kind = kind_name(router_cls)
    if kind not in PRUNABLE_KINDS:
        raise ConfigError(f"{key}: router {router_cls.name!r} (kind {kind}) cannot be pruned; "
                          "prunable: routers of kind linear (full, first-<j>, last-<j>, dilated-<d>)")


# set on every router instance by RouterModule; an argument of the same name would overwrite one
_RESERVED = frozenset({"name", "n_layers", "R", "head_dim", "init", "arg_values", "weights", "training", "kind",
                       "declaration", "learned", "prune", "options", "d_model"})


def _check_kind(name: str, cls: type) -> None:
    kind = inspect.getattr_static(cls, "kind", None)  # the declaration itself: nothing is loaded
    if isinstance(kind, KindName):
        return
    base = sys.modules.get(f"{KINDS_PACKAGE}.base")  # a RouterKind object: the kinds are loaded already
    if base is not None and isinstance(kind, base.RouterKind) and base.ROUTER_KINDS.get(kind.name) is kind:
        return
    kinds = importlib.import_module(KINDS_PACKAGE).load()  # a bug in the class: list the kinds
    raise TypeError(f"router {name!r}: kind must be one of the registered router kinds "
                    f"({', '.join(kinds)}), got {kind!r}")


ROUTERS = SpecRegistry("router", key="model.router", base=Router, arg_class=RouterArg, reserved=_RESERVED,
                       check=_check_kind)


def register_router(name: str):
    """Class decorator: add a ``Router`` subclass to ``ROUTERS`` under ``name``, after checking its
    name, ``kind`` and ``arguments`` (a TypeError or ValueError here is a bug in the class)."""
    return ROUTERS.register(name)


def router_specs(example_args: Sequence[int | float] | None = None) -> list[str]:
    """Every registered router as a spec string, in registration order. A parameter-free router
    appears once; a family once per value in ``example_args`` (that value for each of its
    arguments), or once with its arguments' declared examples when ``example_args`` is None."""
    return ROUTERS.specs(example_args)


def parse_router(spec: str) -> tuple[type[Router], tuple[int | float, ...]]:
    """'first-4' -> (FirstRouter, (4,)). Unknown names or bad arguments raise ConfigError."""
    return ROUTERS.parse(spec)


def build_router(spec: str, *, n_layers: int, n_kv_heads: int, head_dim: int, init: str = "paper",
                 options: Any = None, d_model: int | None = None) -> Router:
    """The router module of ``spec`` (torch loads here). ``options``: its kind's typed options (the
    dynamic kind's ``DynamicRouting``, ``model.router_dynamic``; None: the kind's defaults);
    ``d_model``: the model width, which a kind reading the hidden state needs."""
    cls, args = parse_router(spec)
    return cls(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, args=args, init=init,
               options=options, d_model=d_model)
