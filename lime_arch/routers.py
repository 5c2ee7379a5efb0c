"""The router registry: how each layer's attention mixes the buffered K/V heads of layers 0..l.

Semantics (0-based layers, R = number of KV heads; the paper's Eq. 4, arXiv 2502.09245):
  routed_l[h] = sum_{s in S_l, h'} dense_l[h, s*R + h'] * KV_s[h']    (the same weights for K and V)
Layer 0 never has parameters: it reads its own K/V.

Adding a router is one class and one ``@register_router(name)`` line here: the class declares its
``kind`` by name (``KindName("linear")``; the kinds are ``identity``, ``mean``, ``linear``,
``same-head``, ``per-dim``, ``depth-attention``, ``dynamic``, one module each in
``lime_arch/routing/kinds/``), its ``sources``
and, for a family such as ``first-<int>``, its typed ``arguments`` (any number, written after the
name: ``first-4``, ``name-2-8``; each is set on the instance under its name). Registration checks
all of that, so a mistake fails at import, not at forward time.

This module imports no torch: the classes are declarations (``lime_arch.router_base``, re-exported
here), which is all a config check reads; ``build_router`` mixes a class with the torch base
``lime_arch.router_module.RouterModule``. How the mixing is executed is the kind's business
(``lime_arch.routing``), so the decoder and the trainer never branch on router names or kinds.
The kind objects are importable from here as before (``LINEAR``, ``ROUTER_KINDS``, ``RouterKind``),
loaded on first use. See docs/ARCHITECTURE.md, "Routing internals".
"""
from __future__ import annotations

import importlib

from lime_arch.router_base import (
    PRUNABLE_KINDS,
    ROUTERS,
    KindName,
    Router,
    RouterArg,
    build_router,
    check_prunable,
    check_router,
    parse_router,
    register_router,
    router_specs,
)

# and, loaded on first use (``__getattr__``): ROUTER_KINDS, RouterKind, IDENTITY, LINEAR, MEAN, SAME_HEAD, PER_DIM,
# DEPTH_ATTENTION, DYNAMIC
__all__ = ["ROUTERS", "AverageRouter", "DepthAttentionRouter", "DilatedRouter", "DynamicFirstRouter",
           "DynamicLastRouter", "DynamicRouter", "FirstRouter", "FullRouter", "KindName", "LastRouter",
           "NoHeadMixRouter", "NoneRouter", "PerDimRouter", "Router", "RouterArg", "build_router", "check_prunable",
           "check_router", "parse_router", "register_router", "router_specs", "PRUNABLE_KINDS"]


def __getattr__(name: str):
    """The kind objects (torch), loaded on first use: ``ROUTER_KINDS``, ``RouterKind`` and each
    kind under its name in capitals (``LINEAR``, ``SAME_HEAD``)."""
    if name == "RouterKind":
        return importlib.import_module("lime_arch.routing.kinds.base").RouterKind
    if name == "ROUTER_KINDS" or name.isupper():
        kinds = importlib.import_module("lime_arch.routing.kinds").load()
        if name == "ROUTER_KINDS":
            return kinds
        if name.lower().replace("_", "-") in kinds:
            return kinds[name.lower().replace("_", "-")]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@register_router("none")
class NoneRouter(Router):
    kind = KindName("identity")

    def sources(self, l: int) -> list[int]:
        return [l]


@register_router("full")
class FullRouter(Router):
    kind = KindName("linear")


@register_router("average")
class AverageRouter(Router):
    kind = KindName("mean")


@register_router("last")
class LastRouter(Router):
    """The j most recent slots, the current one included."""

    kind = KindName("linear")
    arguments = (RouterArg("j"),)
    depth_args = ("j",)
    j: int

    def sources(self, l: int) -> list[int]:
        return list(range(max(0, l - self.j + 1), l + 1))


@register_router("first")
class FirstRouter(Router):
    """The first j slots plus the current one."""

    kind = KindName("linear")
    arguments = (RouterArg("j"),)
    depth_args = ("j",)
    j: int

    def sources(self, l: int) -> list[int]:
        return sorted(set(range(min(self.j, l + 1))) | {l})


@register_router("dilated")
class DilatedRouter(Router):
    """Every d-th slot (0, d, 2d, ...) plus the current one."""

    kind = KindName("linear")
    arguments = (RouterArg("d", example=8),)  # dilated-8: the paper's Table 15 setting
    depth_args = ("d",)
    d: int

    def sources(self, l: int) -> list[int]:
        return sorted({s for s in range(l + 1) if s % self.d == 0} | {l})


@register_router("no-head-mix")
class NoHeadMixRouter(Router):
    """(R, |S_l|): each head reads the same head index of every source layer."""

    kind = KindName("same-head")


@register_router("per-dim")
class PerDimRouter(Router):
    """Each source head weighted by an Hd-vector instead of a scalar."""

    kind = KindName("per-dim")


@register_router("depth-attention")
class DepthAttentionRouter(Router):
    """Depth-Attention (arXiv 2606.05014): each layer's query scores the keys of layers 0..l at its
    token and mixes their values; keys stay the layer's own; no parameters."""

    kind = KindName("depth-attention")


@register_router("dynamic")
class DynamicRouter(Router):
    """Per-token weights over all of 0..l: the layer's query against learned keys (Appendix E)."""

    kind = KindName("dynamic")


@register_router("dynamic-first")
class DynamicFirstRouter(FirstRouter):
    """The dynamic weights over first-j's sources."""

    kind = KindName("dynamic")


@register_router("dynamic-last")
class DynamicLastRouter(LastRouter):
    """The dynamic weights over last-j's sources."""

    kind = KindName("dynamic")
