"""The causal effect of each route (``lime analyze --ablate``): the validation loss with the route
zeroed minus the loss without it, beside the route's mass (routing mass is not causal importance,
arXiv 2606.13168).

**Routes.** A route is (layer l, source layer s < l) for a source s the router reads at l (reading
its own layer is no route, as in ``orchestrator.analysis.routes``), or with ``heads`` one per
routed KV head h: (l, h, s). Its **mass** is the router map's share: for (l, s) the source map of
``metrics.router_source_map`` (mean |w| of the R x R block of s, normalized over the layer's
sources: the map of ``analysis.md``), for (l, h, s) head h's share of its |weight| on s
(``routes.level_shares``); a token-dependent router's maps are its per-token mixing averaged over
the tokens given (``routes.mixing_maps``).

**Zeroing** goes through the router's own mechanism where it has one, and never edits what a
token-dependent router computes its weights from:

- a prunable kind (``RouterKind.prunable``: the linear routers full, first-j, last-j, dilated-d):
  the route's entries of layer l's top-p pruning mask are cleared (``lime_arch.prune``; the mixers
  run the pruned view, which skips a source slot no head reads any more). A checkpoint pruned
  already keeps its masks (the route is cleared on top of them). Masks, weights and the refresh
  step are put back afterwards, and masks attached only for this are removed.
- every other kind (same-head, per-dim, mean, and the token-dependent dynamic and depth-attention
  kinds, which have no mask): the mixer each forward pass builds is wrapped, as ``capture`` wraps
  it, and at layer l the routed K/V get ``(D' - D)`` applied to layers 0..l's raw K/V, where D is
  the mixing the kind itself reports (``dense(l)``; per token ``token_mixing``, so a dynamic
  router's softmax weights are computed from its query and keys as always) and D' is D with the
  route zeroed. Before using D the wrapper checks that it reproduces the routed values the kind
  computed, and the routed keys (or that the keys are the layer's own: depth attention mixes the
  values only), and refuses to guess otherwise. The wrap sits under the depth mix's own
  (``wrap_mixer``): a value residual sees the ablated values.

**Renormalisation** (``renormalize``; off by default: the route alone is removed and everything
else stays as trained). On: every routed head that lost weight has its remaining entries scaled so
that its row keeps the |weight| mass it had (``lime prune``'s rule, ``lime_arch.prune.refresh``;
per token for a token-dependent router; per-dim: the mass over the row's Hd-vectors). A row whose
only mass was the route stays zero. For a softmax router whose row sums to 1 this is the softmax
over the remaining sources; the dynamic router's gate g < 1 keeps (1 - g) on the layer's own heads,
which this rule scales with the rest (renormalising the softmax alone would not).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats as sps

from lime_arch import prune as lime_prune
from orchestrator.analysis.metrics import router_source_map
from orchestrator.analysis.routes import level_shares, mixing_maps

Tensor = torch.Tensor
# (model) -> per validation window: the summed loss of its targets and their count
WindowLosses = Callable[[torch.nn.Module], tuple[list[float], list[int]]]
# (per-window sums, counts) -> the loss per target and its standard error over windows
MeanSE = Callable[[list[float], list[int]], tuple[float, float]]


@dataclass(frozen=True)
class RouteId:
    layer: int
    source: int
    head: int | None = None  # None: every routed head of the layer

    @property
    def key(self) -> str:
        """Its name in metric keys: ``layer_<l>/source_<s>[/head_<h>]``."""
        return f"layer_{self.layer}/source_{self.source}" + ("" if self.head is None else f"/head_{self.head}")

    def order(self) -> tuple[int, int, int]:
        return self.layer, self.source, -1 if self.head is None else self.head


@dataclass
class Ablation:
    """One model's routes: mass, effect (ablated - base loss) and its standard error over windows."""

    routes: list[RouteId]
    mass: dict[RouteId, float]
    loss: float  # the validation loss without ablation
    loss_se: float
    effect: dict[RouteId, float] = field(default_factory=dict)
    effect_se: dict[RouteId, float] = field(default_factory=dict)
    renormalize: bool = False
    mechanism: str = ""  # "mask" (the router's pruning masks) or "mixer" (the wrapped mixer)

    @property
    def spearman(self) -> float:
        return spearman([self.mass[r] for r in self.routes], [self.effect[r] for r in self.routes])


def candidate_routes(router, heads: bool = False) -> list[RouteId]:
    """Every route of the router: (l, s) for each source s != l it reads at l >= 1 (x each routed
    KV head with ``heads``), in layer, source, head order."""
    out = []
    for l in range(1, router.n_layers):
        for s in router.sources(l):
            if s != l:
                out += [RouteId(l, s, h) for h in range(router.R)] if heads else [RouteId(l, s)]
    return out


