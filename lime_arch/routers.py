"""The router registry: how each layer's attention mixes the buffered K/V heads of layers 0..l.

A router owns the learned (or fixed) coefficients of every layer and answers three questions:
which buffered slots layer ``l`` reads (``sources``), with what effective weight
(``weight``, shape (R, |S_l|*R) or (R, |S_l|*R, Hd)), and what that is as a dense
(R, (l+1)*R) matrix (``dense``, zeros outside the sources) for analysis, tests and plots.
How the mixing is executed (buffer, running mean, concatenation) is the mixer's business
(``kvbuffer.py``), chosen by the router's ``kind``; the decoder and trainer never branch on
router names. Adding a router is one class plus one ``@register_router`` line.

Semantics (0-based layers, R = number of KV heads; DESIGN.md "Router semantics"):
  routed_l[h] = sum_{s in S_l, h'} W_l[h, idx(s)*R + h'] * KV_s[h']    (same W for K and V)
Layer 0 never has parameters: it reads its own K/V.
"""
from __future__ import annotations

import math
import re
from typing import ClassVar

import torch
from torch import nn

from lime_arch.errors import ConfigError

ROUTERS: dict[str, type[Router]] = {}


def register_router(name: str, takes_arg: bool = False):
    def deco(cls: type[Router]) -> type[Router]:
        cls.name, cls.takes_arg = name, takes_arg
        ROUTERS[name] = cls
        return cls

    return deco


def _registered() -> str:
    return ", ".join(f"{n}-<int>" if c.takes_arg else n for n, c in ROUTERS.items())


def parse_router(spec: str) -> tuple[type[Router], int | None]:
    """'first-4' -> (FirstRouter, 4). Unknown names or bad integers raise ConfigError."""
    if not isinstance(spec, str):
        raise ConfigError(f"model.router: must be a string, got {spec!r}; registered: {_registered()}")
    if spec in ROUTERS and not ROUTERS[spec].takes_arg:
        return ROUTERS[spec], None
    m = re.fullmatch(r"(.+)-(-?\d+)", spec)
    if m and m.group(1) in ROUTERS and ROUTERS[m.group(1)].takes_arg:
        arg = int(m.group(2))
        if arg < 1:
            raise ConfigError(f"model.router: {spec!r} needs a positive integer after '-', got {arg}")
        return ROUTERS[m.group(1)], arg
    if spec in ROUTERS:
        raise ConfigError(f"model.router: {spec!r} needs an integer, e.g. {spec}-4")
    raise ConfigError(f"model.router: unknown router {spec!r}; registered: {_registered()}")


def build_router(spec: str, *, n_layers: int, n_kv_heads: int, head_dim: int, init: str = "paper") -> Router:
    cls, arg = parse_router(spec)
    return cls(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, arg=arg, init=init)


