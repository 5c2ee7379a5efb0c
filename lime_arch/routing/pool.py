"""Pooled tensors of the buffer mixer: the large K/V buffers reused across forward passes on CPU.

A fresh multi-MB tensor per step costs page faults on every first touch (the CPU allocator is
plain malloc; above its mmap threshold every allocation is a new mapping): on the dev VM ~6 us
per 4 KiB page, ~50 ms per step at 128 layers. CUDA has its caching allocator, so the pool is
CPU-only. A tensor is handed back only when no view of it can be alive any more.
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


class Buf:
    """A pooled tensor and a memo of its views (slicing from Python costs microseconds per op)."""

    __slots__ = ("t", "memo")

    def __init__(self, t: Tensor):
        self.t, self.memo = t, {}

    def rows(self, a: int, b: int) -> Tensor:
        """``t[:, a:b]``, memoised."""
        v = self.memo.get((a, b))
        if v is None:
            v = self.memo[(a, b)] = self.t[:, a:b]
        return v


class Pool:
    """Free tensors by (shape, dtype, device), the ``max_tensors`` most recently returned."""

    def __init__(self, max_tensors: int = 8):
        self.free: dict[tuple, list[Buf]] = {}
        self.order: list[tuple] = []
        self.max_tensors = max_tensors

    def get(self, shape, like: Tensor) -> Buf:
        """An uninitialised tensor of ``shape`` (``like``'s dtype and device), reused where possible."""
        key = (tuple(shape), like.dtype, like.device)
        if like.device.type == "cpu" and self.free.get(key):
            self.order.remove(key)
            return self.free[key].pop()
        return Buf(like.new_empty(shape))

    def put(self, b: Buf | None) -> None:
        if b is None or b.t.device.type != "cpu":
            return
        key = (tuple(b.t.shape), b.t.dtype, b.t.device)
        self.free.setdefault(key, []).append(b)
        self.order.append(key)
        while len(self.order) > self.max_tensors:
            old = self.order.pop(0)
            self.free[old].pop(0)


POOL = Pool()
