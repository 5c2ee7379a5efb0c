"""Executing the routing: the K/V buffer and its mixers.

Every mixer maps the raw K/V of the current tokens (B, T, R, Hd) to routed K/V (B, R, T, Hd).
Routing is per position, so the same code serves training, prefill and one-token decoding. The
mixer is chosen from the router's kind alone (``make_mixer``) and multiplies exactly what the
router's ``weight(l)`` returns. docs/ARCHITECTURE.md, "Routing internals", walks through this.

How ``BufferMixer`` (the learned kinds) is fast and lean:

- The buffer. Every layer writes its raw, pre-RoPE K and V once into a preallocated tensor of
  shape (D, L*rows_per_slot, N); K and V of a head sit side by side in one row, so one product
  mixes both. Three layouts, one per learned kind (``Layout``):
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
- Per-dim: the product's output has Hd as its batch dimension, so routed K/V are copied once
  into (B, R, T, Hd) order with Hd contiguous (attention kernels need that; SDPA would otherwise
  fall back to its slow math path), and its weights are made contiguous per layer (bmm needs a
  unit stride per matrix).
- Without autograd (``no_grad``): the same products, without autograd functions. For a few
  tokens (decoding) the fewest ops win, since there is no bandwidth to save: linear routers
  write each layer's [K|V] once into a pooled (L*R, B*T*2Hd) slot tensor whose views are
  memoised, and multiply row ranges of it (full, last-j: one product per layer; first-j: two);
  same-head and per-dim routers concatenate their sources from a list.
- The uniform average needs no buffer at all: a running sum divided by l+1.
- Under torch.compile the same work runs as opaque custom ops (``lime_arch.routing.ops``), which
  Dynamo does not trace: ``BufferMixer`` picks them while Dynamo traces (``use_ops``).
- ``ConcatMixer`` is the paper's pseudocode (grow the buffer by concatenation at every layer,
  multiply with the dense router): the benchmark's peer and an independent reference.
Source lists of a router must be sorted (all registered routers' are); plans are cached on the
router per block size.
"""
from __future__ import annotations

import torch

from lime_arch.routers import Router, RouterKind
from lime_arch.routing import ops
from lime_arch.routing.plan import layout_for, plan_for
from lime_arch.routing.pool import POOL, Buf
from lime_arch.routing.state import BufferState, RouteLayer, WriteLayer0

Tensor = torch.Tensor

SMALL_N = 4096  # below this many columns (D * N) no-grad routing takes the few-ops list path


def _split_small(out: Tensor, B: int, T: int, R: int, Hd: int) -> tuple[Tensor, Tensor]:
    """Routed (R, B*T*2Hd) rows of [K|V] -> K, V as (B, R, T, Hd) views."""
    size, stride = (B, R, T, Hd), (T * 2 * Hd, B * T * 2 * Hd, 2 * Hd, 1)
    return out.as_strided(size, stride), out.as_strided(size, stride, Hd)


class IdentityMixer:
    """Each layer reads its own K/V."""

    def __init__(self, router: Router):
        self.router = router

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k.transpose(1, 2), v.transpose(1, 2)


class MeanMixer:
    """Uniform average of layers 0..l as a running sum: O(1) work per layer."""

    def __init__(self, router: Router):
        self.router = router
        self.sum_k = self.sum_v = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.sum_k = k if l == 0 else self.sum_k + k
        self.sum_v = v if l == 0 else self.sum_v + v
        return (self.sum_k / (l + 1)).transpose(1, 2), (self.sum_v / (l + 1)).transpose(1, 2)


