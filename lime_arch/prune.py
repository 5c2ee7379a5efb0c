"""Top-p pruning of router weights (arXiv 2502.09245: Table 5, Figure 9, Sections 5.4 and 5.6).

Per routed head (a row of layer l's weight), the importance of each entry is its share of the
row's |weight| mass; the entries are sorted by it and the smallest prefix whose cumulative mass
first exceeds ``top_p`` is kept (the crossing entry kept), the rest is masked to zero and, with
``renormalize``, the kept entries are scaled so that the row keeps the |weight| mass it had
before. The authors' first code pruned a softmax-normalised router, whose weights are that share
themselves and whose renormalisation is the same rescaling; this project's routers are signed and
unnormalised (the paper's second version), so the share of |w| stands in for the softmax mass.

The masks live on the router (``router.prune``, a ``RoutePrune`` of one boolean buffer per layer
shaped like its weight, and the step of the last refresh), so they are saved and loaded with the
model's state dict: a checkpoint resumes with its mask, and a pruned model saved by ``lime prune``
loads as one. ``refresh`` recomputes them from the weights (post-hoc once, or on a schedule in
training: ``model.router_prune``). In training every entry is ranked at each refresh, a pruned
one with the value it had when it was pruned (its gradient is zero: the mask multiplies it), so a
route can come back. Post hoc (``lime prune``, ``only_kept``) only the entries still kept are
ranked: pruning a pruned checkpoint again keeps its dropped routes dropped (ranking them at their
stale values would bring routes back and undercount: a top-p 0.9 checkpoint pruned again at 0.99
reported 28 of 144 weights pruned, fewer than the 0.9 mask held).

What the mixers run is ``Router.executed()``: while a mask is set, a ``PrunedRouter`` whose
``sources(l)`` are only the slots some head still reads (the current slot always) and whose
``weight(l)`` is the masked weight restricted to them. The buffer mixer builds its plan from those
sources, so a slot pruned for every head of a layer is really skipped (fewer products, less
traffic); a pruned entry inside a kept slot is a zero of the mask. Pruning is the router's
business only: the products never see it. A pruned router does not run under ``torch.compile``
(the compiled routing ops rebuild the plan from the router's spec, which knows no mask).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lime_arch.errors import ConfigError
from lime_arch.router_base import check_prunable

Tensor = torch.Tensor


def top_p_keep(mass: Tensor, top_p: float) -> Tensor:
    """(R, n) non-negative importances -> the boolean mask of each row's smallest prefix (by
    decreasing importance, ties in column order) whose cumulative share first exceeds ``top_p``,
    the crossing entry included. A row of zeros keeps everything (nothing to rank)."""
    m = mass.double()
    share = m / m.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    order = share.argsort(dim=-1, descending=True, stable=True)
    s = share.gather(-1, order)
    before = s.cumsum(dim=-1) - s  # the mass of the entries ranked above each one
    keep_sorted = before <= top_p  # kept while the prefix above it has not exceeded top_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


class RoutePrune(nn.Module):
    """The masks of one router: ``mask_<l>`` (bool, the shape of layer l's weight) for l >= 1 and
    ``refreshed`` (the step of the last refresh; -1: never, nothing is pruned)."""

    def __init__(self, router):
        super().__init__()
        self.n_layers = router.n_layers
        for l in range(1, router.n_layers):
            self.register_buffer(f"mask_{l}", torch.ones(router.weight_shape(l), dtype=torch.bool))
        self.register_buffer("refreshed", torch.tensor(-1, dtype=torch.long))
        self._cache: dict = {}  # "view": the router or its PrunedRouter for the current masks (a plain
        #   dict: a module stored as an attribute would become a child)

    def mask(self, l: int) -> Tensor:
        return getattr(self, f"mask_{l}")

    def changed(self) -> None:
        """Forget the pruned view (after a refresh or a load)."""
        self._cache.clear()

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self.changed()


class PrunedRouter:
    """A router as the mixers run it while pruned: its kept sources and masked weights (see the
    module docstring). Everything else is the router's."""

    def __init__(self, router, prune: RoutePrune):
        self.base, self.prune = router, prune
        self.kind, self.n_layers, self.R, self.head_dim = router.kind, router.n_layers, router.R, router.head_dim
        self._positions: list[list[int]] = []  # per layer: positions in the router's sources kept
        self._cols: list[Tensor | None] = [None]  # per layer >= 1: the weight columns kept (None: all)
        for l in range(self.n_layers):
            src = router.sources(l)
            if l == 0:
                self._positions.append(list(range(len(src))))
                continue
            m = prune.mask(l)
            width = m.shape[1] // len(src)
            used = m.reshape(m.shape[0], len(src), width, *m.shape[2:]).flatten(2).any(dim=2).any(dim=0).tolist()
            pos = [i for i, s in enumerate(src) if used[i] or s == l]  # the current slot always
            self._positions.append(pos)
            self._cols.append(None if len(pos) == len(src) else
                              torch.tensor([i * width + j for i in pos for j in range(width)], device=m.device))

    def __getattr__(self, name):  # spec, name, init, arg_values, ...: the router's
        if name in ("base", "prune"):
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def learned(self) -> bool:
        return self.kind.learned

    def executed(self) -> PrunedRouter:
        return self

    def sources(self, l: int) -> list[int]:
        src = self.base.sources(l)
        return [src[i] for i in self._positions[l]]

    def weight(self, l: int) -> Tensor | None:
        w = self.base.weight(l)
        if w is None:
            return None
        w = w * self.prune.mask(l)  # pruned entries: zero, and no gradient
        cols = self._cols[l]
        return w if cols is None else w.index_select(1, cols.to(w.device))

    def operand_shape(self, l: int):
        return self.kind.operand_shape(self, l)

    def dense(self, l: int) -> Tensor:
        return self.kind.dense(self, l)

    def macs_per_token(self, l: int) -> int:
        return self.kind.macs_per_token(self, l)


def executed(router):
    """What the mixers run: the router, or its ``PrunedRouter`` while a mask is set."""
    prune = router._modules.get("prune")
    if prune is None:
        return router
    view = prune._cache.get("view")
    if view is None:
        view = prune._cache["view"] = router if int(prune.refreshed) < 0 else PrunedRouter(router, prune)
    if view is not router and torch.compiler.is_compiling():
        raise RuntimeError(f"router {router.spec}: a pruned router does not run under torch.compile (the "
                           "compiled routing ops build their plan from the router's spec, which knows no mask)")
    return view


def attach(router) -> RoutePrune:
    """The router's masks, created (all kept, never refreshed) if it has none."""
    check_prunable(type(router))
    if router._modules.get("prune") is None:
        ref = next(iter(router.parameters()), None)
        router.prune = RoutePrune(router).to(ref.device if ref is not None else "cpu")
    return router.prune


@torch.no_grad()
def refresh(router, top_p: float, *, renormalize: bool = True, step: int = 0, only_kept: bool = False) -> None:
    """Recompute every layer's mask from the router's weights at ``top_p`` (and renormalise: each
    row's kept entries scaled to the |weight| mass the row had under its previous mask).
    ``only_kept``: rank only the entries the current mask keeps (their shares of the kept mass);
    what it prunes stays pruned."""
    if not 0 < top_p < 1:
        raise ConfigError(f"top_p: must be in (0, 1), got {top_p}")
    prune = attach(router)
    kind = router.kind
    for l in range(1, router.n_layers):
        w = router.weights[l - 1]
        old = prune.mask(l)
        mass = kind.prune_mass(w)  # (R, n) like w
        if only_kept:  # a pruned entry has no share; the AND also covers a row whose kept mass is 0
            keep = top_p_keep((mass * old).flatten(1), top_p).view_as(old) & old
        else:
            keep = top_p_keep(mass.flatten(1), top_p).view_as(old)
        if renormalize:
            before = (mass * old).flatten(1).sum(-1)
            after = (mass * keep).flatten(1).sum(-1)
            scale = torch.where(after > 0, before / after.clamp_min(1e-300), torch.ones_like(after))
            w.mul_(torch.where(keep, scale.view(-1, *([1] * (w.dim() - 1))).to(w.dtype), torch.ones_like(w)))
        old.copy_(keep)
    prune.refreshed.fill_(step)
    prune.changed()


@dataclass
class PruneStats:
    """What is pruned: per layer l >= 1 the pruned and total weights, the slots skipped (pruned for
    every head) and, per routed head, the source slots it still reads (Table 5's counts)."""

    pruned: list[int]
    total: list[int]
    skipped: list[list[int]]
    kept_sources: list[list[list[int]]]

    @property
    def fraction(self) -> float:
        return sum(self.pruned) / max(1, sum(self.total))


def stats(router) -> PruneStats:
    """The router's pruning now (nothing pruned without masks)."""
    prune = router._modules.get("prune")
    pruned, total, skipped, kept = [0], [0], [[]], [[list(router.sources(0))] * router.R]
    view = executed(router)
    for l in range(1, router.n_layers):
        src = router.sources(l)
        shape = router.weight_shape(l)
        m = prune.mask(l) if prune is not None else torch.ones(shape, dtype=torch.bool)
        m = m.cpu()
        pruned.append(int((~m).sum()))
        total.append(m.numel())
        reads = set(view.sources(l))
        skipped.append([s for s in src if s not in reads])
        per_slot = m.reshape(m.shape[0], len(src), -1).any(dim=2)  # (R, |S|)
        kept.append([[s for i, s in enumerate(src) if per_slot[h, i]] for h in range(m.shape[0])])
    return PruneStats(pruned, total, skipped, kept)
