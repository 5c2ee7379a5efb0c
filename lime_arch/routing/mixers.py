"""Executing the routing: the K/V buffer and its mixers.

Every mixer maps raw K/V of the current tokens (B, T, R, Hd) to routed K/V (B, R, T, Hd).
Routing is per position, so the same code serves training, prefill and one-token decoding.

Design of ``BufferMixer`` (learned routers; why it is fast and lean):

- The buffer. Every layer writes its raw, pre-RoPE K and V once into a preallocated tensor
  ``buf`` of shape (D, L*rs, N); K and V of a head sit side by side in one row, so one product
  mixes both. Three layouts, chosen from the router (``Layout``):
    linear  (full, first-j, last-j, dilated-d): D = 1,  rs = R rows per slot, N = 2*B*T*Hd;
    perdim  (per-dim):                          D = Hd, rs = R,               N = 2*B*T;
    diag    (no-head-mix: one weight per slot, same head index): D = R (a batch per head),
            rs = 1, N = 2*B*T*Hd, so the product does R*|S| MACs per column, not the R*|S|*R of
            the dense block-diagonal matrix.
  Routing layer l is ``W_l (D, Mo, |S_l|*rs) @ buf[source rows]`` (Mo = R, or 1 for diag) on
  views of the buffer: no concatenation, memory O(L), not O(L^2). On CPU the buffer comes from
  a small pool (``Pool``): a fresh multi-MB tensor per step costs page faults on first touch.
  Gradient-side tensors are not pooled (they would sit in memory between steps and raise the
  next step's peak).
- Blocking over layers. A product with only Mo output rows streams the buffer prefix once per
  layer and runs far below matmul speed (on the dev CPU ~8 GFLOP/s at 8 rows vs 35-50 at 64+).
  Layers are grouped in blocks of ``m``. When layer l0 starts block b every slot below l0 is
  written, so that layer also computes ``P_b = W_pre @ buf[U_b]`` once: the contribution of the
  old slots U_b (the union of the block's sources below l0) to every member of the block (the
  layers with such sources), m*Mo rows in one product. Each layer then adds only its in-block
  sources. ``choose_block`` picks m from a traffic model of the router's source sets (16 for
  full at 64-128 layers, 8 at 16; no blocking, m = L, for last-j), with m*Mo <= 128.
Code: ``kvplan`` (layouts, blocks, per-layer plans), ``kvstate`` (pooled tensors, the per-pass
buffer state, the autograd functions), this module (the mixers).

- Autograd: one custom function per layer. Writing into a tensor in place breaks autograd's
  saved-tensor checks, so ``LayerFn`` (layers >= 1) and ``Write0`` (layer 0, which reads its
  K/V unrouted) do the bookkeeping themselves. Layer l's function consumes layer l-1's routed K
  (the *link*), so in backward layer l runs only after every later layer. A router weight enters
  exactly one function as it is (no autograd op in between); the first layer of a block also
  takes the other members' weights. Backward of layer l:
    * store g_l (its output gradient) into its rows of the block's grad-out buffer G_b, and
      dW of its in-block columns, g_l @ buf[in-block rows]^T;
    * at a block's first layer (every later layer of the block is done): the old-slot part with
      two products of m*Mo rows, dW_pre = G_b @ buf[U_b]^T and grad[U_b] += W_pre^T G_b (the only
      read-modify-write of the K/V gradient buffer, once per block), and the members' whole dW;
    * slot l's gradient, computed once: every reader of slot l is done, so
      grad_l = grad[l] + W_in(l)^T @ G_b[readers of l], one product over the stacked in-block
      weights ``W_in`` of the block (filled in forward), handed out as a fresh tensor.
  G_b starts at zero, so a layer whose output got no gradient contributes nothing (a partial
  forward stays exact). G_b and W_in are dropped at the block's first layer; at layer 0 the
  buffer goes back to the pool.
- Memory over the baseline: one copy of the raw K/V, one block of routed K/V in flight, and
  during backward the K/V gradient buffer (blocked routers only) and G_b of one block; the
  paper's concatenation holds O(L^2).
- Python overhead matters at these sizes (a view op from Python costs microseconds, more with
  cold caches inside a real step): per-layer K/V views of the pooled buffer are memoised on it,
  router weights' (D, Mo, cols) views are memoised per parameter (``Layout.views``), and K/V
  views are made with ``as_strided``.
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
- ``ConcatMixer`` is the paper's pseudocode (grow the buffer by concatenation at every layer,
  multiply with the dense router): the benchmark's peer and an independent reference.
Source lists of a router must be sorted (all registered routers' are); plans are cached on the
router per block size.
"""
from __future__ import annotations

