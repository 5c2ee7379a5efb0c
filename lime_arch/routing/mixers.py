"""Executing the routing: the buffer mixer of the buffered kinds, and the paper's concatenation.

Every mixer maps the raw K/V of the current tokens (B, T, R, Hd) to routed K/V (B, R, T, Hd)
(``route(l, k, v, q=None)``; ``q``, the layer's query, is read by token-dependent kinds only).
Routing is per position, so the same code serves training, prefill and one-token decoding. The
mixer is the router's kind's (``make_mixer`` asks ``router.kind``; the parameter-free kinds'
mixers live in their modules, ``lime_arch.routing.kinds``) and multiplies exactly what the
router's ``weight(l)`` returns. docs/ARCHITECTURE.md, "Routing internals", walks through this.

How ``BufferMixer`` (the buffered kinds; generic over the kind object) is fast and lean:

- The buffer. Every layer writes its raw, pre-RoPE K and V once into a preallocated tensor of
  shape (D, L*rows_per_slot, N); K and V of a head sit side by side in one row, so one product
  mixes both. One layout per buffered kind (``BufferedKind``, read through ``Layout``):
    linear    (full, first-j, last-j, dilated-d): D = 1,  R rows per slot, N = 2*B*T*Hd;
    per-dim:                                      D = Hd, R rows per slot, N = 2*B*T;
    same-head (no-head-mix: one weight per slot and head): D = R (a batch per head), 1 row per
              slot, N = 2*B*T*Hd, so the product does R*|S| MACs per column, not the R*|S|*R of
              the dense block-diagonal matrix.
  Routing layer l is ``operand(weight(l)) (D, out_rows, |S_l|*rows_per_slot) @ buf[source rows]``
  on views of the buffer: no concatenation, memory O(L), not O(L^2). On CPU the buffer comes from
  a small pool (``lime_arch.routing.pool``). Gradient-side tensors are not pooled (they would sit
  in memory between steps and raise the next step's peak).
- Blocking over layers. A product with only out_rows output rows streams the buffer prefix once
  per layer and runs far below matmul speed (on the dev CPU ~8 GFLOP/s at 8 rows vs 35-50 at
  64+). Layers are grouped in blocks. When layer l0 starts a block every slot below l0 is
  written, so that layer also computes ``P = W_old @ buf[old slots]`` once: the contribution of
  the old slots (the union of the block's sources below l0) to every member of the block (the
  layers with such sources), in one product of members*out_rows rows. Each layer then adds only
  its in-block sources. ``choose_block`` picks the block size from the traffic model of the
  router's source sets (``lime_arch.routing.plan.traffic``; 16 for full at 64-128 layers, 8 at
  16; no blocking for last-j), with block*out_rows <= 128.
- Autograd: one custom function per layer (``lime_arch.routing.state``). Writing into a tensor in
  place breaks autograd's saved-tensor checks, so ``RouteLayer`` (layers >= 1) and
  ``WriteLayer0`` (layer 0, which reads its K/V unrouted) do the bookkeeping themselves. Layer
  l's function consumes layer l-1's routed K (the *link*), so in backward layer l runs only after
  every later layer. A layer's weight enters exactly one function as ``weight(l)`` returned it;
  the first layer of a block also takes the other members' weights. Backward of layer l:
    * store its output gradient g_l into its rows of the block's grad_out, and the dW of its
      in-block columns, g_l @ buf[in-block rows]^T;
    * at a block's first layer (every later layer of the block is done): the old-slot part with
      two products of members*out_rows rows, dW_old = grad_out @ buf[old slots]^T and
      grad[old slots] += W_old^T grad_out (the only read-modify-write of the K/V gradient
      buffer, once per block), and the members' whole dW;
    * slot l's gradient, computed once: every reader of slot l is done, so
      grad_l = grad[l] + W_in(l)^T @ grad_out[readers of l], one product over the block's stacked
      in-block weights ``in_weights`` (filled in forward), handed out as a fresh tensor.
  grad_out starts at zero, so a layer whose output got no gradient contributes nothing (a
  partial forward stays exact). A block's grad_out and in_weights are dropped at its first
  layer; at layer 0 the buffer goes back to the pool.
- Memory over the baseline: one copy of the raw K/V, one block of routed K/V in flight, and
  during backward the K/V gradient buffer (blocked routers only) and grad_out of one block; the
  paper's concatenation holds O(L^2).
- Python overhead matters at these sizes (a view op from Python costs microseconds, more with
  cold caches inside a real step): per-layer K/V views of the pooled buffer are memoised on it,
  views of weights that are parameters are memoised per parameter (``Layout.split_columns``),
  and K/V views are made with ``as_strided``.
- Per-dim (``kinds/per_dim.py``): the product's output has Hd as its batch dimension, so routed
  K/V are copied once into (B, R, T, Hd) order with Hd contiguous (attention kernels need that;
  SDPA would otherwise fall back to its slow math path), and its weights are made contiguous per
  layer (bmm needs a unit stride per matrix).
- Without autograd (``no_grad``): the same products, without autograd functions. For a few
  tokens (decoding; below ``SMALL_N`` of the kind's ``few_token_columns``) the fewest ops win,
  since there is no bandwidth to save: the kind's ``few_token_path`` runs. Linear routers write
  each layer's [K|V] once into a pooled (L*R, B*T*2Hd) slot tensor whose views are memoised, and
  multiply row ranges of it (full, last-j: one product per layer; first-j: two); same-head and
  per-dim routers concatenate their sources from a list.
- The uniform average (``kinds/mean.py``) needs no buffer at all: a running sum divided by l+1.
- Under torch.compile the same work runs as opaque custom ops (``lime_arch.routing.ops``), which
  Dynamo does not trace: ``BufferMixer`` picks them while Dynamo traces (``use_ops``).
- ``ConcatMixer`` is the paper's pseudocode (grow the buffer by concatenation at every layer,
  multiply with the dense router, ``RouterKind.concat_route``): the benchmark's peer and an
  independent reference.
Source lists of a router must be sorted (all registered routers' are); plans are cached on the
router per block size.
"""
from __future__ import annotations

