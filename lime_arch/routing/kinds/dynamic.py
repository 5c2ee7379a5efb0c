"""The dynamic kind (``dynamic``, ``dynamic-first-j``, ``dynamic-last-j``): routing weights computed
per token (arXiv 2502.09245, Appendix E: "projecting the current hidden state (queries) against
per-layer, per-head learnable keys"), in the form ``model.router_dynamic`` names
(``lime_arch.routing.options.DynamicRouting``; docs/MODEL.md's table says which paper or code form
each setting reproduces). The defaults are the form every earlier run trained.

Layer l >= 1 reads the sources S_l, n = |S_l| * R buffered KV heads (slot i's head h'). Routed KV
head h of token t:

    z[t, h, c]   = u[t, h] . key_l[h, c] * s                                    (B, T, R, m)
    A[t, h, c]   = softmax_c( z[t, h, c] )
    mix[t, h]    = sum_c A[t, h, c] KV_c[t]                                    (the same A for K and V)
    routed[t, h] = KV_l[t, h] + g_l[h] * (mix[t, h] - KV_l[t, h])              (with the gate)

``scores`` picks u and s. ``query`` (default): u[t, h] is the layer's query averaged over the query
heads that share KV head h (MHA: head h's own; GQA: its group's mean, so the routed K/V keep the
baseline's R heads and the KV cache its size), keys of Hd dims, s = 1/sqrt(Hd). The query is taken
**before RoPE**: the keys are position-free, and a rotated query would make the weights depend on
the absolute position through the rotation instead of on the content; after routing, RoPE is
applied to the routed keys as for every kind. ``hidden`` (the authors' v1 code): u[t, h] = x[t],
the layer's normalised hidden state (its attention input, the block's RMSNorm of the residual
stream: what its K/V are projected from, as v1's router reads the normed state its K/V come
from), keys of D dims, s = 1: a bias-free linear map D -> R*m, v1's ``dynamic_proj``.

``softmax`` picks the columns c. ``layers-heads`` (default): m = n, one softmax over every source
head of every source layer, c = (i, h'). ``layers`` (v1's softmax over layers): m = |S_l|, routed
head h reads head h of each source layer (c = i, KV_c = KV_{S_i}[h]), the K/V analogue of v1's
per-head weights over layers.

``gate`` (default on): ``g_l`` (one per routed head) is this project's addition: a softmax can never
be one-hot, so without it no init could make step 0 the ``none`` model. ``router_init: identity``
starts it at 0, which makes step 0 exactly the baseline (``KV + 0 * (...)``: the same bits, as the
static identity init) while the gate's own gradient is nonzero, so the keys start learning after
the first step; ``paper`` starts it at 1: exactly the softmax mixing. Off: routed = mix, the
paper's and v1's router (only ``router_init: paper`` then; the config refuses ``identity``). The
keys start U(-1/sqrt(E), 1/sqrt(E)) with E their width (Hd or D) under both inits: nn.Linear's
default for a projection of E inputs, as the authors' code initialised its routing projections;
near-uniform weights at step 0.

``weight_decay`` (default off) puts the router's parameter (keys, and the gate when on: they are
one tensor) in the optimizer's decayed router group (``RouterModule.decays``, ``lime_arch.optim``).

Layer l's weight is one parameter (R, m*E + g), g = 1 with the gate: per routed head its m keys
flattened, then its gate (``split``). Parameters per layer: R * (m*E + g). MACs per token: R*m*E
for the scores and 2*R*m*Hd for mixing K and V (the group mean, softmax and gate are O(R*Hd) and
left out, as the accounting leaves out norms).

Memory: the per-token weights are (B, T, R, m) per layer, m up to L*R: more than the layer's K/V
once m > 2*Hd. In training each layer's routing runs under activation checkpointing
(``torch.utils.checkpoint``): forward keeps only its inputs (u, the weight, and references to the
sources' raw K/V, which every later layer shares; ``hidden``'s u is the attention input that the
Q/K/V projections keep anyway), and backward recomputes one layer's weights at a time, so at most
one layer's (B, T, R, m) exists at any moment.

``dense(l)`` (the token-free matrix the static kinds have) is here the mixing of a token whose
score input is zero, ``(1 - g) I + g * uniform`` (uniform over the m columns): what the weights
are before the token says anything. The analysis of trained models (``orchestrator.analysis``,
the end-of-trial router artifacts) reads ``token_mixing`` instead: the per-token dense matrices
averaged over validation tokens, and their spread over tokens as a second map.
"""
from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from lime_arch.routing.kinds.base import RouterKind, average_dense, register_kind
from lime_arch.routing.options import DynamicRouting

Tensor = torch.Tensor
DEFAULT = DynamicRouting()


def split(w: Tensor, R: int, E: int, gate: bool = True) -> tuple[Tensor, Tensor | None]:
    """Layer weight (R, m*E + g) -> keys (R, m, E) and gate (R,) (None without the gate)."""
    return (w[:, :-1].reshape(R, -1, E), w[:, -1]) if gate else (w.reshape(R, -1, E), None)


