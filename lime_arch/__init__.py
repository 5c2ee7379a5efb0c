"""lime_arch: a depth-configurable LLaMA-style decoder with LIMe routing (the model library).

Nothing here imports from ``orchestrator``. The public names below load lazily (PEP 562), so
``from lime_arch.errors import ConfigError`` does not import torch: torch-free layers (reports,
statistics, sweep-file checks) can share the one error type.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ConfigError": "lime_arch.errors",
    "ModelConfig": "lime_arch.config", "PRESETS": "lime_arch.config", "preset": "lime_arch.config",
    "ROUTERS": "lime_arch.routers", "Router": "lime_arch.routers", "register_router": "lime_arch.routers",
    "RouterKind": "lime_arch.routers", "ROUTER_KINDS": "lime_arch.routers", "RouterArg": "lime_arch.routers",
    "router_specs": "lime_arch.routers",
    "parse_router": "lime_arch.routers", "build_router": "lime_arch.routers",
    "DEPTH_MIXES": "lime_arch.depth_mix", "DepthMix": "lime_arch.depth_mix", "MixArg": "lime_arch.depth_mix",
    "register_depth_mix": "lime_arch.depth_mix", "depth_mix_specs": "lime_arch.depth_mix",
    "parse_depth_mix": "lime_arch.depth_mix", "build_depth_mix": "lime_arch.depth_mix",
    "LIMeDecoder": "lime_arch.model", "build_model": "lime_arch.model", "KVCache": "lime_arch.model",
    "generate": "lime_arch.generate",
    "param_groups": "lime_arch.optim",
    "param_counts": "lime_arch.accounting", "flops_per_token": "lime_arch.accounting",
    "routing_overhead": "lime_arch.accounting", "flop_overhead": "lime_arch.accounting",
    "routing_memory": "lime_arch.accounting",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lime_arch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
