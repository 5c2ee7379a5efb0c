"""The identity kind (the ``none`` router, plain LLaMA): layer l reads its own K/V; no weights."""
from __future__ import annotations

import torch

from lime_arch.routing.kinds.base import RouterKind, average_dense, register_kind

Tensor = torch.Tensor


class IdentityMixer:
    """Each layer reads its own K/V."""

    def __init__(self, router):
        self.router = router

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return k.transpose(1, 2), v.transpose(1, 2)  # (B, R, T, Hd)


class IdentityKind(RouterKind):
    name = "identity"

    def dense(self, router, l: int) -> Tensor:
        return average_dense(router.R, l, [l])

    def macs_per_token(self, router, l: int) -> int:
        return 0

    def make_mixer(self, router, *, block=None, use_ops=None) -> IdentityMixer:
        return IdentityMixer(router)

    def concat_route(self, router, l, k, v, k_all, v_all, q, x=None):
        return k.transpose(1, 2), v.transpose(1, 2)  # exactly the layer's own K/V, as the mixer

    def traffic_slots(self, router, block) -> int:
        return 0  # moves nothing


IDENTITY = register_kind(IdentityKind())
