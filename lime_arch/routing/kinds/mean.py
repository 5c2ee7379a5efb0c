"""The mean kind (the ``average`` router): the fixed uniform average of the sources; no weights."""
from __future__ import annotations

import torch

from lime_arch.routing.kinds.base import RouterKind, average_dense, register_kind

Tensor = torch.Tensor


class MeanMixer:
    """Uniform average of layers 0..l as a running sum: O(1) work per layer, no buffer. (Every
    registered mean router reads all of 0..l; a mean over other sources would need the buffer.)"""

    def __init__(self, router):
        self.router = router
        self.sum_k = self.sum_v = None

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.sum_k = k if l == 0 else self.sum_k + k  # (B, T, R, Hd)
        self.sum_v = v if l == 0 else self.sum_v + v
        return (self.sum_k / (l + 1)).transpose(1, 2), (self.sum_v / (l + 1)).transpose(1, 2)


class MeanKind(RouterKind):
    name = "mean"

    def dense(self, router, l: int) -> Tensor:
        return average_dense(router.R, l, router.sources(l))

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0
        return 2 * router.R * len(router.sources(l)) * router.head_dim  # K and V: one add per source

    def make_mixer(self, router, *, block=None, use_ops=None) -> MeanMixer:
        return MeanMixer(router)

    def traffic_slots(self, router, block) -> int:
        return 10 * router.n_layers  # forward: an add (3 slots) and a divide (2); backward about the same


MEAN = register_kind(MeanKind())
