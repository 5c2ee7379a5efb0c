"""The dynamic kind (``dynamic``, ``dynamic-first-j``, ``dynamic-last-j``): routing weights computed
per token from the layer's query (arXiv 2502.09245, Appendix E: "projecting the current hidden
state (queries) against per-layer, per-head learnable keys").

Layer l >= 1 reads the sources S_l (n = |S_l| * R buffered KV heads, columns c = (i, h') for the
i-th source slot and its head h'). Routed KV head h of token t:

    A[t, h, c]  = softmax_c( qbar[t, h] . key_l[h, c] / sqrt(Hd) )            (B, T, R, n)
    mix[t, h]   = sum_c A[t, h, c] KV_c[t]                                    (the same A for K and V)
    routed[t, h] = KV_l[t, h] + g_l[h] * (mix[t, h] - KV_l[t, h])

``qbar[t, h]`` is the layer's query averaged over the query heads that share KV head h (MHA: the
query of head h itself; GQA: its group's mean, so the routed K/V keep the baseline's R heads and
the KV cache keeps its size). The query is taken **before RoPE**: the keys are position-free
vectors, and a rotated query would make the weights depend on the absolute position through the
rotation instead of on the content; after routing, RoPE is applied to the routed keys as for every
kind (all mixed vectors share one position).

``g_l`` (one per routed head) is a gate this project adds: a softmax can never be one-hot, so
without it no init could make step 0 the ``none`` model. ``router_init: identity`` starts it at 0,
which makes step 0 exactly the baseline (``KV + 0 * (...)``: the same bits, as the static identity
init) while the gate's own gradient is nonzero, so the keys start learning after the first step;
``paper`` starts it at 1: exactly the paper's softmax mixing. The keys start U(-1/sqrt(Hd),
1/sqrt(Hd)) under both (nn.Linear's default for a projection of Hd inputs, as the authors' first
code initialised its routing logits): near-uniform weights at step 0.

Layer l's weight is one parameter (R, n*Hd + 1): per routed head its n keys flattened, then its
gate (``split``). Parameters per layer: R * (n * Hd + 1). MACs per token: R*n*Hd for the scores
and 2*R*n*Hd for mixing K and V (the group mean, softmax and gate are O(R*Hd) and left out, as the
accounting leaves out norms).

Memory: the per-token weights are (B, T, R, n) per layer, n up to L*R: more than the layer's K/V
once n > 2*Hd. In training each layer's routing runs under activation checkpointing
(``torch.utils.checkpoint``): forward keeps only its inputs (qbar, the weight, and references to
the sources' raw K/V, which every later layer shares), and backward recomputes one layer's
weights at a time, so at most one layer's (B, T, R, n) exists at any moment.

``dense(l)`` (the token-free matrix the static kinds have) is here the mixing of a token whose
query is zero, ``(1 - g) I + g * uniform``: what the weights are before the query says anything.
The analysis of trained models (``orchestrator.analysis``, the end-of-trial router artifacts)
reads ``token_mixing`` instead: the per-token dense matrices averaged over validation tokens, and
their spread over tokens as a second map.
"""
from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from lime_arch.routing.kinds.base import RouterKind, average_dense, register_kind

Tensor = torch.Tensor


def split(w: Tensor, R: int, Hd: int) -> tuple[Tensor, Tensor]:
    """Layer weight (R, n*Hd + 1) -> keys (R, n, Hd) and gate (R,)."""
    return w[:, :-1].reshape(R, -1, Hd), w[:, -1]