class BufferMixer:
    """Learned routers (linear, same-head and per-dim) over the preallocated, blocked buffer."""

    def __init__(self, router: Router, block: int | None = None, use_ops: bool | None = None):
        self.router, self.block = router, block
        # under torch.compile the routing runs as opaque custom ops (``lime_arch.routing.ops``), which
        # build the plan themselves: nothing here may touch the plan caches while Dynamo traces
        self.use_ops = torch.compiler.is_compiling() if use_ops is None else use_ops
        self.layout = None if self.use_ops else layout_for(router)
        self.plan = None if self.use_ops else plan_for(router, self.layout, block)
        self.layer_weights: list[Tensor] = []  # weight(l) of layers 1..L-1, fetched once per pass
        self.state: BufferState | None = None
        self.link: Tensor | None = None  # what the next layer's autograd function (or op) consumes
        self.mode = "grad"
        self.slot_kv: list[Tensor] = []  # few-token path of same-head and per-dim: [K|V] per slot
        self.small_buf: Buf | None = None  # few-token path of linear routers: the pooled slot tensor
        self.small_views: list | None = None  # and its memoised per-layer views
        self.taken: tuple = ()  # ops path: per layer, the other members whose weights it takes

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.use_ops:
            return self._route_ops(l, k, v)
        router, plan = self.router, self.plan
        if l == 0:  # one decision per forward pass
            ws = self.layer_weights = [router.weight(m) for m in range(1, router.n_layers)]
            self.mode = "grad" if torch.is_grad_enabled() and (
                k.requires_grad or v.requires_grad or any(w.requires_grad for w in ws)) else "nograd"
            B, T, R, Hd = k.shape
            if self.mode == "nograd" and 2 * B * T * Hd * (Hd if router.kind is RouterKind.PER_DIM else 1) < SMALL_N:
                self.mode, self.slot_kv = "small", []
            else:
                self.state = BufferState(router, self.layout, plan, k, ws[0].dtype if ws else k.dtype)
        if self.mode == "small":
            return self._route_small(l, k, v)
        st = self.state
        if self.mode == "grad":
            if l == 0:
                self.link = WriteLayer0.apply(k, v, st)
                return k.transpose(1, 2), v.transpose(1, 2)
            b = plan.block_of[l]
            members = [self._weight(m) for m in plan.other_members[b]] if l == plan.blocks[b].l0 else ()
            kr, vr = RouteLayer.apply(k, v, self._weight(l), self.link, st, l, *members)
            self.link = kr  # the next layer's function consumes it: the backward chain
            return kr, vr
        if l == 0:
            st.write(0, k, v)
            return k.transpose(1, 2), v.transpose(1, 2)
        b = plan.block_of[l]
        members = [self._weight(m) for m in plan.other_members[b]] if l == plan.blocks[b].l0 else ()
        return st.split(st.route_layer(l, k, v, self._weight(l), members, grad=False))

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

    def _build_small_views(self, B: int, T: int, R: int, Hd: int) -> list:
        """Per layer of the slot tensor: its [K|V] write view in (B, T, R, 2Hd) order, and the
        source row runs as (col0, col1, rows)."""
        t, out = self.small_buf.t, []
        for l in range(self.router.n_layers):
            slot = t[l * R:(l + 1) * R].view(R, B, T, 2 * Hd).permute(1, 2, 0, 3)
            out.append((slot, [(c0, c1, t[r0:r1]) for c0, c1, r0, r1 in self.plan.source_runs[l]]))
        return out

    def _route_small(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """No autograd, a few tokens (decoding). Linear routers: each layer's [K|V] goes once into
        its rows of a (L*R, B*T*2Hd) slot tensor and the product runs over row ranges of it (full
        and last-j: one slice, first-j: two), so nothing is concatenated per layer (re-copying
        every earlier slot at every layer cost full routing ~10% of decode speed at batch 8).
        Same-head and per-dim routers keep [K|V] in a list and concatenate their sources."""
        B, T, R, Hd = k.shape
        kind = self.router.kind
        if kind is RouterKind.LINEAR:
            L = self.router.n_layers
            if l == 0:  # pooled on CPU, with its views memoised: a decode step is ~10 small ops per layer
                self.small_buf = POOL.get((L * R, B * T * 2 * Hd), k)
                key = ("small", self.plan, B, T, R, Hd)
                self.small_views = self.small_buf.memo.get(key)
                if self.small_views is None:
                    self.small_views = self.small_buf.memo[key] = self._build_small_views(B, T, R, Hd)
            slot, runs = self.small_views[l]
            torch.cat((k, v), dim=-1, out=slot)  # one op writes both halves of the slot
            if l == L - 1:  # every read of this pass is below; the outputs are fresh tensors
                POOL.put(self.small_buf)
            if l == 0:
                return k.transpose(1, 2), v.transpose(1, 2)
            w = self._weight(l)
            if w.dtype != k.dtype:
                w = w.to(k.dtype)
            if len(runs) == 1:
                out = torch.mm(w, runs[0][2])
            else:
                cols = self.layout.column_slices(w, runs)
                out = torch.mm(cols[0], runs[0][2])
                for a, (_, _, x) in zip(cols[1:], runs[1:]):
                    out.addmm_(a, x)
            return _split_small(out, B, T, R, Hd)
        self.slot_kv.append(torch.cat((k, v), dim=-1).permute(2, 0, 1, 3))  # (R, B, T, 2Hd) view
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        w = self._weight(l)
        src = self.plan.sources[l]
        x = torch.cat([self.slot_kv[s] for s in src], dim=0)  # (|S|R, B, T, 2Hd), contiguous
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        if kind is RouterKind.PER_DIM:  # (R, |S|R, Hd), the same weights for K and V
            out = torch.einsum("hcd,cnd->hnd", torch.cat((w, w), dim=-1),
                               x.view(len(src) * R, B * T, 2 * Hd)).contiguous()  # einsum may permute
        else:  # same-head (R, |S|): head h reads head h of each source
            out = torch.bmm(w.unsqueeze(1), x.view(len(src), R, -1).transpose(0, 1)).view(R, -1)
        return _split_small(out, B, T, R, Hd)


class ConcatMixer:
    """The paper's pseudocode: concatenate the whole buffer at every layer, then multiply."""

    def __init__(self, router: Router):
        self.router = router
        self.k_all = self.v_all = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k_all = k if l == 0 else torch.cat([self.k_all, k], dim=2)  # (B, T, (l+1)R, Hd)
        self.v_all = v if l == 0 else torch.cat([self.v_all, v], dim=2)
        if l == 0 or self.router.kind is RouterKind.IDENTITY:
            return k.transpose(1, 2), v.transpose(1, 2)
        d = self.router.dense(l).to(device=k.device, dtype=k.dtype)
        eq = "hc,btcd->bhtd" if d.dim() == 2 else "hcd,btcd->bhtd"
        return torch.einsum(eq, d, self.k_all), torch.einsum(eq, d, self.v_all)


# the parameter-free kinds; every learned kind runs on the buffer
_MIXERS = {RouterKind.IDENTITY: IdentityMixer, RouterKind.MEAN: MeanMixer}


def make_mixer(router: Router, routing_impl: str = "buffer", *, block: int | None = None,
               use_ops: bool | None = None):
    """A fresh mixer for one forward pass. ``block`` overrides the layer-block size of the buffer
    mixer (tests; None lets ``choose_block`` pick it); ``use_ops`` runs it as the compile path's
    custom ops (None: exactly when torch.compile traces)."""
    if routing_impl == "concat":
        return ConcatMixer(router)
    if router.kind.learned:
        return BufferMixer(router, block, use_ops)
    return _MIXERS[router.kind](router)
