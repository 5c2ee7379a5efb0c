"""A model's size from its config alone, without torch: the dense parameters (every weight of the
transformer body and the embeddings), the depth mix's weights (each depth mix counts its own,
``DepthMix.param_count``: Hyper-Connections' and mHC's grow as the square and the cube of their
stream count) and the training state they need. ``lime_arch.accounting`` adds the router's weights
(which needs its modules, and so torch); those are small (the full router of a 1B model: 0.1% of
its parameters), so ``min_params`` is a lower bound that the size guards of the sweep layer and
``lime train`` can use before anything heavy is imported.

Duck-typed on ``lime_arch.ModelConfig``'s fields (``d_model``, ``n_layers``, ``n_heads``,
``kv_heads``, ``head_dim``, ``ffn_dim``, ``vocab_size``, ``tie_embeddings``, ``depth_mix``).
"""
from __future__ import annotations

from typing import Any

from lime_arch.depth_mix import parse_depth_mix  # declarations only: no torch

# fp32 training state per parameter: the weight, its gradient and AdamW's two moments
TRAIN_STATE_BYTES = 16


def dense_param_counts(cfg: Any) -> dict[str, int]:
    """``body`` (attention, SwiGLU and norms of every layer, the final norm) and ``embedding``
    (the token embedding, and the LM head unless it is tied)."""
    d, R, Hd = cfg.d_model, cfg.kv_heads, cfg.head_dim
    attn = d * cfg.n_heads * Hd * 2 + d * R * Hd * 2  # q, o and k, v
    mlp = 3 * d * cfg.ffn_dim
    per_layer = attn + mlp + 2 * d  # two RMSNorm weights
    return {"body": cfg.n_layers * per_layer + d, "embedding": cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)}


def depth_mix_params(cfg: Any) -> int:
    """The depth mix's weights (``cfg.depth_mix``, a spec string), torch-free."""
    cls, args = parse_depth_mix(cfg.depth_mix)
    return cls.param_count(dict(zip((a.name for a in cls.arguments), args)), n_layers=cfg.n_layers,
                           d_model=cfg.d_model)


def min_params(cfg: Any) -> int:
    """Parameters of the model without its router's weights (a lower bound): the dense weights and
    the depth mix's."""
    c = dense_param_counts(cfg)
    return c["body"] + c["embedding"] + depth_mix_params(cfg)


def train_state_bytes(n_params: int) -> int:
    """Bytes of the fp32 weights, gradients and AdamW moments of ``n_params`` parameters
    (activations come on top and depend on the batch)."""
    return TRAIN_STATE_BYTES * n_params
