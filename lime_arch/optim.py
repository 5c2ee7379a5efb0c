"""Optimizer parameter groups: router weights with their own LR and no decay, except those the
router's ``decays`` names (a dynamic router with ``model.router_dynamic.weight_decay``, as the
LIMe authors' v1 code decays its dynamic projection: group ``router_decay``, the router's LR and
the base weight decay); the depth mix's
weights (DenseFormer's DWA scalars, Hyper-Connections' static weights and scales, the learned
value-residual mixes) at the base LR without decay, except those its ``decays`` names (HC's
dynamic projection matrices, which decay like every other matrix); norms, embeddings and biases
without decay; the rest decays."""
from __future__ import annotations

from torch import nn

from lime_arch.errors import ConfigError

_MIX = "depth_mix."


def param_groups(model: nn.Module, *, lr: float, weight_decay: float, router_lr: float | None = None,
                 router_lr_mult: float | None = None) -> list[dict]:
    if router_lr is not None and router_lr_mult is not None:
        raise ConfigError("optim.router_lr: set router_lr or router_lr_mult, not both")
    rlr = router_lr if router_lr is not None else lr * (router_lr_mult if router_lr_mult is not None else 1.0)
    mix = getattr(model, "depth_mix", None)
    own = getattr(model, "router", None)
    decay, no_decay, router, router_decay, depth_mix = [], [], [], [], []
    for name, p in model.named_parameters():  # tied weights appear once
        if not p.requires_grad:
            continue
        if name.startswith("router.") and own is not None and hasattr(own, "decays"):
            (router_decay if own.decays(name[len("router."):]) else router).append(p)
        elif name.startswith("router.") or ".router." in name:
            router.append(p)
        elif name.startswith(_MIX) and mix is not None:
            (decay if mix.decays(name[len(_MIX):]) else depth_mix).append(p)
        elif p.dim() < 2 or "embed" in name or "norm" in name or name.endswith(".bias"):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"name": "decay", "params": decay, "lr": lr, "weight_decay": weight_decay},
              {"name": "no_decay", "params": no_decay, "lr": lr, "weight_decay": 0.0}]
    if router:
        groups.append({"name": "router", "params": router, "lr": rlr, "weight_decay": 0.0})
    if router_decay:
        groups.append({"name": "router_decay", "params": router_decay, "lr": rlr, "weight_decay": weight_decay})
    if depth_mix:
        groups.append({"name": "depth_mix", "params": depth_mix, "lr": lr, "weight_decay": 0.0})
    return groups
