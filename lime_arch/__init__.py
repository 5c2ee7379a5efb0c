"""lime_arch: a depth-configurable LLaMA-style decoder with LIMe routing (the model library).

Nothing here imports from ``orchestrator``."""
from .accounting import flops_per_token, param_counts, routing_overhead
from .config import PRESETS, ModelConfig, preset
from .errors import ConfigError
from .generate import generate
from .model import KVCache, LIMeDecoder, build_model
from .optim import param_groups
from .routers import ROUTERS, Router, build_router, parse_router, register_router

__all__ = ["ConfigError", "ModelConfig", "PRESETS", "preset", "ROUTERS", "Router", "register_router",
           "parse_router", "build_router", "LIMeDecoder", "build_model", "KVCache", "generate",
           "param_groups", "param_counts", "flops_per_token", "routing_overhead"]
