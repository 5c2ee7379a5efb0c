"""The per-dim kind: a learned (R, |S_l|*R, Hd) weight per layer, an Hd-vector per (routed head,
source head): ``routed_l[h][d] = sum_{s, h'} W[h, s*R + h', d] KV_s[h'][d]``.

Buffer layout: D = Hd, R rows per slot, N = 2*B*T; the operand is (Hd, R, |S|R), made contiguous
per layer (bmm needs a unit stride per matrix), so it is a copy, not a view of the parameter. The
product's output has Hd as its batch dimension, so routed K/V are copied once into (B, R, T, Hd)
order with Hd contiguous (attention kernels need that; SDPA would otherwise fall back to its
slow math path).
"""
from __future__ import annotations

import torch

from lime_arch.routing.kinds.base import register_kind
from lime_arch.routing.kinds.buffered import BufferedKind

Tensor = torch.Tensor


class PerDimKind(BufferedKind):
    name = "per-dim"
    copies_routed = True
    operand_is_view = False

    def operand_shape(self, router, l: int) -> tuple[int, ...]:
        return (router.R, len(router.sources(l)) * router.R, router.head_dim)

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0
        R = router.R
        return 2 * R * len(router.sources(l)) * R * router.head_dim  # K and V

    def buffer_dims(self, B: int, T: int, R: int, Hd: int) -> tuple[int, int]:
        return Hd, 2 * B * T

    def operand(self, w: Tensor) -> Tensor:
        return w.permute(2, 0, 1).contiguous()  # (Hd, R, |S|R)

    def weight_grad(self, g: Tensor, dtype: torch.dtype) -> Tensor:
        return g.permute(1, 2, 0).to(dtype)

    def kv_views(self, t: Tensor, B: int, T: int, R: int, Hd: int, out_order: bool) -> tuple[Tensor, Tensor]:
        off, sd, sr = t.storage_offset(), t.stride(0), t.stride(1)  # t: (Hd, R, 2BT)
        size, stride = ((B, R, T, Hd), (T, sr, 1, sd)) if out_order else ((B, T, R, Hd), (T, 1, sr, sd))
        return t.as_strided(size, stride, off), t.as_strided(size, stride, off + B * T)

    def split(self, out: Tensor, B: int, T: int, R: int, Hd: int) -> tuple[Tensor, Tensor]:
        kv = out.new_empty(2, B, R, T, Hd)  # Hd is the product's batch dimension: one copy
        kv.copy_(out.view(Hd, R, 2, B, T).permute(2, 3, 1, 4, 0))
        return kv.unbind(0)

    def kv_pair(self, t: Tensor, B, T, R: int, Hd: int, out_order: bool) -> Tensor:
        sd, sr = R * 2 * B * T, 2 * B * T  # t: (Hd, R, 2BT), contiguous
        if out_order:
            return t.as_strided((2, B, R, T, Hd), (B * T, T, sr, 1, sd))
        return t.as_strided((2, B, T, R, Hd), (B * T, T, 1, sr, sd))

    def routed_pair(self, out: Tensor, B, T, R: int, Hd: int) -> Tensor:
        return torch.stack(self.split(out, B, T, R, Hd))

    def routed_like(self, k: Tensor, B, T, R: int, Hd: int) -> Tensor:
        return k.new_empty(2, B, R, T, Hd)

    def few_token_columns(self, B: int, T: int, Hd: int) -> int:
        return 2 * B * T * Hd * Hd

    def small_product(self, w: Tensor, x: Tensor, n_src: int, B: int, T: int, R: int, Hd: int) -> Tensor:
        # (R, |S|R, Hd), the same weights for K and V; einsum may permute its output
        return torch.einsum("hcd,cnd->hnd", torch.cat((w, w), dim=-1), x.view(n_src * R, B * T, 2 * Hd)).contiguous()


PER_DIM = register_kind(PerDimKind())
