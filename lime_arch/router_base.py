"""The router base class and the router registry (the registered routers are in
``lime_arch.routers``, which re-exports everything here; import from there).

A router owns the coefficients of every layer and answers three questions:
  ``sources(l)``  which buffered slots layer l reads (sorted, unique, always including l);
  ``weight(l)``   exactly the operand the mixer multiplies, in the layout of the router's
                  ``kind``, or None where nothing is multiplied (layer 0 and the parameter-free
                  kinds). The mixers use nothing else: a router that computes its weight (a
                  softmax over a parameter, say) routes correctly without telling anyone; when
                  ``weight(l)`` returns a parameter itself, the mixer memoises views of it, when it
                  returns a computed tensor, autograd flows through it;
  ``dense(l)``    the same mixing as a dense (R, (l+1)*R) matrix ((R, (l+1)*R, Hd) per-dim), zeros
                  outside the sources: for analysis, plots and the concatenation reference.
A router of a prunable kind may carry top-p pruning masks (``router.prune``, ``lime_arch.prune``):
the mixers then run ``executed()``, a view with the kept sources and the masked weights.

Everything that depends on the kind (the operand's shape and init, ``dense``, the MACs the
accounting counts, the mixer) is the kind object's (``lime_arch.routing.kinds``); this class asks
it. The registry is a ``lime_arch.specs.SpecRegistry``: spec strings ``name`` or ``name-4-8``, every
argument required, typed and positive.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from lime_arch import prune as _prune
from lime_arch.routing.kinds.base import ROUTER_KINDS, RouterKind
from lime_arch.specs import RequiredArg, SpecRegistry, spec_string


class RouterArg(RequiredArg):
    """One typed argument of a router family (``RouterArg("j")``, ``RouterArg("scale", float, 0.5)``).
    Values are positive; ``example`` is the value used in error messages and by ``router_specs()``."""


# set on every router class or instance; an argument of the same name would overwrite one of them
_RESERVED = frozenset({"name", "n_layers", "R", "head_dim", "init", "arg_values", "weights", "training", "prune"})


class Router(nn.Module):
    """Base class: learned kinds get one parameter per layer l >= 1 (``weights[l - 1]``) shaped like
    the operand of their kind, and ``weight(l)`` returns it. A subclass may compute its weight
    from any parameters instead (override ``weight``, and ``weight_shape``/``_init_weight`` for
    parameters of another shape); ``weight(l)`` must keep the operand layout of ``kind``."""

    name: ClassVar[str]
    kind: ClassVar[RouterKind]  # declared by every registered class; checked at registration
    arguments: ClassVar[tuple[RouterArg, ...]] = ()

    def __init__(self, *, n_layers: int, n_kv_heads: int, head_dim: int, args: Sequence[int | float] = (),
                 init: str):
        super().__init__()
        if len(args) != len(self.arguments):
            raise ValueError(f"router {self.name}: takes {len(self.arguments)} arguments, got {tuple(args)}")
        self.n_layers, self.R, self.head_dim, self.init = n_layers, n_kv_heads, head_dim, init
        self.arg_values = tuple(args)
        for a, v in zip(self.arguments, args):
            setattr(self, a.name, v)
        self.weights = nn.ParameterList(
            [nn.Parameter(self._init_weight(l)) for l in range(1, n_layers)] if self.kind.learned else []
        )

    @property
    def spec(self) -> str:
        return spec_string(self.name, self.arg_values)

    @property
    def learned(self) -> bool:
        return self.kind.learned

    # -- what each router defines -------------------------------------------------------------
    def sources(self, l: int) -> list[int]:
        return list(range(l + 1))

    def operand_shape(self, l: int) -> tuple[int, ...] | None:
        """The shape of ``weight(l)`` for a learned kind, e.g. (R, |S|*R), (R, |S|) or (R, |S|*R, Hd)."""
        return self.kind.operand_shape(self, l)

    def weight_shape(self, l: int) -> tuple[int, ...]:
        """The shape of layer l's parameter (by default the operand itself)."""
        return self.operand_shape(l)

    def _init_weight(self, l: int) -> torch.Tensor:
        """Layer l's initial parameter: the kind's (the paper's U(-b, b) and identity on the
        current slot; ``identity`` init: exactly the baseline at step 0)."""
        return self.kind.init_weight(self, l)

    def weight(self, l: int) -> torch.Tensor | None:
        """The operand the mixer multiplies for layer l, shaped ``operand_shape(l)``."""
        if l == 0 or not self.kind.learned:
            return None
        return self.weights[l - 1]

    def dense(self, l: int) -> torch.Tensor:
        """Dense (R, (l+1)*R) equivalent (per-dim: (R, (l+1)*R, Hd)), zeros outside the sources (and,
        while pruned, zeros where the mask prunes)."""
        return self.kind.dense(self.executed(), l)

    def executed(self):
        """What the mixers run: this router, or while top-p pruning masks are set its pruned view
        (``lime_arch.prune.PrunedRouter``: the kept sources only, the masked weights)."""
        return _prune.executed(self)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def macs_per_token(self, l: int) -> int:
        """Multiply-accumulates per token of routing K and V at layer l."""
        return self.kind.macs_per_token(self, l)


def _check_kind(name: str, cls: type) -> None:
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, RouterKind) or ROUTER_KINDS.get(kind.name) is not kind:
        raise TypeError(f"router {name!r}: kind must be one of the registered router kinds "
                        f"({', '.join(ROUTER_KINDS)}), got {kind!r}")


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


def build_router(spec: str, *, n_layers: int, n_kv_heads: int, head_dim: int, init: str = "paper") -> Router:
    cls, args = parse_router(spec)
    return cls(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, args=args, init=init)
