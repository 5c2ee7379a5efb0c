"""Typed model configuration and the presets of the paper's scales.

Configs hold names and numbers only, so ``asdict(cfg)`` goes straight into MLflow params and
Ray Tune search spaces. Presets are functions deriving from one base; any field can be
overridden, and unknown or inconsistent fields raise ``ConfigError`` naming the field.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from lime_arch.depth_mix import check_depth_mix
from lime_arch.errors import ConfigError
from lime_arch.routers import check_prunable, parse_router

ATTN_IMPLS = ("sdpa", "flash", "eager")
PRUNE_KEYS = ("top_p", "start", "every", "renormalize")


@dataclass(frozen=True, kw_only=True)
class RouterPrune:
    """Top-p pruning of the router's weights in training (``lime_arch.prune``): the masks are
    recomputed from the weights at step ``start`` and then every ``every`` steps (0: only at
    ``start``); between refreshes the pruned weights stay masked and the skipped sources unread."""

    top_p: float
    start: int = 0
    every: int = 0
    renormalize: bool = True

    def __post_init__(self) -> None:
        k = "model.router_prune"
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p < 1:
            raise ConfigError(f"{k}.top_p: must be a number in (0, 1), got {self.top_p!r}")
        for name in ("start", "every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{k}.{name}: must be an integer >= 0, got {v!r}")
        if not isinstance(self.renormalize, bool):
            raise ConfigError(f"{k}.renormalize: must be true or false, got {self.renormalize!r}")

    def due(self, step: int) -> bool:
        """Whether the masks are recomputed before ``step`` (0-based) runs."""
        if step < self.start:
            return False
        return step == self.start if self.every == 0 else (step - self.start) % self.every == 0

    @classmethod
    def from_value(cls, v: Any) -> RouterPrune | None:
        if v is None or isinstance(v, RouterPrune):
            return v
        if not isinstance(v, dict):
            raise ConfigError(f"model.router_prune: must be a mapping with keys {', '.join(PRUNE_KEYS)} "
                              f"(top_p required) or null, got {v!r}")
        for key in v:
            if key not in PRUNE_KEYS:
                raise ConfigError(f"model.router_prune.{key}: unknown key; allowed: {', '.join(PRUNE_KEYS)}")
        if "top_p" not in v:
            raise ConfigError("model.router_prune.top_p: required (the mass kept per routed head, in (0, 1))")
        return cls(**v)
ROUTER_INITS = ("paper", "identity")
ROUTING_IMPLS = ("buffer", "concat")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (MHA)
    ffn_dim: int = 172
    max_seq_len: int = 256
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    # Std of the normal init of every weight matrix and the (tied) embedding; residual output
    # projections (wo, w2) get init_std / sqrt(2 * n_layers). "auto" = 1 / sqrt(d_model), the
    # fan-in rule that keeps each projection's output at the scale of its input at every width
    # (LeCun normal). The paper's presets pin LLaMA's 0.02, which is about 1/sqrt(2500): right
    # at width ~2048, but at width 64 it starts the residual stream 6x too small and the deep
    # baseline ends far worse than it should (docs/ARCHITECTURE.md, "A fair baseline").
    init_std: float | str = "auto"
    router: str = "none"
    # How layers reuse earlier hidden states or values (lime_arch.depth_mix): "none" (the plain
    # residual stream), "denseformer[-<dilation>[-<period>]]", "hyper-connections[-<rate>]",
    # "hyper-connections-static[-<rate>]", "hyper-connections-corl[-<rate>]", "value-residual",
    # "value-residual-learned", "attn-res", "attn-res-block[-<size>]",
    # "mhc[-<rate>[-<iters>[-<post_gain>]]]", "mhc-sigmoid[-...]", "mhc-readout[-...]", "mudd".
    depth_mix: str = "none"
    router_init: str = "paper"
    attn_impl: str = "sdpa"
    # "buffer": the preallocated K/V buffer (O(L) memory). "concat": the paper's pseudocode,
    # concatenating every buffered K/V at each layer (O(L^2)); kept as the benchmark's peer.
    routing_impl: str = "buffer"
    # Top-p pruning of the router's weights in training: {top_p, start, every, renormalize} or None
    # (lime_arch.prune; the paper's Table 5 and Figure 9). Routers of kind linear only.
    router_prune: RouterPrune | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_dim", "max_seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"model.{name}: must be a positive integer, got {v!r}")
        if self.n_kv_heads is not None and (
            isinstance(self.n_kv_heads, bool) or not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1
        ):
            raise ConfigError(f"model.n_kv_heads: must be a positive integer, got {self.n_kv_heads!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.n_heads: {self.n_heads} does not divide model.d_model={self.d_model}"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"model.n_kv_heads: {self.kv_heads} does not divide model.n_heads={self.n_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"model.d_model/n_heads: head dim {self.head_dim} must be even for RoPE")
        if self.init_std != "auto" and (isinstance(self.init_std, bool) or not isinstance(self.init_std, (int, float))
                                        or not self.init_std > 0):
            raise ConfigError(f"model.init_std: must be a positive number or 'auto', got {self.init_std!r}")
        for name in ("rope_theta", "norm_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"model.{name}: must be a positive number, got {v!r}")
        for name, allowed in (("router_init", ROUTER_INITS), ("attn_impl", ATTN_IMPLS),
                              ("routing_impl", ROUTING_IMPLS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model.{name}: {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"model.tie_embeddings: must be true or false, got {self.tie_embeddings!r}")
        router_cls, _ = parse_router(self.router)  # raises ConfigError listing the registered routers
        check_depth_mix(self.depth_mix, n_layers=self.n_layers)  # the same for the depth mixes
        object.__setattr__(self, "router_prune", RouterPrune.from_value(self.router_prune))
        if self.router_prune is not None:
            check_prunable(router_cls)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def std(self) -> float:
        """The init std in effect (``init_std`` with "auto" resolved to 1/sqrt(d_model))."""
        return self.d_model ** -0.5 if self.init_std == "auto" else float(self.init_std)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **overrides: Any) -> ModelConfig:
        return ModelConfig.from_dict({**dataclasses.asdict(self), **overrides})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        for k in d:
            if k not in known:
                raise ConfigError(f"model.{k}: unknown key; allowed: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Presets: each derives from `_base` (or another preset) by a small diff.
GPT2_VOCAB = 50_257
PAPER_INIT_STD = 0.02  # the authors' LLaMA init (Hugging Face LlamaConfig.initializer_range)
PRESETS: dict[str, Callable[..., ModelConfig]] = {}


def register_preset(name: str):
    def deco(fn: Callable[[], dict[str, Any]]):
        PRESETS[name] = fn
        return fn

    return deco


def _base() -> dict[str, Any]:
    return ModelConfig().to_dict()


@register_preset("tiny")
def _tiny() -> dict[str, Any]:
    # Small enough for CI on 2 cores; byte vocabulary of the built-in corpus.
    return {**_base(), "vocab_size": 256, "d_model": 64, "n_layers": 4, "n_heads": 4, "ffn_dim": 172,
            "max_seq_len": 256}


@register_preset("150m")
def _150m() -> dict[str, Any]:
    # 151.9M parameters with the tied GPT-2 vocabulary (LLaMA 8/3 FFN ratio).
    return {**_base(), "vocab_size": GPT2_VOCAB, "d_model": 768, "n_layers": 16, "n_heads": 12,
            "ffn_dim": 2048, "max_seq_len": 1024, "init_std": PAPER_INIT_STD}


def _deep(n_layers: int) -> dict[str, Any]:
    # The authors' deep configuration: hidden 256, FFN 1024, 8 heads.
    return {**_base(), "vocab_size": GPT2_VOCAB, "d_model": 256, "n_layers": n_layers, "n_heads": 8,
            "ffn_dim": 1024, "max_seq_len": 1024}


register_preset("deep32")(lambda: _deep(32))
register_preset("deep64")(lambda: _deep(64))
register_preset("deep128")(lambda: _deep(128))


@register_preset("1b")
def _1b() -> dict[str, Any]:
    # The paper's 1B MHA LLaMA (arXiv 2502.09245): 1.17674B parameters.
    return {**_base(), "vocab_size": GPT2_VOCAB, "d_model": 2048, "n_layers": 16, "n_heads": 32,
            "n_kv_heads": 32, "ffn_dim": 8192, "max_seq_len": 2048, "init_std": PAPER_INIT_STD}


@register_preset("1b-gqa")
def _1b_gqa() -> dict[str, Any]:
    return {**_1b(), "n_kv_heads": 8}  # 1.07607B parameters


@register_preset("360m")
def _360m() -> dict[str, Any]:
    # The SmolLM2-360M shape of the paper's matched 360M comparison (its Table 6): 32 layers of
    # width 960, 15 heads sharing 5 KV heads, FFN 2560, tied 49,152-token vocabulary, RoPE theta
    # 1e5; 361.8M parameters.
    return {**_base(), "vocab_size": 49_152, "d_model": 960, "n_layers": 32, "n_heads": 15, "n_kv_heads": 5,
            "ffn_dim": 2560, "max_seq_len": 2048, "rope_theta": 100_000.0, "init_std": PAPER_INIT_STD}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset with any field overridden."""
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
    return ModelConfig.from_dict({**PRESETS[name](), **overrides})