class Router(nn.Module):
    name: ClassVar[str]
    takes_arg: ClassVar[bool]
    # "identity": no mixing; "mean": fixed uniform average; "linear": learned (R, |S|R);
    # "perdim": learned (R, |S|R, Hd). The mixer is chosen from this.
    kind: ClassVar[str] = "linear"
    # same_head: the parameter of layer l is (R, |S_l|), head h reading head h of every source;
    # ``weight`` expands it to the block-diagonal (R, |S_l|R). The buffer mixer reads the
    # parameter itself (R*|S| MACs per column instead of the dense matrix's R*|S|*R).
    same_head: ClassVar[bool] = False

    def __init__(self, *, n_layers: int, n_kv_heads: int, head_dim: int, arg: int | None, init: str):
        super().__init__()
        self.n_layers, self.R, self.head_dim, self.arg, self.init = n_layers, n_kv_heads, head_dim, arg, init
        self.weights = nn.ParameterList(
            [nn.Parameter(self._init_weight(l)) for l in range(1, n_layers)] if self.learned else []
        )

    @property
    def spec(self) -> str:
        return self.name if self.arg is None else f"{self.name}-{self.arg}"

    @property
    def learned(self) -> bool:
        return self.kind in ("linear", "perdim")

    # -- what each router defines -------------------------------------------------------------
    def sources(self, l: int) -> list[int]:
        return list(range(l + 1))

    def weight_shape(self, l: int) -> tuple[int, ...]:
        return (self.R, len(self.sources(l)) * self.R)

    def _init_weight(self, l: int) -> torch.Tensor:
        """PAPER.md init: U(-b, b), b = sqrt(3 / fan_in), then identity on the current slot.
        ``identity`` init zeroes the rest, so step 0 is exactly the baseline."""
        shape = self.weight_shape(l)
        b = math.sqrt(3.0 / shape[1])
        w = torch.empty(shape).uniform_(-b, b) if self.init == "paper" else torch.zeros(shape)
        cur = self.sources(l).index(l)
        if self.same_head:  # one column per slot (same head index)
            w[:, cur] = 1.0
        else:
            eye = torch.eye(self.R)
            w[:, cur * self.R:(cur + 1) * self.R] = eye if w.dim() == 2 else eye[..., None]
        return w

    def weight(self, l: int) -> torch.Tensor | None:
        """Effective weight of layer l over its sources: (R, |S_l|*R) or (R, |S_l|*R, Hd)."""
        if l == 0 or not self.learned:
            return None
        return self.weights[l - 1]

    def dense(self, l: int) -> torch.Tensor:
        """Dense (R, (l+1)*R) equivalent (per-dim: (R, (l+1)*R, Hd)), zeros outside the sources."""
        R = self.R
        w = self.weight(l)
        if w is not None:
            out = w.new_zeros((R, (l + 1) * R) + tuple(w.shape[2:]))
            for i, s in enumerate(self.sources(l)):
                out[:, s * R:(s + 1) * R] = w[:, i * R:(i + 1) * R]
            return out
        # parameter-free: the uniform average of its sources, or the layer's own K/V
        src = self.sources(l) if self.kind == "mean" else [l]
        out = torch.zeros(R, (l + 1) * R)
        for s in src:
            out[:, s * R:(s + 1) * R] = torch.eye(R) / len(src)
        return out

    def n_params(self) -> int:
        return sum(p.numel() for p in self.weights)

    def macs_per_token(self, l: int) -> int:
        """Multiply-accumulates per token of routing K and V at layer l."""
        if l == 0 or self.kind == "identity":
            return 0
        n_src = len(self.sources(l))
        per_kv = {"mean": n_src * self.R * self.head_dim,
                  "linear": self.R * n_src * self.R * self.head_dim,
                  "perdim": self.R * n_src * self.R * self.head_dim}[self.kind]
        return 2 * per_kv  # K and V


@register_router("none")
class NoneRouter(Router):
    kind = "identity"

    def sources(self, l: int) -> list[int]:
        return [l]


@register_router("full")
class FullRouter(Router):
    pass


@register_router("average")
class AverageRouter(Router):
    kind = "mean"


@register_router("last", takes_arg=True)
class LastRouter(Router):
    def sources(self, l: int) -> list[int]:
        return list(range(max(0, l - self.arg + 1), l + 1))


@register_router("first", takes_arg=True)
class FirstRouter(Router):
    def sources(self, l: int) -> list[int]:
        return sorted(set(range(min(self.arg, l + 1))) | {l})


@register_router("dilated", takes_arg=True)
class DilatedRouter(Router):
    def sources(self, l: int) -> list[int]:
        return sorted({s for s in range(l + 1) if s % self.arg == 0} | {l})


@register_router("no-head-mix")
class NoHeadMixRouter(Router):
    """(R, |S_l|): each head reads the same head index of every source layer."""

    same_head = True

    def weight_shape(self, l: int) -> tuple[int, ...]:
        return (self.R, len(self.sources(l)))

    def weight(self, l: int) -> torch.Tensor | None:
        if l == 0:
            return None
        w = self.weights[l - 1]  # (R, S)
        eye = torch.eye(self.R, dtype=w.dtype, device=w.device)
        return (w[:, :, None] * eye[:, None, :]).reshape(self.R, -1)  # (R, S*R), block-diagonal per slot

    def macs_per_token(self, l: int) -> int:
        return 0 if l == 0 else 2 * len(self.sources(l)) * self.R * self.head_dim


@register_router("per-dim")
class PerDimRouter(Router):
    """Each source head weighted by an Hd-vector instead of a scalar."""

    kind = "perdim"

    def weight_shape(self, l: int) -> tuple[int, ...]:
        return (self.R, len(self.sources(l)) * self.R, self.head_dim)