def route_masses(model, batches, routes: list[RouteId]) -> dict[RouteId, float]:
    """Each route's mass (module docstring) from the router's maps over the id tensors ``batches``."""
    maps = mixing_maps(model, batches)
    R, L = model.cfg.kv_heads, model.cfg.n_layers
    smap = router_source_map([None] + maps.dense[1:], R)
    shares = {l: level_shares(torch.from_numpy(np.asarray(maps.dense[l])), R, l).numpy() for l in range(1, L)}
    return {r: float(smap[r.layer, r.source] if r.head is None else shares[r.layer][r.head, r.source])
            for r in routes}


def select_routes(routes: list[RouteId], mass: dict[RouteId, float], limit: int | None,
                  seed: int = 0) -> tuple[list[RouteId], dict[RouteId, str]]:
    """At most ``limit`` routes: all when they fit; else the ceil(limit / 2) of highest mass (NaN
    last, ties in route order) and a uniform random sample (``seed``) of the rest. Returns them in
    route order with why each was taken ("all", "top mass", "sample")."""
    if limit is None or len(routes) <= limit:
        return sorted(routes, key=RouteId.order), {r: "all" for r in routes}
    ranked = sorted(routes, key=lambda r: (-mass[r] if math.isfinite(mass[r]) else math.inf, r.order()))
    n_top = math.ceil(limit / 2)
    top, rest = ranked[:n_top], sorted(ranked[n_top:], key=RouteId.order)
    picked = np.random.default_rng(seed).choice(len(rest), size=limit - n_top, replace=False)
    why = {r: "top mass" for r in top} | {rest[i]: "sample" for i in picked}
    return sorted(why, key=RouteId.order), why


