"""Capture per-layer hidden states and attended values without touching the training path.

``capture(model)`` is a context manager: forward hooks on the blocks record the residual
stream after each layer (as one (B, T, C) state, ``DepthMix.hidden``: the sum of the streams with
Hyper-Connections), and the mixer the decoder builds once per forward (its depth mix's
``wrap_mixer``) is wrapped for the duration so each layer's *routed* values (what attention
actually reads: the plain values for ``none``, after the value residual where there is one) are
recorded too, with each layer's pre-RoPE query (B, T, H, Hd), raw keys (B, T, R, Hd) and normed
attention input (B, T, C), which token-dependent routers read
(``orchestrator.analysis.routes``). Outside the context the model is exactly as before.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

import lime_arch.model as lime_model


@contextmanager
def capture(model: lime_model.LIMeDecoder):
    L = model.cfg.n_layers
    store: dict[str, list[torch.Tensor | None]] = {"hidden": [None] * L, "values": [None] * L,
                                                   "queries": [None] * L, "keys": [None] * L, "inputs": [None] * L}
    hooks = []
    for l, blk in enumerate(model.blocks):
        def hook(_m, _inp, out, l=l):
            store["hidden"][l] = model.depth_mix.hidden(out).detach()  # (B, T, C)

        hooks.append(blk.register_forward_hook(hook))
    original = model.depth_mix.wrap_mixer

    def recording_mixer(inner, memo):
        mixer = original(inner, memo)
        route = mixer.route

        def route_and_record(l, k, v, q=None, x=None):  # the mixer's interface: the layer's query and input
            kr, vr = route(l, k, v, q=q, x=x)
            B, R, T, Hd = vr.shape
            store["values"][l] = vr.detach().transpose(1, 2).reshape(B, T, R * Hd)  # (B, T, R*Hd)
            store["queries"][l] = None if q is None else q.detach()  # (B, T, H, Hd)
            store["keys"][l] = k.detach()  # (B, T, R, Hd), raw: what depth attention scores
            store["inputs"][l] = None if x is None else x.detach()  # (B, T, C): hidden-state dynamic scores
            return kr, vr

        mixer.route = route_and_record
        return mixer

    model.depth_mix.wrap_mixer = recording_mixer  # this model only
    try:
        yield store
    finally:
        del model.depth_mix.wrap_mixer  # the class's method again
        for h in hooks:
            h.remove()
