"""Names shared by the sweep files, MLflow and the reports: the short aliases of config keys.

A sweep axis may be written as an alias (``router``) or a dotted config key (``model.router``);
MLflow params are the dotted keys, and reports show the aliases. One table for all of them.
"""
from __future__ import annotations

ALIASES: dict[str, str] = {
    "router": "model.router",
    "n_layers": "model.n_layers",
    "d_model": "model.d_model",
    "seed": "train.seed",
    "steps": "train.steps",
    "lr": "optim.lr",
    "router_lr": "optim.router_lr",
    "router_lr_mult": "optim.router_lr_mult",
    "preset": "preset",
    "router_init": "model.router_init",
    "depth_mix": "model.depth_mix",
}
# Columns that can split a sweep into cells besides the compared axis (seed never does).
FACTORS = ("router", "n_layers", "d_model", "preset", "router_init", "lr", "router_lr", "router_lr_mult", "steps")
_CANON = {v: k for k, v in ALIASES.items()}


def dotted(key: str) -> str:
    """An alias -> its dotted config key; anything else unchanged."""
    return ALIASES.get(key, key)


def canonical(key: str) -> str:
    """A dotted key that has an alias -> the alias (``model.n_layers`` -> ``n_layers``)."""
    return _CANON.get(key, key)
