"""What the buffered kinds share (linear, same-head, per-dim): learned weights, multiplied over
views of the preallocated K/V buffer by ``BufferMixer`` (``lime_arch.routing.mixers``), whose
autograd functions (``lime_arch.routing.state``) and compile ops (``lime_arch.routing.ops``) are
generic over the kind object: a new buffered kind is one module with a ``BufferedKind`` subclass.

The buffer is (D, L*rows_per_slot, N): D the batch dimension of the products, a slot (one layer's
K and V) ``slot_rows(R)`` rows, N columns with K and V of a head side by side. Layer l's routed
K/V are ``operand(weight(l)) (D, out_rows, |S_l|*rows_per_slot) @ buf[source rows]``, with
out_rows = rows_per_slot. What a buffered kind defines:

  operand_shape, macs_per_token, set_identity (init), head_blocks (dense)   the router's side
  slot_rows, buffer_dims        rows per slot and (D, N) for a batch of B x T tokens
  operand, weight_grad          weight(l) -> (D, out_rows, |S|*rows_per_slot), and a gradient back
  head_stride, packed_head_stride, kv_views, split, kv_pair, routed_pair, routed_like
                                K/V as views of (D, rows, N) tensors, in buffer order (B, T, R, Hd)
                                or routed order (B, R, T, Hd); ``kv_pair``/``routed_like`` give the
                                compile ops' outputs and fake-kernel shapes (strides from sizes)
  few_token_columns, few_token_path, small_product
                                decoding without autograd: below ``mixers.SMALL_N`` columns the
                                fewest ops win (``ListPath``: concatenate the sources per layer)
  copies_routed, operand_is_view   per-dim copies routed K/V into attention's layout; its operand
                                is a contiguous copy, not a view of the parameter
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch

from lime_arch.routing.kinds.base import RouterKind, average_dense
from lime_arch.routing.mixers import BufferMixer
from lime_arch.routing.plan import Layout, Plan, layout_for, plan_for

Tensor = torch.Tensor


def split_small(out: Tensor, B: int, T: int, R: int, Hd: int) -> tuple[Tensor, Tensor]:
    """Routed (R, B*T*2Hd) rows of [K|V] -> K, V as (B, R, T, Hd) views."""
    size, stride = (B, R, T, Hd), (T * 2 * Hd, B * T * 2 * Hd, 2 * Hd, 1)
    return out.as_strided(size, stride), out.as_strided(size, stride, Hd)


class ListPath:
    """No autograd, a few tokens (decoding): [K|V] of every slot in a list; each layer concatenates
    its sources and multiplies (``small_product``)."""

    def __init__(self, kind: BufferedKind, plan: Plan):
        self.kind, self.plan = kind, plan
        self.slot_kv: list[Tensor] = []  # per slot: [K|V] as (R, B, T, 2Hd)

    def route(self, l: int, k: Tensor, v: Tensor, w: Tensor | None) -> tuple[Tensor, Tensor]:
        B, T, R, Hd = k.shape
        self.slot_kv.append(torch.cat((k, v), dim=-1).permute(2, 0, 1, 3))  # (R, B, T, 2Hd) view
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        src = self.plan.sources[l]
        x = torch.cat([self.slot_kv[s] for s in src], dim=0)  # (|S|R, B, T, 2Hd), contiguous
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        return split_small(self.kind.small_product(w, x, len(src), B, T, R, Hd), B, T, R, Hd)


class BufferedKind(RouterKind):
    """A learned kind on the K/V buffer (see the module docstring). The defaults are the linear
    layout's: R rows per slot, heads along the rows."""

    learned = True
    copies_routed: ClassVar[bool] = False  # routed K/V are copied once into attention's layout
    operand_is_view: ClassVar[bool] = True  # operand(w) is a view of w (memoised per parameter)

    # -- the router's side -----------------------------------------------------------------------
    def operand_shape(self, router, l: int) -> tuple[int, ...]:
        raise NotImplementedError

    def init_weight(self, router, l: int) -> Tensor:
        """The paper's init (arXiv 2502.09245): U(-b, b), b = sqrt(3 / fan_in), then identity on
        the current slot. ``identity`` init zeroes the rest, so step 0 is exactly the baseline."""
        shape = router.weight_shape(l)
        b = math.sqrt(3.0 / shape[1])
        w = torch.empty(shape).uniform_(-b, b) if router.init == "paper" else torch.zeros(shape)
        self.set_identity(w, router.sources(l).index(l), router.R)
        return w

    def set_identity(self, w: Tensor, cur: int, R: int) -> None:
        """Make source position ``cur`` pass its heads through unchanged: an identity block."""
        eye = torch.eye(R)
        w[:, cur * R:(cur + 1) * R] = eye if w.dim() == 2 else eye[..., None]

    def head_blocks(self, w: Tensor, R: int) -> Tensor:
        """weight(l) as (R, |S|*R[, Hd]): one (R, R) block per source."""
        return w

    def dense(self, router, l: int) -> Tensor:
        R = router.R
        w = router.weight(l)
        if w is None:  # layer 0 reads its own K/V
            return average_dense(R, l, [l])
        w = self.head_blocks(w, R)
        out = w.new_zeros((R, (l + 1) * R) + tuple(w.shape[2:]))
        for i, s in enumerate(router.sources(l)):
            out[:, s * R:(s + 1) * R] = w[:, i * R:(i + 1) * R]
        return out

    # -- the buffer layout -----------------------------------------------------------------------
    def slot_rows(self, R: int) -> int:
        """Rows of one slot in the buffer, and output rows of a layer's product."""
        return R

    def buffer_dims(self, B: int, T: int, R: int, Hd: int) -> tuple[int, int]:
        """(D, N): the products' batch dimension and the buffer's columns."""
        return 1, 2 * B * T * Hd

    def rows_shape(self, B, T, R: int, Hd: int, rows: int) -> tuple:
        """(D, rows, N) of a buffer-shaped tensor with ``rows`` rows."""
        D, N = self.buffer_dims(B, T, R, Hd)
        return (D, rows, N)

    def operand(self, w: Tensor) -> Tensor:
        """weight(l) as (D, out_rows, |S|*rows_per_slot) (used inside autograd functions)."""
        raise NotImplementedError

    def weight_grad(self, g: Tensor, dtype: torch.dtype) -> Tensor:
        """A (D, out_rows, |S|*rows_per_slot) gradient back in the shape of ``weight(l)``."""
        raise NotImplementedError

    def head_stride(self, t: Tensor) -> int:
        """The stride between a slot's heads in a (D, rows, N) tensor."""
        return t.stride(1)

    def packed_head_stride(self, shape) -> int:
        """``head_stride`` of a contiguous tensor of ``shape``, from the sizes alone (fake kernels)."""
        return shape[2]

    def kv_views(self, t: Tensor, B: int, T: int, R: int, Hd: int, out_order: bool) -> tuple[Tensor, Tensor]:
        """(D, rows, N) -> K, V views: (B, T, R, Hd) (buffer order) or (B, R, T, Hd) (routed order),
        as two ``as_strided`` views (one op each; view + permute + unbind would be three)."""
        off, sr = t.storage_offset(), self.head_stride(t)
        size, stride = ((B, R, T, Hd), (T * Hd, sr, Hd, 1)) if out_order else ((B, T, R, Hd), (T * Hd, Hd, sr, 1))
        return t.as_strided(size, stride, off), t.as_strided(size, stride, off + B * T * Hd)

    def split(self, out: Tensor, B: int, T: int, R: int, Hd: int) -> tuple[Tensor, Tensor]:
        """Routed (D, out_rows, N) -> K, V as (B, R, T, Hd) with Hd contiguous."""
        return self.kv_views(out, B, T, R, Hd, True)

    def kv_pair(self, t: Tensor, B, T, R: int, Hd: int, out_order: bool) -> Tensor:
        """A contiguous (D, rows, N) tensor of K|V as one (2, B, R, T, Hd) view (``out_order``,
        routed outputs) or (2, B, T, R, Hd) (buffer order, slot gradients): ``kv_views`` as one
        tensor. Strides follow from the sizes, so the fake kernels give the real strides."""
        sr = self.packed_head_stride(t.shape)
        if out_order:
            return t.as_strided((2, B, R, T, Hd), (B * T * Hd, T * Hd, sr, Hd, 1))
        return t.as_strided((2, B, T, R, Hd), (B * T * Hd, T * Hd, Hd, sr, 1))

    def routed_pair(self, out: Tensor, B, T, R: int, Hd: int) -> Tensor:
        """Routed (D, out_rows, N) -> (2, B, R, T, Hd), as a compile op returns it."""
        return self.kv_pair(out.contiguous(), B, T, R, Hd, True)

    def routed_like(self, k: Tensor, B, T, R: int, Hd: int) -> Tensor:
        """An empty tensor shaped and strided as ``routed_pair``'s result (the fake kernel's)."""
        return self.kv_pair(k.new_empty(self.rows_shape(B, T, R, Hd, self.slot_rows(R))), B, T, R, Hd, True)

    # -- decoding (no autograd, a few tokens) -----------------------------------------------------
    def few_token_columns(self, B: int, T: int, Hd: int) -> int:
        """The size the few-token threshold (``mixers.SMALL_N``) is compared with."""
        return 2 * B * T * Hd

    def few_token_path(self, router, layout: Layout, plan: Plan):
        """This pass's few-token router: ``route(l, k, v, weight(l) or None)``."""
        return ListPath(self, plan)

    def small_product(self, w: Tensor, x: Tensor, n_src: int, B: int, T: int, R: int, Hd: int) -> Tensor:
        """``ListPath``'s product: w = weight(l), x the sources' [K|V] (|S|R, B, T, 2Hd) -> routed
        (R, B*T*2Hd)."""
        raise NotImplementedError

    # -- execution --------------------------------------------------------------------------------
    def make_mixer(self, router, *, block: int | None = None, use_ops: bool | None = None) -> BufferMixer:
        return BufferMixer(router, block, use_ops)

    def traffic_slots(self, router, block: int | None) -> int:
        return plan_for(router, layout_for(router), block).traffic(copies=self.copies_routed).slots

    def activation_elems(self, router, B: int, T: int) -> tuple[int, int]:
        """Kept: the buffer, one copy of every layer's raw K/V. Transient: the backward's K/V
        gradient buffer of the same size (the blocked routers'; an upper bound for the others)."""
        slots = router.n_layers * 2 * B * T * router.R * router.head_dim
        return slots, slots
