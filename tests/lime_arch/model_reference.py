"""The decoder written straight from the paper (arXiv 2502.09245), sharing no code with lime_arch:
LLaMA blocks whose attention reads layer l's routed K/V, computed by the router kind's reference
(``kind_references.py``) from a growing list of every layer's raw K/V (the pseudocode's buffer)."""
import inspect
import math

import torch
from kind_references import REFERENCES


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # x: (B, H, T, Hd), rotate-half convention
    T, Hd = x.shape[-2:]
    inv = 1.0 / theta ** (torch.arange(0, Hd, 2, dtype=torch.float64) / Hd)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : Hd // 2], x[..., Hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_forward(model, idx, sources, route=None):
    """Logits of ``model`` on ``idx``; ``sources(l)``: the slots layer l reads (the test's table);
    ``route``: the routing reference (default: the one of the router's kind), called with the raw
    parameter of layer l (None without one), the sources, the raw K and V so far (B, R, T, Hd)
    and the layer's pre-RoPE query (B, H, T, Hd), and its normed input ``x`` (B, T, D) if it takes one."""
    cfg = model.cfg
    H, R, Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    B, T = idx.shape
    route = REFERENCES[model.router.kind.name].route if route is None else route
    weights = list(model.router.weights)
    x = model.embed.weight[idx]
    buf_k, buf_v = [], []
    for l, blk in enumerate(model.blocks):
        a = blk.attn
        h = rms(x, blk.attn_norm.weight, cfg.norm_eps)
        q = (h @ a.wq.weight.T).view(B, T, H, Hd).transpose(1, 2)  # pre-RoPE (B, H, T, Hd)
        buf_k.append((h @ a.wk.weight.T).view(B, T, R, Hd).transpose(1, 2))  # raw (B, R, T, Hd)
        buf_v.append((h @ a.wv.weight.T).view(B, T, R, Hd).transpose(1, 2))
        w = weights[l - 1] if l > 0 and weights else None
        # a reference that reads the layer's normed input (the dynamic router's hidden-state scores) takes x
        kw = {"x": h} if "x" in inspect.signature(route).parameters else {}
        k, v = route(w, sorted(sources(l)), buf_k, buf_v, l, q, **kw)
        q, k = rope(q, cfg.rope_theta), rope(k, cfg.rope_theta)
        k, v = k.repeat_interleave(H // R, 1), v.repeat_interleave(H // R, 1)
        att = q @ k.transpose(-1, -2) / math.sqrt(Hd)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, H * Hd) @ a.wo.weight.T
        m = blk.mlp
        h = rms(x, blk.mlp_norm.weight, cfg.norm_eps)
        x = x + (torch.nn.functional.silu(h @ m.w1.weight.T) * (h @ m.w3.weight.T)) @ m.w2.weight.T
    return rms(x, model.norm.weight, cfg.norm_eps) @ model.embed.weight.T


def saved_bytes(cfg, idx) -> int:
    """Bytes a training forward of ``build_model(cfg)`` (seed 0) on ``idx`` saves for backward, each
    storage counted once: counted here with autograd's hooks, independently of the engine's meter."""
    from lime_arch import build_model
    torch.manual_seed(0)
    model = build_model(cfg)
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx)
    return sum(seen.values())