def group_query(q: Tensor, R: int) -> Tensor:
    """The layer's query (B, T, H, Hd) -> its mean per KV head (B, T, R, Hd) (GQA: the heads of a
    group share KV head h = i // (H / R), as attention reads them)."""
    B, T, H, Hd = q.shape
    return q if H == R else q.view(B, T, R, H // R, Hd).mean(dim=3)


def weights(u: Tensor, keys: Tensor) -> Tensor:
    """Per-token routing weights (B, T, R, m), softmax over the m columns. ``u``: the grouped query
    (B, T, R, Hd), scored as u . key / sqrt(Hd); or the normalised hidden state (B, T, D), scored
    as u . key (v1's linear map)."""
    if u.dim() == 4:
        z = torch.einsum("btrd,rcd->btrc", u, keys.to(u.dtype)) / math.sqrt(keys.shape[-1])
    else:
        z = torch.einsum("btd,rcd->btrc", u, keys.to(u.dtype))
    return z.softmax(dim=-1)


def route_layer(u: Tensor, w: Tensor, n_src: int, gate: bool, per_head: bool,
                *kv: Tensor) -> tuple[Tensor, Tensor]:
    """One layer's routing: ``kv`` holds the K of every source slot, then their V, then the layer's own
    K and V (each (B, T, R, Hd)); returns routed K and V (B, T, R, Hd) as two tensors (one tensor
    of both would make attention, which saves V, keep the routed pre-RoPE K alive too)."""
    R = kv[0].shape[2]
    keys, g = split(w, R, u.shape[-1], gate)
    ks, vs, (k, v) = kv[:n_src], kv[n_src:2 * n_src], kv[2 * n_src:]
    a = weights(u, keys).to(k.dtype)  # (B, T, R, m)
    if per_head:  # (B, T, R, n) @ (B, T, n, Hd) -> (B, T, R, Hd)
        mk, mv = a @ torch.cat(ks, dim=2), a @ torch.cat(vs, dim=2)
    else:  # head h of each source: (B, T, R, 1, |S|) @ (B, T, R, |S|, Hd)
        a = a.unsqueeze(-2)
        mk, mv = (a @ torch.stack(ks, dim=3)).squeeze(-2), (a @ torch.stack(vs, dim=3)).squeeze(-2)
    if g is None:
        return mk, mv
    g = g.to(k.dtype)[:, None]  # (R, 1)
    return k + g * (mk - k), v + g * (mv - v)


def score_input(router, q: Tensor | None, x: Tensor | None) -> Tensor:
    """What layer l's scores read: the grouped query (B, T, R, Hd) or the normalised hidden state
    (B, T, D), by ``router.options.scores``."""
    if router.options.scores == "hidden":
        if x is None:
            raise ValueError(f"router {router.spec}: scores from the hidden state need it: route(l, k, v, q=q, x=x)")
        return x
    if q is None:
        raise ValueError(f"router {router.spec}: the dynamic kind needs the query: route(l, k, v, q=q)")
    return group_query(q, router.R)


class DynamicMixer:
    """Keeps this pass's raw K/V per layer (references, no copies) and routes each layer from its
    sources and its query or hidden state; under autograd every layer is checkpointed (see the
    module docstring)."""

    def __init__(self, router):
        self.router = router
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        self.k.append(k)
        self.v.append(v)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        r = self.router
        o = r.options
        src = r.sources(l)
        w = r.weight(l)
        u = score_input(r, q, x)
        kv = [self.k[s] for s in src] + [self.v[s] for s in src] + [k, v]
        args = (u, w, len(src), o.gate, o.per_head, *kv)
        if torch.is_grad_enabled() and (w.requires_grad or u.requires_grad or any(t.requires_grad for t in kv)):
            kr, vr = checkpoint(route_layer, *args, use_reentrant=False)
        else:
            kr, vr = route_layer(*args)
        return kr.transpose(1, 2), vr.transpose(1, 2)  # (B, R, T, Hd) each


class DynamicKind(RouterKind):
    name = "dynamic"
    learned = True
    token_dependent = True

    def check_options(self, options, d_model: int | None) -> DynamicRouting:
        options = DEFAULT if options is None else options
        if not isinstance(options, DynamicRouting):
            raise TypeError(f"router kind dynamic: options must be a DynamicRouting, got {options!r}")
        if options.scores == "hidden" and not (isinstance(d_model, int) and d_model > 0):
            raise ValueError("router kind dynamic: scores from the hidden state need the model width (d_model)")
        return options

    def decays(self, router, name: str) -> bool:
        return router.options.weight_decay

    @staticmethod
    def columns(router, l: int) -> int:
        """m: the softmax's columns at layer l (every source head, or every source layer)."""
        s = len(router.sources(l))
        return s * router.R if router.options.per_head else s

    @staticmethod
    def key_width(router) -> int:
        """E: a key's width, the query head's Hd or the hidden state's D."""
        return router.d_model if router.options.scores == "hidden" else router.head_dim

    def keys_and_gate(self, router, l: int) -> tuple[Tensor, Tensor | None]:
        return split(router.weight(l), router.R, self.key_width(router), router.options.gate)

    def operand_shape(self, router, l: int) -> tuple[int, ...]:
        return (router.R, self.columns(router, l) * self.key_width(router) + int(router.options.gate))

    def init_weight(self, router, l: int) -> Tensor:
        R, E, m = router.R, self.key_width(router), self.columns(router, l)
        b = 1.0 / math.sqrt(E)
        keys = torch.empty(R, m * E).uniform_(-b, b)
        if not router.options.gate:
            return keys
        gate = torch.full((R, 1), 1.0 if router.init == "paper" else 0.0)
        return torch.cat((keys, gate), dim=1)

    def _place(self, router, l: int, a: Tensor) -> Tensor:
        """(..., R, m) weights over the columns -> (..., R, (l+1)R) with zeros outside the sources, plus
        the gate's identity part: the dense mixing."""
        R = router.R
        src = router.sources(l)
        _, gate = self.keys_and_gate(router, l)
        g = a.new_ones(R, 1) if gate is None else gate.to(a.dtype)[:, None]  # (R, 1)
        out = a.new_zeros(a.shape[:-1] + ((l + 1) * R,))
        eye = torch.eye(R, dtype=a.dtype, device=a.device)
        for i, s in enumerate(src):
            if router.options.per_head:
                out[..., s * R:(s + 1) * R] = g * a[..., i * R:(i + 1) * R]
            else:  # routed head h reads head h of source s: the diagonal of its block
                out[..., s * R:(s + 1) * R] = g * a[..., i:i + 1] * eye
        if gate is not None:
            out[..., l * R:(l + 1) * R] += (1 - g) * eye
        return out

    def dense(self, router, l: int) -> Tensor:
        if l == 0:
            return average_dense(router.R, l, [l])
        m = self.columns(router, l)
        w = router.weight(l)
        return self._place(router, l, w.new_full((router.R, m), 1.0 / m))

    def token_mixing(self, router, l: int, q: Tensor, keys: list[Tensor] | None = None,
                     x: Tensor | None = None) -> Tensor:
        """Layer l's dense mixing per token (B, T, R, (l+1)R) for its query q (B, T, H, Hd), or its
        normalised hidden state x (B, T, D) when the scores read it."""
        if l == 0:
            ref = q if q is not None else x
            d = average_dense(router.R, l, [l]).to(ref)
            return d.expand(ref.shape[0], ref.shape[1], *d.shape)
        k, _ = self.keys_and_gate(router, l)
        return self._place(router, l, weights(score_input(router, q, x), k))

    def route_keys(self, router, l: int) -> Tensor | None:
        return None if l == 0 else self.keys_and_gate(router, l)[0]

    def macs_per_token(self, router, l: int) -> int:
        if l == 0:
            return 0
        m = self.columns(router, l)
        return router.R * m * self.key_width(router) + 2 * router.R * m * router.head_dim  # scores; K and V

    def make_mixer(self, router, *, block=None, use_ops=None) -> DynamicMixer:
        return DynamicMixer(router)

    def concat_route(self, router, l, k, v, k_all, v_all, q, x=None):
        a = self.token_mixing(router, l, q, x=x).to(k_all.dtype)  # (B, T, R, (l+1)R)
        return torch.einsum("btrc,btcd->brtd", a, k_all), torch.einsum("btrc,btcd->brtd", a, v_all)

    def traffic_slots(self, router, block) -> int:
        # per layer l >= 1 reading |S| slots: forward concatenates them (read and write |S|) and mixes
        # (read |S|, write 1); backward recomputes that (3|S| + 1), writes the sources' gradient once
        # (|S|) and hands each source its slice (read |S|, add into its gradient: 2|S|); plus the
        # layer's own K/V and gradient (4); the (B, T, R, m) weights are counted in slots too
        L, Hd = router.n_layers, router.head_dim
        slots = 0
        for l in range(1, L):
            s = len(router.sources(l))
            weights_slots = 4 * math.ceil(self.columns(router, l) / (2 * Hd))  # A and its gradient, written and read
            slots += 3 * s + 1 + 3 * s + 1 + s + 2 * s + 4 + weights_slots
        return slots

    def activation_elems(self, router, B: int, T: int) -> tuple[int, int]:
        """Kept: every layer's raw K/V (the checkpoints' inputs; the same tensors for all readers)
        and, with query scores, each routed layer's grouped query (B, T, R, Hd) (hidden scores read
        the attention input, which the Q/K/V projections keep anyway). Transient: the deepest
        layer's recomputation in backward: its sources' K and V and their gradient (2 x (B, T, n,
        2Hd)) and its per-token weights, their softmax and gradient (3 x (B, T, R, m)); one layer
        at a time."""
        L, R, Hd = router.n_layers, router.R, router.head_dim
        kept = L * 2 * B * T * R * Hd
        if router.options.scores == "query":
            kept += (L - 1) * B * T * R * Hd
        n = max((len(router.sources(l)) * R for l in range(1, L)), default=0)
        m = max((self.columns(router, l) for l in range(1, L)), default=0)
        return kept, 2 * B * T * n * 2 * Hd + 3 * B * T * R * m


DYNAMIC = register_kind(DynamicKind())