import torch

from lime_arch.routers import Router
from lime_arch.routing.plan import Layout, plan_for
from lime_arch.routing.state import POOL, Buf, BufferState, LayerFn, Write0

Tensor = torch.Tensor

SMALL_N = 4096  # below this many columns (D * N) no-grad routing takes the few-ops list path


def _split_small(out: Tensor, B: int, T: int, R: int, Hd: int) -> tuple[Tensor, Tensor]:
    """Routed (R, B*T*2Hd) rows of [K|V] -> K, V as (B, R, T, Hd) views."""
    size, stride = (B, R, T, Hd), (T * 2 * Hd, B * T * 2 * Hd, 2 * Hd, 1)
    return out.as_strided(size, stride), out.as_strided(size, stride, Hd)


class IdentityMixer:
    def __init__(self, router: Router):
        self.router = router

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k.transpose(1, 2), v.transpose(1, 2)


class MeanMixer:
    """Uniform average of layers 0..l as a running sum: O(1) work per layer."""

    def __init__(self, router: Router):
        self.router = router
        self.sk = self.sv = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.sk = k if l == 0 else self.sk + k
        self.sv = v if l == 0 else self.sv + v
        return (self.sk / (l + 1)).transpose(1, 2), (self.sv / (l + 1)).transpose(1, 2)


