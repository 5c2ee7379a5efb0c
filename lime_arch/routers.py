"""The router registry: how each layer's attention mixes the buffered K/V heads of layers 0..l.

A router owns the coefficients of every layer and answers three questions:
  ``sources(l)``  which buffered slots layer l reads (sorted, unique, always including l);
  ``weight(l)``   exactly the operand the mixer multiplies, in the layout of the router's
                  ``kind`` (see ``RouterKind``), or None where nothing is multiplied (layer 0 and
                  the parameter-free kinds). The mixers use nothing else: a router that computes
                  its weight (a softmax over a parameter, say) routes correctly without telling
                  anyone; when ``weight(l)`` returns a parameter itself, the mixer memoises views
                  of it, when it returns a computed tensor, autograd flows through it;
  ``dense(l)``    the same mixing as a dense (R, (l+1)*R) matrix ((R, (l+1)*R, Hd) per-dim), zeros
                  outside the sources: for analysis, plots and the concatenation reference.

Semantics (0-based layers, R = number of KV heads; the paper's Eq. 4, arXiv 2502.09245):
  routed_l[h] = sum_{s in S_l, h'} dense_l[h, s*R + h'] * KV_s[h']    (the same weights for K and V)
Layer 0 never has parameters: it reads its own K/V.

Adding a router is one class and one ``@register_router(name)`` line: the class declares its
``kind`` (a ``RouterKind``), its ``sources`` and, for a family such as ``first-<int>``, its typed
``arguments`` (any number, written after the name: ``first-4``, ``name-2-8``; each is set on the
instance under its name). Registration checks all of that, so a mistake fails at import, not at
forward time. How the mixing is executed is the mixers' business (``lime_arch.routing``), chosen
from ``kind`` alone; the decoder and the trainer never branch on router names. See
docs/ARCHITECTURE.md, "Routing internals".
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import torch
from torch import nn

from lime_arch.errors import ConfigError


class RouterKind(str, Enum):
    """What a router's ``weight(l)`` is; it decides the mixer and the operand's layout."""

    IDENTITY = "identity"  # no mixing: layer l reads its own K/V; no weights
    MEAN = "mean"  # the fixed uniform average of the sources; no weights
    LINEAR = "linear"  # learned (R, |S_l|*R): routed head h mixes every head of every source
    SAME_HEAD = "same-head"  # learned (R, |S_l|): routed head h reads head h of every source
    PER_DIM = "per-dim"  # learned (R, |S_l|*R, Hd): an Hd-vector per (routed head, source head)

    @property
    def learned(self) -> bool:
        return self in (RouterKind.LINEAR, RouterKind.SAME_HEAD, RouterKind.PER_DIM)


@dataclass(frozen=True)
class RouterArg:
    """One typed argument of a router family. Values are positive; ``example`` is the value used
    in error messages and by ``router_specs()``."""

    name: str
    type: type = int  # int or float
    example: int | float = 4


_TOKEN = {int: r"(\d+)", float: r"(\d+(?:\.\d+)?)"}
_TYPE_WORD = {int: "integer", float: "number"}
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*")  # no all-digit part: those are arguments
# set on every router class or instance; an argument of the same name would overwrite one of them
_RESERVED = frozenset({"name", "n_layers", "R", "head_dim", "init", "arg_values", "weights", "training"})

ROUTERS: dict[str, type[Router]] = {}


def register_router(name: str):
    """Class decorator: add a ``Router`` subclass to ``ROUTERS`` under ``name``, after checking its
    name, ``kind`` and ``arguments`` (a TypeError or ValueError here is a bug in the class)."""

    def deco(cls: type[Router]) -> type[Router]:
        _check_router_class(name, cls)
        cls.name = name
        ROUTERS[name] = cls
        return cls

    return deco


def _check_router_class(name: str, cls: type) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"router name {name!r}: lowercase words joined by '-', none of them all digits")
    if name in ROUTERS:
        raise ValueError(f"router name {name!r} is registered already (by {ROUTERS[name].__qualname__})")
    if not (isinstance(cls, type) and issubclass(cls, Router)):
        raise TypeError(f"router {name!r}: {cls!r} is not a subclass of Router")
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, RouterKind):
        allowed = ", ".join(f"RouterKind.{k.name}" for k in RouterKind)
        raise TypeError(f"router {name!r}: kind must be one of {allowed}, got {kind!r}")
    args = cls.arguments
    if not isinstance(args, tuple) or not all(isinstance(a, RouterArg) for a in args):
        raise TypeError(f"router {name!r}: arguments must be a tuple of RouterArg, got {args!r}")
    seen: set[str] = set()
    for a in args:
        if not a.name.isidentifier() or a.name in seen or a.name in _RESERVED or hasattr(cls, a.name):
            raise ValueError(f"router {name!r}: argument name {a.name!r} is not a free identifier")
        if a.type not in _TOKEN:
            raise TypeError(f"router {name!r}: argument {a.name!r} has type {a.type!r}; allowed: int, float")
        if type(a.example) is not a.type or not a.example > 0:
            raise ValueError(f"router {name!r}: argument {a.name!r} needs a positive {a.type.__name__} example")
        seen.add(a.name)


def _signature(cls: type[Router]) -> str:
    return "-".join([cls.name, *(f"<{a.type.__name__}>" for a in cls.arguments)])


def _registered() -> str:
    return ", ".join(_signature(c) for c in ROUTERS.values())


def _spec(name: str, values: Sequence[int | float]) -> str:
    return "-".join([name, *(str(v) for v in values)])


def router_specs(example_args: Sequence[int | float] | None = None) -> list[str]:
    """Every registered router as a spec string, in registration order. A parameter-free router
    appears once; a family once per value in ``example_args`` (that value for each of its
    arguments), or once with its arguments' declared examples when ``example_args`` is None."""
    out = []
    for name, cls in ROUTERS.items():
        if not cls.arguments:
            out.append(name)
        elif example_args is None:
            out.append(_spec(name, [a.example for a in cls.arguments]))
        else:
            out.extend(_spec(name, [a.type(v) for a in cls.arguments]) for v in example_args)
    return out


