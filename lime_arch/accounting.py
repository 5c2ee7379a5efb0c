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
Norms, RoPE, softmax and residual adds are left out (they are O(d) per token).
Training FLOPs are taken as 3 x forward.
"""
from __future__ import annotations

import torch

from lime_arch.config import ModelConfig
from lime_arch.routers import Router, build_router


def _router(cfg: ModelConfig) -> Router:
    with torch.device("meta"):  # shapes only, no memory
        return build_router(cfg.router, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                            head_dim=cfg.head_dim, init="identity")


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    d, R, Hd = cfg.d_model, cfg.kv_heads, cfg.head_dim
    attn = d * cfg.n_heads * Hd * 2 + d * R * Hd * 2  # q, o and k, v
    mlp = 3 * d * cfg.ffn_dim
    per_layer = attn + mlp + 2 * d  # two RMSNorm weights
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    router = _router(cfg).n_params()
    body = cfg.n_layers * per_layer + d  # final norm
    return {"total": body + embed + router, "non_embedding": body + router, "router": router,
            "embedding": embed}


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> dict[str, int]:
    """Forward FLOPs per token: ``total`` = ``base`` (the same model without routing) + ``routing``."""
    T = seq_len or cfg.max_seq_len
    d, R, Hd, H = cfg.d_model, cfg.kv_heads, cfg.head_dim, cfg.n_heads
    matmul = cfg.n_layers * (d * H * Hd * 2 + d * R * Hd * 2 + 3 * d * cfg.ffn_dim) + d * cfg.vocab_size
    attention = cfg.n_layers * 2 * T * H * Hd
    router = _router(cfg)
    routing = sum(router.macs_per_token(l) for l in range(cfg.n_layers))
    base = 2 * (matmul + attention)
    return {"base": base, "routing": 2 * routing, "total": base + 2 * routing}


def routing_overhead(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Analytic routing FLOPs as a fraction of the baseline's forward FLOPs."""
    f = flops_per_token(cfg, seq_len)
    return f["routing"] / f["base"]
