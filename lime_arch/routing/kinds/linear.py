"""The linear kind (full, first-j, last-j, dilated-d): a learned (R, |S_l|*R) weight per layer;
routed head h mixes every head of every source, ``routed_l[h] = sum_{s, h'} W[h, s*R + h'] KV_s[h']``.

Buffer layout: D = 1, R rows per slot (one per head), N = 2*B*T*Hd; the operand is (1, R, |S|R).
Decoding (``SlotTensorPath``): each layer's [K|V] goes once into its rows of a pooled slot tensor
and the product runs over row ranges of it, so nothing is concatenated per layer.
"""
from __future__ import annotations

import torch

from lime_arch.routing.kinds.base import register_kind
from lime_arch.routing.kinds.buffered import BufferedKind, split_small
from lime_arch.routing.plan import Layout, Plan
from lime_arch.routing.pool import POOL, Buf

Tensor = torch.Tensor


class SlotTensorPath:
    """No autograd, a few tokens (decoding): each layer's [K|V] goes once into its rows of a
    (L*R, B*T*2Hd) slot tensor and the product runs over row ranges of it (full and last-j: one
    slice, first-j: two), so nothing is concatenated per layer (re-copying every earlier slot at
    every layer cost full routing ~10% of decode speed at batch 8). The slot tensor is pooled on
    CPU with its views memoised: a decode step is ~10 small ops per layer."""

    def __init__(self, n_layers: int, layout: Layout, plan: Plan):
        self.L, self.layout, self.plan = n_layers, layout, plan
        self.buf: Buf | None = None  # the pooled slot tensor of this pass
        self.views: list | None = None  # and its memoised per-layer views

    def _build_views(self, B: int, T: int, R: int, Hd: int) -> list:
        """Per layer of the slot tensor: its [K|V] write view in (B, T, R, 2Hd) order, and the
        source row runs as (col0, col1, rows)."""
        t, out = self.buf.t, []
        for l in range(self.L):
            slot = t[l * R:(l + 1) * R].view(R, B, T, 2 * Hd).permute(1, 2, 0, 3)
            out.append((slot, [(c0, c1, t[r0:r1]) for c0, c1, r0, r1 in self.plan.source_runs[l]]))
        return out

    def route(self, l: int, k: Tensor, v: Tensor, w: Tensor | None) -> tuple[Tensor, Tensor]:
        B, T, R, Hd = k.shape
        L = self.L
        if l == 0:
            self.buf = POOL.get((L * R, B * T * 2 * Hd), k)
            key = ("small", self.plan, B, T, R, Hd)
            self.views = self.buf.memo.get(key)
            if self.views is None:
                self.views = self.buf.memo[key] = self._build_views(B, T, R, Hd)
        slot, runs = self.views[l]
        torch.cat((k, v), dim=-1, out=slot)  # one op writes both halves of the slot
        if l == L - 1:  # every read of this pass is below; the outputs are fresh tensors
            POOL.put(self.buf)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        if w.dtype != k.dtype:
            w = w.to(k.dtype)
        if len(runs) == 1:
            out = torch.mm(w, runs[0][2])  # (R, B*T*2Hd)
        else:
            cols = self.layout.column_slices(w, runs)
            out = torch.mm(cols[0], runs[0][2])
            for a, (_, _, x) in zip(cols[1:], runs[1:]):
                out.addmm_(a, x)
        return split_small(out, B, T, R, Hd)


class LinearKind(BufferedKind):
    name = "linear"
    prunable = True  # top-p pruning of |w| (lime_arch.prune; the paper's Table 5 prunes full)

    def prune_mass(self, w: Tensor) -> Tensor:
        return w.abs()

    def operand_shape(self, router, l: int) -> tuple[int, ...]:
        return (router.R, len(router.sources(l)) * router.R)

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0
        R = router.R
        return 2 * R * len(router.sources(l)) * R * router.head_dim  # K and V

    def operand(self, w: Tensor) -> Tensor:
        return w.unsqueeze(0)  # (1, R, |S|R)

    def weight_grad(self, g: Tensor, dtype: torch.dtype) -> Tensor:
        return g.squeeze(0).to(dtype)

    def few_token_path(self, router, layout: Layout, plan: Plan) -> SlotTensorPath:
        return SlotTensorPath(router.n_layers, layout, plan)


LINEAR = register_kind(LinearKind())
