"""The torch side of every depth mix: ``DepthMixModule``, the ``nn.Module`` base that a depth-mix
class (``lime_arch.depth_mix.registry.DepthMix``, torch-free) is mixed with when it is built, and
``build``, which draws its weights from a fork of the global RNG."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class DepthMixModule(nn.Module):
    """Sets what every depth mix reads: the model's shape, its init std and the arguments (each
    under its name)."""

    def __init__(self, *, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 norm_eps: float, std: float, args: Sequence[int | float] = ()):
        super().__init__()
        if len(args) != len(self.arguments):
            raise ValueError(f"depth mix {self.name}: takes {len(self.arguments)} arguments, got {tuple(args)}")
        self.n_layers, self.d_model, self.n_heads = n_layers, d_model, n_heads
        self.n_kv_heads, self.head_dim, self.norm_eps, self.std = n_kv_heads, head_dim, norm_eps, std
        self.arg_values = tuple(args)
        for a, v in zip(self.arguments, args):
            setattr(self, a.name, v)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build(cls: type, **kw) -> nn.Module:
    """An instance of the depth mix ``cls`` (``DepthMixModule``'s keywords), its weights drawn under
    a forked RNG: the global RNG is left as it was, so the model's other weights do not depend on
    the depth mix."""
    with torch.random.fork_rng(devices=[]):
        return cls(**kw)