def _parse_args(spec: str, cls: type[Router]) -> tuple[int | float, ...] | None:
    """The argument values of ``spec`` for the family ``cls``, or None if ``spec`` is not one of its."""
    pattern = "".join("-" + _TOKEN[a.type] for a in cls.arguments)
    m = re.fullmatch(re.escape(cls.name) + pattern, spec)
    if m is None:
        return None
    values = tuple(a.type(g) for a, g in zip(cls.arguments, m.groups()))
    for a, v in zip(cls.arguments, values):
        if not v > 0:
            where = "after '-'" if len(cls.arguments) == 1 else f"for {a.name}"
            raise ConfigError(f"model.router: {spec!r} needs a positive {_TYPE_WORD[a.type]} {where}, got {v}")
    return values


def parse_router(spec: str) -> tuple[type[Router], tuple[int | float, ...]]:
    """'first-4' -> (FirstRouter, (4,)). Unknown names or bad arguments raise ConfigError."""
    if not isinstance(spec, str):
        raise ConfigError(f"model.router: must be a string, got {spec!r}; registered: {_registered()}")
    cls = ROUTERS.get(spec)
    if cls is not None and not cls.arguments:
        return cls, ()
    for family in ROUTERS.values():
        if family.arguments and spec.startswith(family.name + "-"):
            values = _parse_args(spec, family)
            if values is not None:
                return family, values
    if cls is not None:
        args = cls.arguments
        what = {int: "an integer", float: "a number"}[args[0].type] if len(args) == 1 \
            else f"{len(args)} arguments ({'-'.join(f'<{a.name}>' for a in args)})"
        raise ConfigError(f"model.router: {spec!r} needs {what}, e.g. {_spec(spec, [a.example for a in args])}")
    raise ConfigError(f"model.router: unknown router {spec!r}; registered: {_registered()}")


