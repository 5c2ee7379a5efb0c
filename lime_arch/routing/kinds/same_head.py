"""The same-head kind (no-head-mix): a learned (R, |S_l|) weight per layer; routed head h reads
head h of every source, ``routed_l[h] = sum_s W[h, s] KV_s[h]``.

Buffer layout: D = R (a batch per head), 1 row per slot, N = 2*B*T*Hd; the operand is
(R, 1, |S|), so the product does R*|S| MACs per column, not the R*|S|*R of the dense
block-diagonal matrix.
"""
from __future__ import annotations

import torch

from lime_arch.routing.kinds.base import register_kind
from lime_arch.routing.kinds.buffered import BufferedKind

Tensor = torch.Tensor


class SameHeadKind(BufferedKind):
    name = "same-head"

    def operand_shape(self, router, l: int) -> tuple[int, ...]:
        return (router.R, len(router.sources(l)))

    def set_identity(self, w: Tensor, cur: int, R: int) -> None:
        w[:, cur] = 1.0  # one column per slot (same head index)

    def head_blocks(self, w: Tensor, R: int) -> Tensor:
        """(R, |S|) -> block-diagonal (R, |S|*R)."""
        eye = torch.eye(R, dtype=w.dtype, device=w.device)
        return (w[:, :, None] * eye[:, None, :]).reshape(R, -1)

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0
        return 2 * router.R * len(router.sources(l)) * router.head_dim  # K and V

    def slot_rows(self, R: int) -> int:
        return 1

    def buffer_dims(self, B: int, T: int, R: int, Hd: int) -> tuple[int, int]:
        return R, 2 * B * T * Hd

    def operand(self, w: Tensor) -> Tensor:
        return w.unsqueeze(1)  # (R, |S|) -> (R, 1, |S|)

    def weight_grad(self, g: Tensor, dtype: torch.dtype) -> Tensor:
        return g.squeeze(1).to(dtype)  # (R, 1, |S|) -> (R, |S|)

    def head_stride(self, t: Tensor) -> int:
        return t.stride(0)  # heads are the batch dimension

    def packed_head_stride(self, shape) -> int:
        return shape[1] * shape[2]

    def small_product(self, w: Tensor, x: Tensor, n_src: int, B: int, T: int, R: int, Hd: int) -> Tensor:
        return torch.bmm(w.unsqueeze(1), x.view(n_src, R, -1).transpose(0, 1)).view(R, -1)  # (R, B*T*2Hd)


SAME_HEAD = register_kind(SameHeadKind())