def group_query(q: Tensor, R: int) -> Tensor:
    """The layer's query (B, T, H, Hd) -> its mean per KV head (B, T, R, Hd) (GQA: the heads of a
    group share KV head h = i // (H / R), as attention reads them)."""
    B, T, H, Hd = q.shape
    return q if H == R else q.view(B, T, R, H // R, Hd).mean(dim=3)


def weights(qbar: Tensor, keys: Tensor) -> Tensor:
    """Per-token routing weights: softmax over the n sources of qbar . key / sqrt(Hd) -> (B, T, R, n)."""
    z = torch.einsum("btrd,rcd->btrc", qbar, keys.to(qbar.dtype)) / math.sqrt(keys.shape[-1])  # (B, T, R, n)
    return z.softmax(dim=-1)


def route_layer(qbar: Tensor, w: Tensor, n_src: int, *kv: Tensor) -> tuple[Tensor, Tensor]:
    """One layer's routing: ``kv`` holds the K of every source slot, then their V, then the layer's own
    K and V (each (B, T, R, Hd)); returns routed K and V (B, T, R, Hd) as two tensors (one tensor
    of both would make attention, which saves V, keep the routed pre-RoPE K alive too)."""
    R, Hd = kv[0].shape[2], kv[0].shape[3]
    keys, gate = split(w, R, Hd)
    ks, vs, (k, v) = kv[:n_src], kv[n_src:2 * n_src], kv[2 * n_src:]
    a = weights(qbar, keys).to(k.dtype)  # (B, T, R, n)
    g = gate.to(k.dtype)[:, None]  # (R, 1)
    mk = a @ torch.cat(ks, dim=2)  # (B, T, R, n) @ (B, T, n, Hd) -> (B, T, R, Hd)
    mv = a @ torch.cat(vs, dim=2)
    return k + g * (mk - k), v + g * (mv - v)


class DynamicMixer:
    """Keeps this pass's raw K/V per layer (references, no copies) and routes each layer from its
    sources and query; under autograd every layer is checkpointed (see the module docstring)."""

    def __init__(self, router):
        self.router = router
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.k.append(k)
        self.v.append(v)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        if q is None:
            raise ValueError(f"router {self.router.spec}: the dynamic kind needs the query: route(l, k, v, q=q)")
        r = self.router
        src = r.sources(l)
        w = r.weight(l)
        qbar = group_query(q, r.R)  # (B, T, R, Hd)
        kv = [self.k[s] for s in src] + [self.v[s] for s in src] + [k, v]
        if torch.is_grad_enabled() and (w.requires_grad or qbar.requires_grad or any(t.requires_grad for t in kv)):
            kr, vr = checkpoint(route_layer, qbar, w, len(src), *kv, use_reentrant=False)
        else:
            kr, vr = route_layer(qbar, w, len(src), *kv)
        return kr.transpose(1, 2), vr.transpose(1, 2)  # (B, R, T, Hd) each


class DynamicKind(RouterKind):
    name = "dynamic"
    learned = True
    token_dependent = True

    def operand_shape(self, router, l: int) -> tuple[int, ...]:
        return (router.R, len(router.sources(l)) * router.R * router.head_dim + 1)

    def init_weight(self, router, l: int) -> Tensor:
        R, Hd, n = router.R, router.head_dim, len(router.sources(l)) * router.R
        b = 1.0 / math.sqrt(Hd)
        keys = torch.empty(R, n * Hd).uniform_(-b, b)
        gate = torch.full((R, 1), 1.0 if router.init == "paper" else 0.0)
        return torch.cat((keys, gate), dim=1)

    def _place(self, router, l: int, a: Tensor) -> Tensor:
        """(..., R, n) weights over the sources -> (..., R, (l+1)R) with zeros outside them, plus the
        gate's identity part: the dense mixing."""
        R = router.R
        src = router.sources(l)
        _, gate = split(router.weight(l), R, router.head_dim)
        g = gate.to(a.dtype)[:, None]  # (R, 1)
        out = a.new_zeros(a.shape[:-1] + ((l + 1) * R,))
        for i, s in enumerate(src):
            out[..., s * R:(s + 1) * R] = g * a[..., i * R:(i + 1) * R]
        out[..., l * R:(l + 1) * R] += (1 - g) * torch.eye(R, dtype=a.dtype, device=a.device)
        return out

    def dense(self, router, l: int) -> Tensor:
        if l == 0:
            return average_dense(router.R, l, [l])
        n = len(router.sources(l)) * router.R
        w = router.weight(l)
        return self._place(router, l, w.new_full((router.R, n), 1.0 / n))

    def token_mixing(self, router, l: int, q: Tensor, keys: list[Tensor] | None = None) -> Tensor:
        """Layer l's dense mixing per token (B, T, R, (l+1)R) for its query q (B, T, H, Hd)."""
        if l == 0:
            d = average_dense(router.R, l, [l]).to(q)
            return d.expand(q.shape[0], q.shape[1], *d.shape)
        keys, _ = split(router.weight(l), router.R, router.head_dim)
        return self._place(router, l, weights(group_query(q, router.R), keys))

    def route_keys(self, router, l: int) -> Tensor | None:
        return None if l == 0 else split(router.weight(l), router.R, router.head_dim)[0]

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0
        return 3 * router.R * len(router.sources(l)) * router.R * router.head_dim  # scores, then K and V

    def make_mixer(self, router, *, block=None, use_ops=None) -> DynamicMixer:
        return DynamicMixer(router)

    def concat_route(self, router, l, k, v, k_all, v_all, q):
        a = self.token_mixing(router, l, q).to(k_all.dtype)  # (B, T, R, (l+1)R)
        return torch.einsum("btrc,btcd->brtd", a, k_all), torch.einsum("btrc,btcd->brtd", a, v_all)

    def traffic_slots(self, router, block) -> int:
        # per layer l >= 1 reading |S| slots: forward concatenates them (read and write |S|) and mixes
        # (read |S|, write 1); backward recomputes that (3|S| + 1), writes the sources' gradient once
        # (|S|) and hands each source its slice (read |S|, add into its gradient: 2|S|); plus the
        # layer's own K/V and gradient (4); the (B, T, R, n) weights are counted in slots too
        L, R, Hd = router.n_layers, router.R, router.head_dim
        slots = 0
        for l in range(1, L):
            s = len(router.sources(l))
            weights_slots = 4 * math.ceil(s * R / (2 * Hd))  # A and its gradient, written and read
            slots += 3 * s + 1 + 3 * s + 1 + s + 2 * s + 4 + weights_slots
        return slots

    def activation_elems(self, router, B: int, T: int) -> tuple[int, int]:
        """Kept: every layer's raw K/V (the checkpoints' inputs; the same tensors for all readers)
        and each routed layer's grouped query (B, T, R, Hd). Transient: the deepest layer's
        recomputation in backward: its sources' K and V and their gradient (2 x (B, T, n, 2Hd)) and
        its per-token weights, their softmax and gradient (3 x (B, T, R, n)); one layer at a time."""
        L, R, Hd = router.n_layers, router.R, router.head_dim
        kept = L * 2 * B * T * R * Hd + (L - 1) * B * T * R * Hd
        n = max((len(router.sources(l)) * R for l in range(1, L)), default=0)
        return kept, 2 * B * T * n * 2 * Hd + 3 * B * T * R * n


DYNAMIC = register_kind(DynamicKind())