def build_router(spec: str, *, n_layers: int, n_kv_heads: int, head_dim: int, init: str = "paper") -> Router:
    cls, args = parse_router(spec)
    return cls(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, args=args, init=init)


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
        return _spec(self.name, self.arg_values)

    @property
    def learned(self) -> bool:
        return self.kind.learned

    # -- what each router defines -------------------------------------------------------------
    def sources(self, l: int) -> list[int]:
        return list(range(l + 1))

    def operand_shape(self, l: int) -> tuple[int, ...]:
        """The shape of ``weight(l)`` for a learned kind: (R, |S|*R), (R, |S|) or (R, |S|*R, Hd)."""
        n, R = len(self.sources(l)), self.R
        if self.kind is RouterKind.SAME_HEAD:
            return (R, n)
        if self.kind is RouterKind.PER_DIM:
            return (R, n * R, self.head_dim)
        return (R, n * R)

    def weight_shape(self, l: int) -> tuple[int, ...]:
        """The shape of layer l's parameter (by default the operand itself)."""
        return self.operand_shape(l)

    def _init_weight(self, l: int) -> torch.Tensor:
        """The paper's init (arXiv 2502.09245): U(-b, b), b = sqrt(3 / fan_in), then identity on
        the current slot. ``identity`` init zeroes the rest, so step 0 is exactly the baseline."""
        shape = self.weight_shape(l)
        b = math.sqrt(3.0 / shape[1])
        w = torch.empty(shape).uniform_(-b, b) if self.init == "paper" else torch.zeros(shape)
        cur = self.sources(l).index(l)
        if self.kind is RouterKind.SAME_HEAD:  # one column per slot (same head index)
            w[:, cur] = 1.0
        else:
            eye = torch.eye(self.R)
            w[:, cur * self.R:(cur + 1) * self.R] = eye if w.dim() == 2 else eye[..., None]
        return w

    def weight(self, l: int) -> torch.Tensor | None:
        """The operand the mixer multiplies for layer l, shaped ``operand_shape(l)``."""
        if l == 0 or not self.kind.learned:
            return None
        return self.weights[l - 1]

    def dense(self, l: int) -> torch.Tensor:
        """Dense (R, (l+1)*R) equivalent (per-dim: (R, (l+1)*R, Hd)), zeros outside the sources."""
        R = self.R
        w = self.weight(l)
        if w is not None:
            if self.kind is RouterKind.SAME_HEAD:  # (R, |S|) -> block-diagonal (R, |S|*R)
                eye = torch.eye(R, dtype=w.dtype, device=w.device)
                w = (w[:, :, None] * eye[:, None, :]).reshape(R, -1)
            out = w.new_zeros((R, (l + 1) * R) + tuple(w.shape[2:]))
            for i, s in enumerate(self.sources(l)):
                out[:, s * R:(s + 1) * R] = w[:, i * R:(i + 1) * R]
            return out
        # parameter-free: the uniform average of its sources, or the layer's own K/V
        src = self.sources(l) if self.kind is RouterKind.MEAN else [l]
        out = torch.zeros(R, (l + 1) * R)
        for s in src:
            out[:, s * R:(s + 1) * R] = torch.eye(R) / len(src)
        return out

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def macs_per_token(self, l: int) -> int:
        """Multiply-accumulates per token of routing K and V at layer l."""
        if l == 0 or self.kind is RouterKind.IDENTITY:
            return 0
        per_source_head = self.R if self.kind in (RouterKind.LINEAR, RouterKind.PER_DIM) else 1
        return 2 * self.R * len(self.sources(l)) * per_source_head * self.head_dim  # K and V


@register_router("none")
class NoneRouter(Router):
    kind = RouterKind.IDENTITY

    def sources(self, l: int) -> list[int]:
        return [l]


@register_router("full")
class FullRouter(Router):
    kind = RouterKind.LINEAR


@register_router("average")
class AverageRouter(Router):
    kind = RouterKind.MEAN


@register_router("last")
class LastRouter(Router):
    """The j most recent slots, the current one included."""

    kind = RouterKind.LINEAR
    arguments = (RouterArg("j"),)
    j: int

    def sources(self, l: int) -> list[int]:
        return list(range(max(0, l - self.j + 1), l + 1))


@register_router("first")
class FirstRouter(Router):
    """The first j slots plus the current one."""

    kind = RouterKind.LINEAR
    arguments = (RouterArg("j"),)
    j: int

    def sources(self, l: int) -> list[int]:
        return sorted(set(range(min(self.j, l + 1))) | {l})


@register_router("dilated")
class DilatedRouter(Router):
    """Every d-th slot (0, d, 2d, ...) plus the current one."""

    kind = RouterKind.LINEAR
    arguments = (RouterArg("d", example=8),)  # dilated-8: the paper's Table 15 setting
    d: int

    def sources(self, l: int) -> list[int]:
        return sorted({s for s in range(l + 1) if s % self.d == 0} | {l})


@register_router("no-head-mix")
class NoHeadMixRouter(Router):
    """(R, |S_l|): each head reads the same head index of every source layer."""

    kind = RouterKind.SAME_HEAD


@register_router("per-dim")
class PerDimRouter(Router):
    """Each source head weighted by an Hd-vector instead of a scalar."""

    kind = RouterKind.PER_DIM
