"""The router registry: how each layer's attention mixes the buffered K/V heads of layers 0..l.

Semantics (0-based layers, R = number of KV heads; the paper's Eq. 4, arXiv 2502.09245):
  routed_l[h] = sum_{s in S_l, h'} dense_l[h, s*R + h'] * KV_s[h']    (the same weights for K and V)
Layer 0 never has parameters: it reads its own K/V.

Adding a router is one class and one ``@register_router(name)`` line here: the class declares its
``kind`` (``IDENTITY``, ``MEAN``, ``LINEAR``, ``SAME_HEAD``, ``PER_DIM``, ``DYNAMIC``: a ``RouterKind`` from
``lime_arch.routing.kinds``), its ``sources`` and, for a family such as ``first-<int>``, its typed
``arguments`` (any number, written after the name: ``first-4``, ``name-2-8``; each is set on the
instance under its name). Registration checks all of that, so a mistake fails at import, not at
forward time. The base class, the registry and the spec parser are ``lime_arch.router_base``
(re-exported here); how the mixing is executed is the kind's business (``lime_arch.routing``), so
the decoder and the trainer never branch on router names or kinds. A new kind is one module in
``lime_arch/routing/kinds/``. See docs/ARCHITECTURE.md, "Routing internals".
"""
from __future__ import annotations

from lime_arch.router_base import (
    ROUTERS,
    Router,
    RouterArg,
    build_router,
    parse_router,
    register_router,
    router_specs,
)
from lime_arch.routing.kinds.base import ROUTER_KINDS, RouterKind
from lime_arch.routing.kinds.depth_attention import DEPTH_ATTENTION
from lime_arch.routing.kinds.dynamic import DYNAMIC
from lime_arch.routing.kinds.identity import IDENTITY
from lime_arch.routing.kinds.linear import LINEAR
from lime_arch.routing.kinds.mean import MEAN
from lime_arch.routing.kinds.per_dim import PER_DIM
from lime_arch.routing.kinds.same_head import SAME_HEAD

__all__ = ["DEPTH_ATTENTION", "DYNAMIC", "IDENTITY", "LINEAR", "MEAN", "PER_DIM", "ROUTERS", "ROUTER_KINDS",
           "SAME_HEAD", "AverageRouter", "DepthAttentionRouter", "DilatedRouter", "DynamicFirstRouter",
           "DynamicLastRouter", "DynamicRouter", "FirstRouter", "FullRouter", "LastRouter", "NoHeadMixRouter",
           "NoneRouter", "PerDimRouter", "Router", "RouterArg", "RouterKind", "build_router", "parse_router",
           "register_router", "router_specs"]


@register_router("none")
class NoneRouter(Router):
    kind = IDENTITY

    def sources(self, l: int) -> list[int]:
        return [l]


@register_router("full")
class FullRouter(Router):
    kind = LINEAR


@register_router("average")
class AverageRouter(Router):
    kind = MEAN


@register_router("last")
class LastRouter(Router):
    """The j most recent slots, the current one included."""

    kind = LINEAR
    arguments = (RouterArg("j"),)
    j: int

    def sources(self, l: int) -> list[int]:
        return list(range(max(0, l - self.j + 1), l + 1))


@register_router("first")
class FirstRouter(Router):
    """The first j slots plus the current one."""

    kind = LINEAR
    arguments = (RouterArg("j"),)
    j: int

    def sources(self, l: int) -> list[int]:
        return sorted(set(range(min(self.j, l + 1))) | {l})


@register_router("dilated")
class DilatedRouter(Router):
    """Every d-th slot (0, d, 2d, ...) plus the current one."""

    kind = LINEAR
    arguments = (RouterArg("d", example=8),)  # dilated-8: the paper's Table 15 setting
    d: int

    def sources(self, l: int) -> list[int]:
        return sorted({s for s in range(l + 1) if s % self.d == 0} | {l})


@register_router("no-head-mix")
class NoHeadMixRouter(Router):
    """(R, |S_l|): each head reads the same head index of every source layer."""

    kind = SAME_HEAD


@register_router("per-dim")
class PerDimRouter(Router):
    """Each source head weighted by an Hd-vector instead of a scalar."""

    kind = PER_DIM


@register_router("depth-attention")
class DepthAttentionRouter(Router):
    """Depth-Attention (arXiv 2606.05014): each layer's query scores the keys of layers 0..l at its
    token and mixes their values; keys stay the layer's own; no parameters."""

    kind = DEPTH_ATTENTION

@register_router("dynamic")
class DynamicRouter(Router):
    """Per-token weights over all of 0..l: the layer's query against learned keys (Appendix E)."""

    kind = DYNAMIC


@register_router("dynamic-first")
class DynamicFirstRouter(FirstRouter):
    """The dynamic weights over first-j's sources."""

    kind = DYNAMIC


@register_router("dynamic-last")
class DynamicLastRouter(LastRouter):
    """The dynamic weights over last-j's sources."""

    kind = DYNAMIC