class BufferMixer:
    """Learned routers (linear, same-head and per-dim) over the preallocated, blocked buffer."""

    def __init__(self, router: Router, block: int | None = None):
        self.router = router
        self.lay = router.__dict__.get("_lime_layout")
        if self.lay is None:
            self.lay = router.__dict__["_lime_layout"] = Layout(router)
        self.wlist: list[Tensor] | None = None
        self.plan = plan_for(router, self.lay, block)
        self.state: BufferState | None = None
        self.link: Tensor | None = None  # what the next layer's autograd function consumes
        self.mode = "grad"
        self.kvs: list[Tensor] = []
        self.sbuf: Buf | None = None
        self.small: list | None = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        router, plan = self.router, self.plan
        if l == 0:  # one decision per forward pass
            self.wlist = list(router.weights) if self.lay.direct else None
            ps = self.wlist if self.wlist is not None else list(router.parameters())
            self.mode = "grad" if torch.is_grad_enabled() and (
                k.requires_grad or v.requires_grad or any(p.requires_grad for p in ps)) else "nograd"
            B, T, R, Hd = k.shape
            if self.mode == "nograd" and 2 * B * T * Hd * (Hd if self.lay.kind == "perdim" else 1) < SMALL_N:
                self.mode, self.kvs = "small", []
            else:
                self.state = BufferState(router, self.lay, plan, k, ps[0].dtype if ps else k.dtype)
        if self.mode == "small":
            return self._route_small(l, k, v)
        st = self.state
        if self.mode == "grad":
            if l == 0:
                self.link = Write0.apply(k, v, st)
                return k.transpose(1, 2), v.transpose(1, 2)
            b = plan.block_of[l]
            ws = [self._weight(m) for m in plan.others[b]] if l == plan.blocks[b].l0 else ()
            kr, vr = LayerFn.apply(k, v, self._weight(l), self.link, st, l, *ws)
            self.link = kr  # the next layer's function consumes it: the backward chain
            return kr, vr
        st.write(l, k, v)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        b, lay = plan.block_of[l], self.lay
        blk = plan.blocks[b]
        if l == blk.l0 and blk.members:
            st.prefix_forward(b, [lay.views(self._weight(m), plan.n_pre[m])[0] for m in blk.members])
        return st.split(st.route_forward(lay.views(self._weight(l), plan.n_pre[l])[1], l))

    def _weight(self, l: int) -> Tensor:
        return self.wlist[l - 1] if self.wlist is not None else self.router.weight(l)

    def _small_views(self, B: int, T: int, R: int, Hd: int) -> list:
        """Per layer of the slot tensor: its [K|V] write view in (B, T, R, 2Hd) order, and the
        source row runs as (col0, col1, rows)."""
        t, out = self.sbuf.t, []
        for l in range(self.router.n_layers):
            slot = t[l * R:(l + 1) * R].view(R, B, T, 2 * Hd).permute(1, 2, 0, 3)
            out.append((slot, [(c0, c1, t[r0:r1]) for c0, c1, r0, r1 in self.plan.all_runs[l]]))
        return out

    def _route_small(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """No autograd, a few tokens (decoding). Linear routers: each layer's [K|V] goes once into
        its rows of a (L*R, B*T*2Hd) slot tensor and the product runs over row ranges of it (full
        and last-j: one slice, first-j: two), so nothing is concatenated per layer (re-copying
        every earlier slot at every layer cost full routing ~10% of decode speed at batch 8).
        Same-head and per-dim routers keep [K|V] in a list and concatenate their sources."""
        B, T, R, Hd = k.shape
        if self.lay.kind == "linear":
            L = self.router.n_layers
            if l == 0:  # pooled on CPU, with its views memoised: a decode step is ~10 small ops per layer
                self.sbuf = POOL.get((L * R, B * T * 2 * Hd), k)
                self.small = self.sbuf.memo.get(("small", self.plan, B, T, R, Hd))
                if self.small is None:
                    self.small = self.sbuf.memo[("small", self.plan, B, T, R, Hd)] = self._small_views(B, T, R, Hd)
            sv, runs = self.small[l]
            torch.cat((k, v), dim=-1, out=sv)  # one op writes both halves of the slot
            if l == L - 1:  # every read of this pass is below; the outputs are fresh tensors
                POOL.put(self.sbuf)
            if l == 0:
                return k.transpose(1, 2), v.transpose(1, 2)
            w = self._weight(l)
            if w.dtype != k.dtype:
                w = w.to(k.dtype)
            if len(runs) == 1:
                out = torch.mm(w, runs[0][2])
            else:
                ws = self.lay.col_slices(w, runs)
                out = torch.mm(ws[0], runs[0][2])
                for a, (_, _, x) in zip(ws[1:], runs[1:]):
                    out.addmm_(a, x)
            return _split_small(out, B, T, R, Hd)
        self.kvs.append(torch.cat((k, v), dim=-1).permute(2, 0, 1, 3))  # (R, B, T, 2Hd) view
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        w = self._weight(l)
        src = self.plan.sources[l]
        x = torch.cat([self.kvs[s] for s in src], dim=0)  # (|S|R, B, T, 2Hd), contiguous
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        kind = self.lay.kind
        if kind == "perdim":  # (R, |S|R, Hd), the same weights for K and V
            out = torch.einsum("hcd,cnd->hnd", torch.cat((w, w), dim=-1),
                               x.view(len(src) * R, B * T, 2 * Hd)).contiguous()  # einsum may permute
        elif kind == "diag":  # the same-head parameter (R, |S|): head h reads head h of each source
            out = torch.bmm(w.unsqueeze(1), x.view(len(src), R, -1).transpose(0, 1)).view(R, -1)
        else:  # (R, |S|R)
            out = torch.mm(w, x.view(len(src) * R, -1))  # (R, B*T*2Hd)
        return _split_small(out, B, T, R, Hd)


class ConcatMixer:
    """The paper's pseudocode: concatenate the whole buffer at every layer, then multiply."""

    def __init__(self, router: Router):
        self.router = router
        self.kb = self.vb = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.kb = k if l == 0 else torch.cat([self.kb, k], dim=2)  # (B, T, (l+1)R, Hd)
        self.vb = v if l == 0 else torch.cat([self.vb, v], dim=2)
        if l == 0 or self.router.kind == "identity":
            return k.transpose(1, 2), v.transpose(1, 2)
        d = self.router.dense(l).to(device=k.device, dtype=k.dtype)
        eq = "hc,btcd->bhtd" if d.dim() == 2 else "hcd,btcd->bhtd"
        return torch.einsum(eq, d, self.kb), torch.einsum(eq, d, self.vb)


_MIXERS = {"identity": IdentityMixer, "mean": MeanMixer}


def make_mixer(router: Router, routing_impl: str = "buffer", *, block: int | None = None):
    """A fresh mixer for one forward pass. ``block`` overrides the layer-block size of the buffer
    mixer (tests; None lets ``choose_block`` pick it)."""
    if routing_impl == "concat":
        return ConcatMixer(router)
    if router.kind in ("linear", "perdim"):
        return BufferMixer(router, block)
    return _MIXERS[router.kind](router)
