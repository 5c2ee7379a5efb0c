"""The depth-attention kind (Depth-Attention, arXiv 2606.05014): zero-parameter, token-dependent
routing of the values along depth.

Before layer l attends over the sequence, its query attends over the keys of layers 0..l at the
same token and mixes their values into the value that self-attention then reads:

  a_{t,r}(s) = softmax_s( qbar_{t,r} . k_{s,t,r} / sqrt(Hd) ),  s in S_l (layers 0..l)
  routed v_{l,t,r} = sum_s a_{t,r}(s) v_{s,t,r};   routed k_{l,t,r} = k_{l,t,r} (the layer's own)

- Keys are not mixed: the paper stores the depth-mixed values in place of the original values and
  leaves the keys (and so the sequence attention's scores) as they are.
- The current layer is one of the sources, so layer 0 reads its own value and every layer can keep
  its own (the paper's "keys of earlier layers" read with the layer's own slot included).
- The values mixed are the raw (pre-mixing) values of the earlier layers at this token, as in
  LIMe's buffer: mixing never compounds, and decoding needs no state beyond the KV cache (the
  earlier layers' raw values of the new token are computed in the same forward pass).
- Queries and keys are taken before RoPE. At one position RoPE rotates q and k by the same
  rotation, so q.k is unchanged: the scores are exactly the post-RoPE ones.
- GQA: a value slot exists per KV head, so each KV head r scores with qbar, the mean of its group's
  query heads (one query per KV head; with MHA qbar is the head's own query). This choice is ours:
  the paper reports Qwen3-style GQA models without saying how a group's queries share one slot.
- The scores and softmax run in fp32 or better (under bf16 autocast too); the mix is cast back.
- Step 0 is not the baseline: with no parameters the softmax is whatever the initial keys give.
Memory: per layer the (B, T, R, l+1) weights and the per-source products autograd keeps (views of
the values, no copies): O(L^2 B T R) scalars over the model, against the K/V's O(L B T R Hd).
"""
from __future__ import annotations

import math

import torch

from lime_arch.routing.kinds.base import RouterKind, register_kind

Tensor = torch.Tensor


def depth_scores_query(q: Tensor, R: int) -> Tensor:
    """(B, T, H, Hd) queries -> (B, T, R, Hd): each KV head's group mean."""
    B, T, H, Hd = q.shape
    return q.view(B, T, R, H // R, Hd).mean(dim=3)


def depth_weights(q: Tensor, keys: list[Tensor]) -> Tensor:
    """The softmax over depth (B, T, R, S), in fp32 or better, of one layer's query (B, T, H, Hd)
    against the raw keys (each (B, T, R, Hd)) of its S sources."""
    R, Hd = keys[0].shape[2], keys[0].shape[3]
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 or better for the scores and softmax
    qbar = depth_scores_query(q, R).to(acc)  # (B, T, R, Hd)
    scores = torch.stack([(qbar * k.to(acc)).sum(-1) for k in keys], dim=-1) / math.sqrt(Hd)  # (B, T, R, S)
    return scores.softmax(dim=-1)


def depth_mix(q: Tensor, keys: list[Tensor], values: list[Tensor]) -> Tensor:
    """The depth-mixed value (B, T, R, Hd) of one layer from its query (B, T, H, Hd) and the raw
    keys and values (each (B, T, R, Hd)) of its sources."""
    a = depth_weights(q, keys).to(values[0].dtype)  # (B, T, R, S)
    out = a[..., 0, None] * values[0]
    for s in range(1, len(values)):
        out = out + a[..., s, None] * values[s]
    return out  # (B, T, R, Hd)


class DepthAttentionMixer:
    """Keeps every layer's raw K and V of this pass (references, no copies) and mixes the values."""

    def __init__(self, router):
        self.router = router
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.k.append(k)  # (B, T, R, Hd)
        self.v.append(v)
        if q is None:
            raise ValueError("router depth-attention: the layer's query is needed (mixer.route(l, k, v, q=q))")
        if l == 0:  # one source: the softmax is 1, the layer reads its own value
            return k.transpose(1, 2), v.transpose(1, 2)
        src = self.router.sources(l)
        mixed = depth_mix(q, [self.k[s] for s in src], [self.v[s] for s in src])
        return k.transpose(1, 2), mixed.transpose(1, 2)  # (B, R, T, Hd)


class DepthAttentionKind(RouterKind):
    name = "depth-attention"
    token_dependent = True

    def dense(self, router, l: int) -> Tensor:
        raise NotImplementedError("router kind depth-attention: the mixing depends on the tokens (no dense matrix)")

    def token_mixing(self, router, l: int, q: Tensor, keys: list[Tensor] | None = None,
                     x: Tensor | None = None) -> Tensor:
        """Layer l's value mixing per token (B, T, R, (l+1)R), head r reading slot s*R + r with the
        softmax weight of source s; ``keys`` are the raw keys (B, T, R, Hd) of layers 0..l. The
        keys themselves are not mixed (each layer keeps its own)."""
        if keys is None:
            raise ValueError("router kind depth-attention: token_mixing needs the raw keys of layers 0..l")
        R = router.R
        src = router.sources(l)
        a = depth_weights(q, [keys[s] for s in src])  # (B, T, R, S)
        out = a.new_zeros(*a.shape[:2], R, (l + 1) * R)  # (B, T, R, (l+1)R)
        eye = torch.eye(R, dtype=a.dtype, device=a.device)
        for i, s in enumerate(src):
            out[..., s * R:(s + 1) * R] = a[..., i, None] * eye  # head r reads its own head of layer s
        return out

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0  # one source: its own value, nothing to score
        n = len(router.sources(l))
        return 2 * router.R * n * router.head_dim  # the scores q.k and the value mix; keys are not mixed

    def make_mixer(self, router, *, block=None, use_ops=None) -> DepthAttentionMixer:
        return DepthAttentionMixer(router)

    def concat_route(self, router, l, k, v, k_all, v_all, q, x=None):
        R = k.shape[2]
        src = router.sources(l)
        keys = [k_all[:, :, s * R:(s + 1) * R] for s in src]  # (B, T, R, Hd) each
        values = [v_all[:, :, s * R:(s + 1) * R] for s in src]
        return k.transpose(1, 2), depth_mix(q, keys, values).transpose(1, 2)

    def activation_elems(self, router, B: int, T: int) -> tuple[int, int]:
        """Kept: every layer's raw K and V (later layers score the keys and mix the values), each
        routed layer's group-mean query (B, T, R, Hd) and its softmax over depth (B, T, R, l+1), which
        the backward of the scores and of the mix read (the per-source products keep views, no
        copies). Transient: the deepest layer's softmax gradient and its scores' (2 x (B, T, R, L))."""
        L, R, Hd = router.n_layers, router.R, router.head_dim
        kept = L * 2 * B * T * R * Hd + (L - 1) * B * T * R * Hd + sum(B * T * R * (l + 1) for l in range(1, L))
        return kept, 2 * B * T * R * L

    def traffic_slots(self, router, block) -> int:
        n = router.n_layers
        return 3 * n * (n + 1) // 2  # every layer reads the keys and values of its sources, writes one value


DEPTH_ATTENTION = register_kind(DepthAttentionKind())
