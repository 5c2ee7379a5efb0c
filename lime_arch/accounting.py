"""Parameter and FLOP accounting: the one place these numbers are computed.

FLOP convention (documented once, used everywhere): forward FLOPs per token = 2 x the
multiply-accumulates of
  - every weight matrix (Q, K, V, O, SwiGLU gate/up/down, the LM head; the embedding lookup
    is free),
  - attention scores and the weighted sum of values over a context of ``seq_len`` tokens,
    counted for the full context (2 * seq_len * H * Hd MACs per layer, not halved for the
    causal mask, as in Kaplan et al. and Chinchilla),
  - routing: per layer l >= 1 the router's MACs for K and V (full: 2 * R * |S_l|R * Hd, which
    is the paper's sum_l 2*R*(l+1)*R*2*Hd in FLOPs, arXiv 2502.09245).
  - the depth mix's own mixing (``DepthMix.macs_per_token``): DenseFormer's weighted sums
    (C per source of each DWA), Hyper-Connections' dynamic projections n*C*(n+2), width and depth
    connections n*C + n^2*C + n*C per sublayer and the final sum of the streams, the value
    residual's 2*R*Hd per layer >= 1; mHC's one projection of the flattened streams
    n*C*n(n+2) and the same width and depth connections per sublayer (its Sinkhorn rounds,
    O(iters n^2), are left out like a softmax; ``mhc-readout``'s learned readout n*C*n + n*C
    replaces the final sum); AttnRes's 2*C per source of every reader (scores
    and weighted sum; additive AttnRes reads with sublayers 1..2L-1 only); MUDDFormer's
    dense-weight MLP C*h + h*ways*S and its mixtures ways*S*C after each block (trimmed: only
    after the blocks that have dense weights, ways 2 with ``-vr``); the HC / mHC stream offsets
    (``-asym``) are adds; the gated residual's bottleneck 2*n*C*r, gated mean n*C, write scalars
    n*C*n and write n*C per sublayer, and the output mixer's read 2*n*C*r + n*C.
  - the dynamic router's scores, q . key for every routed head and source head (R * |S_l|R * Hd),
    beside its mixing of K and V (counted as full's); in the forms of ``model.router_dynamic``
    R * m * E for the scores and 2 * R * m * Hd for the mixing, m = |S_l|R or |S_l| (a softmax
    over layers), E = Hd or D (hidden-state scores).
Norms, RoPE, softmax, sigmoid, GELU, tanh and residual adds are left out (O(d) per token).
Training FLOPs are taken as 3 x forward.

Against the paper's Table 16 (1B models, relative to LLaMA; arXiv 2502.09245), these counts give
(``tests/lime_arch/test_peer_accounting.py`` pins them):
  DenseFormer params +0.00% (152 scalars) GQA and MHA, as the paper; FLOPs +0.026% GQA, +0.024%
    MHA vs the paper's +0.02%.
  HC params +0.037% GQA, +0.033% MHA (394,048 = 32 sublayers x (C(n+2) + n(n+1) + n + 2)) vs
    the paper's +0.03% both; the paper's GQA figure would need at most ~376k parameters, e.g. a
    count of C(n+1) per sublayer, so its implementation counts a little less (which part the
    paper does not say); FLOPs +0.26% GQA, +0.24% MHA vs +0.31% / +0.29%.
The field's own claims, against the same counts (the test pins them): MUDDFormer reports +0.23%
parameters at 2.8B (its D 2560, 32 layers); the authors' code rounds the dense-weight MLP's width
up, (h // 64 + 1) * 64, which this module follows and which gives +0.32% there; the unrounded
width h = ways * (i + 2) gives +0.22%, the paper's figure.
Why the FLOPs differ: the paper's counter (2.7615T / 2.9679T per 2,048-token sequence, i.e.
1.348G / 1.449G multiply-accumulates per token, not FLOPs: LIMe's routing, 17.7M MACs per token
in the MHA model, is its +1.22%) counts attention about twice as we do and counts norms. Our
base is 1.210G / 1.311G MACs per token. With the paper's bases and HC's stream norm counted at 4
operations per stream element (n*C*4 per sublayer), this module's HC count reproduces +0.31% /
+0.29% and DenseFormer's +0.02% / +0.02% to the printed digits.
"""
from __future__ import annotations

import torch

from lime_arch.config import ModelConfig
from lime_arch.depth_mix import DepthMix, build_depth_mix
from lime_arch.routers import Router, build_router
from lime_arch.size import dense_param_counts


def _router(cfg: ModelConfig) -> Router:
    with torch.device("meta"):  # shapes only, no memory
        return build_router(cfg.router, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                            head_dim=cfg.head_dim, init="identity", options=cfg.router_dynamic,
                            d_model=cfg.d_model)


def _depth_mix(cfg: ModelConfig) -> DepthMix:
    with torch.device("meta"):
        return build_depth_mix(cfg.depth_mix, n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
                               n_kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, norm_eps=cfg.norm_eps, std=cfg.std)


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    dense = dense_param_counts(cfg)  # torch-free (lime_arch.size): the body and the embeddings
    body, embed = dense["body"], dense["embedding"]
    router = _router(cfg).n_params()
    mix = _depth_mix(cfg).n_params()
    return {"total": body + embed + router + mix, "non_embedding": body + router + mix, "router": router,
            "depth_mix": mix, "embedding": embed}


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> dict[str, int]:
    """Forward FLOPs per token: ``total`` = ``base`` (the same model without routing and depth mix)
    + ``routing`` + ``depth_mix``."""
    T = seq_len or cfg.max_seq_len
    d, R, Hd, H = cfg.d_model, cfg.kv_heads, cfg.head_dim, cfg.n_heads
    matmul = cfg.n_layers * (d * H * Hd * 2 + d * R * Hd * 2 + 3 * d * cfg.ffn_dim) + d * cfg.vocab_size
    attention = cfg.n_layers * 2 * T * H * Hd
    router = _router(cfg)
    routing = sum(router.macs_per_token(l) for l in range(cfg.n_layers))
    mix = _depth_mix(cfg).macs_per_token()
    base = 2 * (matmul + attention)
    return {"base": base, "routing": 2 * routing, "depth_mix": 2 * mix, "total": base + 2 * (routing + mix)}


def routing_memory(cfg: ModelConfig, batch: int, seq_len: int | None = None, elem_bytes: int = 4) -> dict[str, int]:
    """Analytic activation memory of the routing in one training step of ``batch`` sequences, in
    bytes, on top of the same model without routing: ``kept`` from forward to backward (buffered
    kinds: one copy of every layer's raw K/V; dynamic: those and, with query scores, each layer's
    grouped query) and
    ``transient``, the most held at once on top of that (buffered: the backward's K/V gradient
    buffer; dynamic: one layer's recomputed per-token weights and sources in backward). The
    router kind counts them (``RouterKind.activation_elems``); ``elem_bytes`` 2 for bf16."""
    T = seq_len or cfg.max_seq_len
    router = _router(cfg)
    kept, transient = router.kind.activation_elems(router, batch, T)
    return {"kept": kept * elem_bytes, "transient": transient * elem_bytes}


def routing_overhead(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Analytic routing FLOPs as a fraction of the baseline's forward FLOPs."""
    f = flops_per_token(cfg, seq_len)
    return f["routing"] / f["base"]


def flop_overhead(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Analytic FLOPs of routing and depth mix together as a fraction of the baseline's."""
    f = flops_per_token(cfg, seq_len)
    return (f["total"] - f["base"]) / f["base"]
