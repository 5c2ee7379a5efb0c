"""A LLaMA-style decoder whose attention reads routed K/V (LIMe).

Pre-RMSNorm blocks, causal attention with RoPE, SwiGLU MLP, final norm, tied LM head. The
only LIMe-specific line is ``k, v = mixer.route(l, k, v, q=q, x=x)``: raw pre-RoPE K/V (and the
layer's pre-RoPE query and normed input, which token-dependent router kinds read) go in, routed K/V come out, and
RoPE is applied once after routing (all mixed vectors share one position, so this equals mixing
post-RoPE keys). With the ``none`` router this is exactly LLaMA.

The residual stream goes through the depth mix (``lime_arch.depth_mix``: DenseFormer,
Hyper-Connections, mHC, Attention Residuals, MUDDFormer, value residual): its hooks wrap each
sublayer, run after each block, and see the routed values; ``none`` is the plain
``x + sublayer(x)``, the same operations as before. A depth mix may give the attention's keys and
values inputs of their own (MUDDFormer); without them the three read the same normed input.
"""
from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from lime_arch.config import ModelConfig
from lime_arch.depth_mix import DepthMix, build_depth_mix
from lime_arch.prune import attach as attach_prune
from lime_arch.routers import Router, build_router
from lime_arch.routing.mixers import make_mixer

log = logging.getLogger("lime_arch")
Tensor = torch.Tensor

try:  # optional: flash-attn is never required
    from flash_attn import flash_attn_func  # type: ignore
except Exception:  # noqa: BLE001 - any import failure means "not available"
    flash_attn_func = None

_announced: set[str] = set()


def _announce(msg: str) -> None:
    """Log the attention path once per process, so the choice is never a silent surprise. Not while
    torch.compile traces: a logging call there is a graph break (inside the layer loop, Dynamo then
    gives up on the whole forward and compiles every layer on its own)."""
    if msg not in _announced and not torch.compiler.is_compiling():
        _announced.add(msg)
        log.info(msg)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # fp32 or better for the statistic
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_cache(head_dim: int, max_len: int, theta: float) -> tuple[Tensor, Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)  # (T, Hd/2)
    ang = torch.cat([ang, ang], dim=-1)  # (T, Hd) in rotate-half layout
    return ang.cos(), ang.sin()  # float64; cast per use, so a bf16 model keeps exact angles


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, H, T, Hd); cos/sin: (T, Hd)."""
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


class KVCache:
    """Routed, post-RoPE K/V of each layer: exactly the baseline's cache size."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device, dtype):
        shape = (cfg.n_layers, batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.H, self.R, self.Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, self.H * self.Hd, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.R * self.Hd, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.R * self.Hd, bias=False)
        self.wo = nn.Linear(self.H * self.Hd, cfg.d_model, bias=False)

    def forward(self, x: Tensor, l: int, mixer, cos: Tensor, sin: Tensor, cache: KVCache | None,
                kv: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x: the (normed) input (B, T, C) of the queries, and of the keys and values unless ``kv``
        gives them their own (normed) inputs (MUDDFormer's separate Q, K, V streams)."""
        B, T, _ = x.shape
        xk, xv = (x, x) if kv is None else kv
        q = self.wq(x).view(B, T, self.H, self.Hd)  # pre-RoPE (B, T, H, Hd)
        k = self.wk(xk).view(B, T, self.R, self.Hd)  # raw, pre-RoPE (B, T, R, Hd)
        v = self.wv(xv).view(B, T, self.R, self.Hd)
        k, v = mixer.route(l, k, v, q=q, x=x)  # routed (B, R, T, Hd); token-dependent kinds read q or x
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k, cos, sin)  # (B, H, T, Hd), (B, R, T, Hd)
        causal = True
        if cache is not None:
            p = cache.pos
            cache.k[l, :, :, p:p + T] = k
            cache.v[l, :, :, p:p + T] = v
            k, v = cache.k[l, :, :, :p + T], cache.v[l, :, :, :p + T]
            causal = False  # one new token attends to everything cached; a prompt is causal (a branch,
            if p == 0:  # not `p == 0` as a value: compiled, p may be a symbolic int, and SDPA takes a bool)
                causal = True
            if p > 0 and T > 1:
                raise ValueError("chunked prefill after a cached prefix is not supported")
        y = self._attend(q, k, v, causal)  # (B, H, T, Hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.Hd))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        impl = self.cfg.attn_impl
        if impl == "flash":
            if flash_attn_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
                _announce("attention: flash-attn")
                y = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
                return y.transpose(1, 2)
            _announce("attention: flash requested but unavailable here (needs flash-attn, CUDA, bf16/fp16); using SDPA")
            impl = "sdpa"
        if impl == "sdpa":
            _announce("attention: torch SDPA")
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=self.H != self.R)
        _announce("attention: eager (explicit softmax)")
        rep = self.H // self.R
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.Hd)  # (B, H, T, S)
        if causal:
            T, S = att.shape[-2:]
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
            att = att.masked_fill(~mask, float("-inf"))
        return att.softmax(-1) @ v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)  # down

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, l: int, mixer, cos: Tensor, sin: Tensor, cache: KVCache | None,
                mix: DepthMix, memo: dict) -> Tensor:
        """x: the residual state (B, T, C); (B, T, n, C) with Hyper-Connections. The depth mix
        applies each sublayer (``none``: x + sublayer(x)). The attention sublayer takes an optional
        ``kv``: separate inputs of its keys and values as ((x_k, g_k), (x_v, g_v)), each through
        this block's attention norm and then its own gain g (MUDDFormer's Q, K, V streams); the K/V
        still go through the router's mixer."""
        def attend(h: Tensor, kv=None) -> Tensor:
            kv_in = None if kv is None else tuple(self.attn_norm(s) * g for s, g in kv)
            return self.attn(self.attn_norm(h), l, mixer, cos, sin, cache, kv_in)

        x = mix.sublayer(2 * l, x, attend, memo)
        return mix.sublayer(2 * l + 1, x, lambda h: self.mlp(self.mlp_norm(h)), memo)


class LIMeDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # built after the init loop so its own (paper or identity) init is kept
        self.router: Router = build_router(cfg.router, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                                           head_dim=cfg.head_dim, init=cfg.router_init,
                                           options=cfg.router_dynamic, d_model=cfg.d_model)
        if cfg.router_prune is not None:  # its masks (nothing pruned until the first refresh): in the state dict
            attach_prune(self.router)
        # after every other weight, from a forked RNG: the shared weights equal the none model's
        self.depth_mix: DepthMix = build_depth_mix(cfg.depth_mix, n_layers=cfg.n_layers, d_model=cfg.d_model,
                                                   n_heads=cfg.n_heads, n_kv_heads=cfg.kv_heads,
                                                   head_dim=cfg.head_dim, norm_eps=cfg.norm_eps, std=cfg.std)
        cos, sin = rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # .float()/.half()/.to(dtype) cast every floating buffer; the RoPE tables stay float64 (cast
        # per use), so a model moved between dtypes keeps exact angles
        super()._apply(fn, recurse)
        if self.rope_cos.dtype != torch.float64:
            cos, sin = rope_cache(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta)
            self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)
        return self

    def _init_weights(self) -> None:
        std = self.cfg.std
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # residual-output projections scaled by depth (GPT-2 style) keep deep stacks stable
                s = std / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else std
                nn.init.normal_(p, mean=0.0, std=s)

    def forward(self, idx: Tensor, cache: KVCache | None = None) -> Tensor:
        """idx: (B, T) token ids -> logits (B, T, V). With a cache, positions continue from it."""
        B, T = idx.shape
        p = cache.pos if cache is not None else 0
        if p + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {p + T} tokens exceeds model.max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[p:p + T], self.rope_sin[p:p + T]
        mix, memo = self.depth_mix, {}  # memo: the depth mix's state of this pass
        mixer = mix.wrap_mixer(make_mixer(self.router, self.cfg.routing_impl), memo)
        x = mix.begin(self.embed(idx), memo)  # (B, T, C) embedding -> residual state
        for l, block in enumerate(self.blocks):
            x = mix.after_block(l, block(x, l, mixer, cos, sin, cache, mix, memo), memo)
        if cache is not None:
            cache.pos += T
        return self.lm_head(self.norm(mix.end(x, memo)))  # (B, T, V)


def build_model(cfg: ModelConfig) -> LIMeDecoder:
    return LIMeDecoder(cfg)