def spearman(mass: list[float], effect: list[float]) -> float:
    """Spearman's rank correlation of mass and effect (ties: average ranks); NaN below 3 routes or
    when either is constant."""
    a, b = np.asarray(mass, np.float64), np.asarray(effect, np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(sps.spearmanr(a, b).statistic)


def mechanism(router) -> str:
    """How a route of this router is zeroed: its pruning masks when its kind has them."""
    return "mask" if router.kind.prunable else "mixer"


# -- zeroing through the pruning masks ------------------------------------------------------------------
@contextmanager
def _masked(router, route: RouteId, renormalize: bool) -> Iterator[None]:
    added = router._modules.get("prune") is None
    pr = lime_prune.attach(router)
    L, l = router.n_layers, route.layer
    saved = [pr.mask(j).clone() for j in range(1, L)]
    refreshed = int(pr.refreshed)
    w = router.weights[l - 1]
    saved_w = w.detach().clone()
    try:
        with torch.no_grad():
            if refreshed < 0:  # masks never refreshed are not in force: everything is read
                for j in range(1, L):
                    pr.mask(j).fill_(True)
            m = pr.mask(l)
            old = m.clone()
            src = router.sources(l)
            width = m.shape[1] // len(src)  # a prunable kind's sources are equal column blocks
            i = src.index(route.source)
            rows = slice(None) if route.head is None else slice(route.head, route.head + 1)
            m[rows, i * width:(i + 1) * width] = False
            if renormalize:  # lime_arch.prune.refresh's rule: each row keeps its |weight| mass
                mass = router.kind.prune_mass(w)
                before, after = (mass * old).flatten(1).sum(-1), (mass * m).flatten(1).sum(-1)
                scale = torch.where(after > 0, before / after.clamp_min(1e-300), torch.ones_like(after))
                w.mul_(scale.view(-1, *([1] * (w.dim() - 1))).to(w.dtype))
            pr.refreshed.fill_(max(refreshed, 0))
        pr.changed()
        yield
    finally:
        with torch.no_grad():
            w.copy_(saved_w)
            for j, mk in enumerate(saved, start=1):
                pr.mask(j).copy_(mk)
            pr.refreshed.fill_(refreshed)
        pr.changed()
        if added:
            del router.prune


# -- zeroing in the mixing the kind reports ------------------------------------------------------------
def _apply(d: Tensor, xs: list[Tensor]) -> Tensor:
    """Dense mixing d (R, C), (R, C, Hd) or per token (B, T, R, C[, Hd]) applied to the raw K or V
    of layers 0..l (each (B, T, R, Hd); C = (l+1)R) -> (B, T, R, Hd)."""
    x = torch.cat(xs, dim=2)  # (B, T, C, Hd)
    eq = {2: "rc,btcd->btrd", 3: "rcd,btcd->btrd", 4: "btrc,btcd->btrd", 5: "btrcd,btcd->btrd"}[d.dim()]
    return torch.einsum(eq, d.to(device=x.device, dtype=x.dtype), x)


def zeroed(d: Tensor, R: int, route: RouteId, renormalize: bool) -> Tensor:
    """The dense mixing d (any layout of ``_apply``) with the route's entries zeroed and, with
    ``renormalize``, each row that lost mass scaled back to its |weight| mass."""
    per_dim = d.dim() in (3, 5)
    col = d.dim() - (2 if per_dim else 1)  # the source-column dimension; the routed head's is before it
    idx: list = [slice(None)] * d.dim()
    idx[col] = slice(route.source * R, (route.source + 1) * R)
    if route.head is not None:
        idx[col - 1] = slice(route.head, route.head + 1)
    z = d.clone()
    z[tuple(idx)] = 0
    if renormalize:
        dims = (col, col + 1) if per_dim else (col,)
        before, after = d.abs().sum(dim=dims, keepdim=True), z.abs().sum(dim=dims, keepdim=True)
        z = z * torch.where(after > 0, before / after.clamp_min(1e-300), torch.ones_like(after))
    return z


def _close(a: Tensor, b: Tensor) -> bool:
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    return bool(torch.allclose(a, b, rtol=1e-3, atol=1e-4 * scale))


class _ZeroingMixer:
    """Routes as the router's own mixer does, then removes one route at its layer (module docstring)."""

    def __init__(self, inner, router, route: RouteId, renormalize: bool):
        self.inner, self.router, self.route_id, self.renormalize = inner, router, route, renormalize
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.k.append(k)  # raw (B, T, R, Hd)
        self.v.append(v)
        kr, vr = self.inner.route(l, k, v, q=q, x=x)  # routed (B, R, T, Hd)
        if l != self.route_id.layer:
            return kr, vr
        router = self.router
        kind = router.kind
        d = kind.token_mixing(router, l, q, self.k, x=x) if kind.token_dependent else router.dense(l)
        if not _close(vr.transpose(1, 2), _apply(d, self.v)):
            raise RuntimeError(f"router {router.spec}: layer {l}'s routed values are not the mixing its kind reports "
                               "(dense / token_mixing); its routes cannot be ablated")
        mixes_keys = _close(kr.transpose(1, 2), _apply(d, self.k))
        if not mixes_keys and not torch.equal(kr.transpose(1, 2), k):
            raise RuntimeError(f"router {router.spec}: layer {l}'s routed keys are neither the mixing its kind reports "
                               "nor the layer's own keys; its routes cannot be ablated")
        delta = zeroed(d, router.R, self.route_id, self.renormalize) - d
        vr = vr + _apply(delta, self.v).transpose(1, 2)
        if mixes_keys:
            kr = kr + _apply(delta, self.k).transpose(1, 2)
        return kr, vr


@contextmanager
def _wrapped(model, route: RouteId, renormalize: bool) -> Iterator[None]:
    mix = model.depth_mix
    original = mix.wrap_mixer

    def zeroing(inner, memo):  # under the depth mix's own wrap: its value hooks see the ablated values
        return original(_ZeroingMixer(inner, model.router, route, renormalize), memo)

    mix.wrap_mixer = zeroing  # this model only
    try:
        yield
    finally:
        del mix.wrap_mixer  # the class's method again


def ablated(model, route: RouteId, *, renormalize: bool = False, via: str | None = None):
    """A context in which ``model`` runs with ``route`` zeroed (``via``: "mask" or "mixer"; default
    the router's own, ``mechanism``)."""
    via = via or mechanism(model.router)
    if via == "mask":
        return _masked(model.router, route, renormalize)
    if via == "mixer":
        return _wrapped(model, route, renormalize)
    raise ValueError(f"via: 'mask' or 'mixer', got {via!r}")


@torch.no_grad()
def measure(model, routes: list[RouteId], mass: dict[RouteId, float], losses: WindowLosses, mean_se: MeanSE, *,
            renormalize: bool = False, via: str | None = None) -> Ablation:
    """The base loss and each route's effect: the loss with it zeroed minus the base loss, with its
    standard error over the windows (``mean_se`` of each window's ablated minus base summed loss:
    paired). ``losses`` and ``mean_se`` are the engine's (``orchestrator.engine.val_loss``): the
    windows and estimator of training's ``val/loss``."""
    base, counts = losses(model)
    loss, se = mean_se(base, counts)
    out = Ablation(list(routes), {r: mass[r] for r in routes}, loss, se, renormalize=renormalize,
                   mechanism=via or mechanism(model.router))
    for r in routes:
        with ablated(model, r, renormalize=renormalize, via=via):
            sums, _ = losses(model)
        out.effect[r], out.effect_se[r] = mean_se([a - b for a, b in zip(sums, base)], counts)
    return out
