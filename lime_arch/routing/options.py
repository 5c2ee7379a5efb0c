"""The dynamic router's typed options, ``model.router_dynamic`` (torch-free: a config check reads
them without loading the kinds). What each choice computes is in ``kinds/dynamic.py``'s
docstring; which paper or code form each combination reproduces is docs/MODEL.md's table.

  scores        ``query``: the layer's pre-RoPE query (grouped per KV head) against learned keys
                of Hd dims, scaled by 1/sqrt(Hd) (the default, the paper's Appendix E wording);
                ``hidden``: a bias-free linear map of the layer's normalised hidden state (its
                attention input, D dims), unscaled (the authors' v1 code)
  softmax       ``layers-heads``: one softmax over every source head of every source layer (the
                default); ``layers``: one over the source layers, routed head h reading head h of
                each (the v1 code's softmax over layers)
  gate          a learned gate per routed head, ``routed = KV_l + g (mix - KV_l)`` (the default,
                this project's addition: 1 under ``router_init: paper``, 0 under ``identity``);
                false: the softmax mix itself, as the paper and the v1 code (no identity init then)
  weight_decay  the router parameter (keys or projection, and the gate when there is one) takes
                the optimizer's weight decay at the router's learning rate (the v1 code decays its
                dynamic projection); false (the default): no decay, as every router weight
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from lime_arch.errors import ConfigError

KEY = "model.router_dynamic"
SCORES = ("query", "hidden")
SOFTMAX = ("layers-heads", "layers")


@dataclass(frozen=True, kw_only=True)
class DynamicRouting:
    """The dynamic router's form; the defaults are the form every earlier run trained."""

    scores: str = "query"
    softmax: str = "layers-heads"
    gate: bool = True
    weight_decay: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("scores", SCORES), ("softmax", SOFTMAX)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{KEY}.{name}: {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        for name in ("gate", "weight_decay"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{KEY}.{name}: must be true or false, got {getattr(self, name)!r}")

    @property
    def per_head(self) -> bool:
        """Whether the softmax runs over every source head (columns (source, head)), not only layers."""
        return self.softmax == "layers-heads"

    @classmethod
    def from_value(cls, v: Any) -> DynamicRouting | None:
        """A mapping of the keys above (each optional), an instance, or None (the defaults)."""
        if v is None or isinstance(v, DynamicRouting):
            return v
        allowed = [f.name for f in fields(cls)]
        if not isinstance(v, dict):
            raise ConfigError(f"{KEY}: must be a mapping with keys {', '.join(allowed)} or null, got {v!r}")
        for key in v:
            if key not in allowed:
                raise ConfigError(f"{KEY}.{key}: unknown key; allowed: {', '.join(allowed)}")
        return cls(**v)