import torch

from lime_arch.router_base import Router
from lime_arch.routing import ops
from lime_arch.routing.plan import layout_for, plan_for
from lime_arch.routing.state import BufferState, RouteLayer, WriteLayer0

Tensor = torch.Tensor

SMALL_N = 4096  # below this many columns (the kind's ``few_token_columns``) no-grad routing takes the few-ops path


class BufferMixer:
    """The buffered kinds (linear, same-head, per-dim, ...) over the preallocated, blocked buffer.
    Generic over the router's kind: the layout, the K/V views and the few-token path are its."""

    def __init__(self, router: Router, block: int | None = None, use_ops: bool | None = None):
        self.router, self.block, self.kind = router, block, router.kind
        # under torch.compile the routing runs as opaque custom ops (``lime_arch.routing.ops``), which
        # build the plan themselves: nothing here may touch the plan caches while Dynamo traces
        self.use_ops = torch.compiler.is_compiling() if use_ops is None else use_ops
        self.layout = None if self.use_ops else layout_for(router)
        self.plan = None if self.use_ops else plan_for(router, self.layout, block)
        self.layer_weights: list[Tensor] = []  # weight(l) of layers 1..L-1, fetched once per pass
        self.state: BufferState | None = None
        self.link: Tensor | None = None  # what the next layer's autograd function (or op) consumes
        self.mode = "grad"
        self.small = None  # the few-token path of this pass (``kind.few_token_path``)
        self.taken: tuple = ()  # ops path: per layer, the other members whose weights it takes

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Layer l's raw K/V (B, T, R, Hd) -> routed (B, R, T, Hd); ``q`` and ``x`` (the layer's query
        and attention input) are not read: the buffered kinds' weights do not depend on the tokens."""
        if self.use_ops:
            return self._route_ops(l, k, v)
        router, plan = self.router, self.plan
        if l == 0:  # one decision per forward pass
            ws = self.layer_weights = [router.weight(m) for m in range(1, router.n_layers)]
            self.mode = "grad" if torch.is_grad_enabled() and (
                k.requires_grad or v.requires_grad or any(w.requires_grad for w in ws)) else "nograd"
            B, T, R, Hd = k.shape
            if self.mode == "nograd" and self.kind.few_token_columns(B, T, Hd) < SMALL_N:
                self.mode, self.small = "small", self.kind.few_token_path(router, self.layout, plan)
            else:
                self.state = BufferState(router, self.layout, plan, k, ws[0].dtype if ws else k.dtype)
        if self.mode == "small":
            return self.small.route(l, k, v, None if l == 0 else self._weight(l))
        st = self.state
        if self.mode == "grad":
            if l == 0:
                self.link = WriteLayer0.apply(k, v, st)
                return k.transpose(1, 2), v.transpose(1, 2)
            b = plan.block_of[l]
            taken = [self._weight(m) for m in plan.taken[b]] if l == plan.leaders[b] else ()
            kr, vr = RouteLayer.apply(k, v, self._weight(l), self.link, st, l, *taken)
            self.link = kr  # the next layer's function consumes it: the backward chain
            return kr, vr
        if l == 0:
            st.write(0, k, v)
            return k.transpose(1, 2), v.transpose(1, 2)
        b = plan.block_of[l]
        taken = [self._weight(m) for m in plan.taken[b]] if l == plan.leaders[b] else ()
        return st.split(st.route_layer(l, k, v, self._weight(l), taken, grad=False))

    def _route_ops(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The same routing as opaque custom ops (``lime_arch.routing.ops``), for torch.compile;
        the previous layer's op hands its token on, which orders the ops in forward and backward."""
        r = self.router
        cfg = (r.spec, r.n_layers, r.R, r.head_dim, -1 if self.block is None else self.block)
        if l == 0:
            ws = self.layer_weights = [r.weight(m) for m in range(1, r.n_layers)]
            self.mode = "grad" if torch.is_grad_enabled() and (
                k.requires_grad or v.requires_grad or any(w.requires_grad for w in ws)) else "nograd"
            self.taken = ops.members_taken(*cfg)
            self.link = ops.route_begin(k, v, *cfg, ws[0].dtype if ws else k.dtype, self.mode == "grad")
            return k.transpose(1, 2), v.transpose(1, 2)
        members = [self._weight(m) for m in self.taken[l]]
        kv, self.link = ops.route_layer(k, v, self._weight(l), self.link, members, *cfg, l, self.mode == "grad")
        return kv[0], kv[1]

    def _weight(self, l: int) -> Tensor:
        return self.layer_weights[l - 1]


class ConcatMixer:
    """The paper's pseudocode: concatenate the whole buffer at every layer, then mix it as the
    router's kind says (``RouterKind.concat_route``: by default its ``dense(l)`` matrix)."""

    def __init__(self, router: Router):
        self.router = router
        self.k_all = self.v_all = None

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.k_all = k if l == 0 else torch.cat([self.k_all, k], dim=2)  # (B, T, (l+1)R, Hd)
        self.v_all = v if l == 0 else torch.cat([self.v_all, v], dim=2)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        return self.router.kind.concat_route(self.router, l, k, v, self.k_all, self.v_all, q, x)


def make_mixer(router: Router, routing_impl: str = "buffer", *, block: int | None = None,
               use_ops: bool | None = None):
    """A fresh mixer for one forward pass: the paper's concatenation, or the router kind's own
    (``RouterKind.make_mixer``). ``block`` overrides the layer-block size of the buffer mixer
    (tests; None lets ``choose_block`` pick it); ``use_ops`` runs it as the compile path's custom
    ops (None: exactly when torch.compile traces). A pruned router runs as its pruned view
    (``Router.executed``: the kept sources and masked weights; the products never see a mask)."""
    router = router.executed()
    if routing_impl == "concat":
        return ConcatMixer(router)
    return router.kind.make_mixer(router, block=block, use_ops=use_ops)
