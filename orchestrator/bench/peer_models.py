"""The other implementations of ``lime bench --peers`` (the optional extra, ``pip install '.[peers]'``):
what a user would pick instead of this project's routers and depth mixes, each built at a bench shape.

x-transformers: ``TransformerWrapper`` over a ``Decoder`` set to the bench model's shape (width, depth,
heads, head dim, KV heads, SwiGLU FFN of the same inner width, RMSNorm, rotary over the whole head
dimension, tied embedding, SDPA attention), its plain decoder the baseline of its rows; each variant
switches one of its options on: ``integrate_layers`` (its dynamic LIMe over the hidden states of every
earlier sublayer), ``num_residual_streams=4`` (its hyper-connections), ``add_value_residual`` (ResFormer's
value residual, with its default per-token learned mix) and ``gated_multi_residual`` (its port of the
gated residual) where the installed version has the option.

hyper-connections (lucidrains' package) is a library of residual wrappers, not a decoder: its rows run
this project's ``none`` decoder (same embedding, attention, FFN and head) with each sublayer's residual
connection replaced by the package's module (``PackageResidual``): with ``disable=True`` (its plain
``Residual``) the baseline, with 4 streams its HC and its mHC the variants.

The packages are imported only here and only when a builder runs: the default bench never needs them.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass, field

import torch
from torch import nn

from lime_arch.model import build_model
from orchestrator.bench.shapes import Shape
from orchestrator.bench.step import bench_cfg

XT, HC = "x-transformers", "hyper-connections"
LIBRARIES = (XT, HC)
STREAMS = 4  # the HC paper's expansion rate, every stream count here


@dataclass(frozen=True)
class Variant:
    """One peer row: its library, name, options, and the project's row that does the same job."""

    library: str
    name: str
    options: dict = field(default_factory=dict)
    counterpart: str = "none"  # the project's label (``router[+depth_mix]``)


XT_BASE = Variant(XT, "baseline")
HC_BASE = Variant(HC, "baseline (Residual)")
VARIANTS = (
    XT_BASE,
    Variant(XT, "integrate_layers", {"integrate_layers": True}, "dynamic"),
    # x-transformers' HyperConnection: sigmoid read and write, Sinkhorn-normalised stream mixing (mHC's constraints)
    Variant(XT, f"num_residual_streams={STREAMS}", {"num_residual_streams": STREAMS}, "none+mhc"),
    Variant(XT, "add_value_residual", {"add_value_residual": True}, "none+value-residual-learned"),
    # its gated residual runs over residual streams and needs a bottleneck rank: the project's defaults (4, 8)
    Variant(XT, f"gated_multi_residual x{STREAMS}",
            {"gated_multi_residual": True, "num_residual_streams": STREAMS,
             "residual_fn_kwargs": {"read_gate_rank": 8}},
            "none+gated-residual"),
    HC_BASE,
    Variant(HC, f"HyperConnections x{STREAMS}", {"kind": "hc"}, "none+hyper-connections"),
    Variant(HC, f"mHC x{STREAMS}", {"kind": "mhc"}, "none+mhc"),
)


def missing() -> list[str]:
    """The peer libraries this environment cannot import (none of them: the extra is installed)."""
    out = []
    try:
        import x_transformers  # noqa: F401
    except ImportError:
        out.append(XT)
    try:
        import hyper_connections  # noqa: F401
    except ImportError:
        out.append(HC)
    return out


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def unsupported(v: Variant) -> str | None:
    """Why ``v`` cannot be built with the installed library (None: it can): an x-transformers option
    this version does not have."""
    if v.library != XT:
        return None
    params = inspect.signature(importlib.import_module("x_transformers.x_transformers").AttentionLayers).parameters
    absent = [k for k in v.options if k not in params]
    return f"no option {', '.join(absent)} in x-transformers {version(XT)}" if absent else None


def xt_model(shape: Shape, v: Variant, vocab: int, seq: int, device) -> nn.Module:
    """x-transformers' decoder at the bench model's shape with ``v``'s options."""
    xt = importlib.import_module("x_transformers")
    cfg = bench_cfg(shape, "none", device, seq, vocab)
    decoder = xt.Decoder(dim=cfg.d_model, depth=cfg.n_layers, heads=cfg.n_heads, attn_dim_head=cfg.head_dim,
                         attn_kv_heads=cfg.kv_heads, attn_flash=True, rotary_pos_emb=True, rotary_emb_dim=cfg.head_dim,
                         use_rmsnorm=True, ff_glu=True, ff_swish=True, ff_mult=cfg.ffn_dim / cfg.d_model,
                         ff_no_bias=True, verbose=False, **v.options)
    return xt.TransformerWrapper(num_tokens=vocab, max_seq_len=seq, attn_layers=decoder, tie_embedding=True)


class PackageResidual(nn.Module):
    """The depth-mix protocol of ``LIMeDecoder`` (``begin``, ``sublayer``, ``after_block``, ``end``,
    ``wrap_mixer``, ``decays``) over the hyper-connections package: sublayer k (2l attention, 2l + 1
    FFN of layer l) goes through the package's module k, made by its own
    ``get_init_and_expand_reduce_stream_functions``; the streams ride in the batch dimension, as the
    package keeps them ((B n), T, C), expanded after the embedding and summed before the final norm."""

    def __init__(self, kind: str | None, n_layers: int, d_model: int):
        super().__init__()
        pkg = importlib.import_module("hyper_connections")
        make = pkg.mc_get_init_and_expand_reduce_stream_functions if kind == "mhc" else \
            pkg.get_init_and_expand_reduce_stream_functions
        init, self.expand, self.reduce = make(STREAMS, dim=d_model, disable=kind is None)
        self.conns = nn.ModuleList([init(layer_index=k) for k in range(2 * n_layers)])

    def begin(self, x, memo):
        return self.expand(x)

    def sublayer(self, k, x, fn, memo):
        branch_input, add_residual = self.conns[k](x)
        return add_residual(fn(branch_input))

    def after_block(self, l, x, memo):
        return x

    def end(self, x, memo):
        return self.reduce(x)

    def wrap_mixer(self, mixer, memo):
        return mixer

    def decays(self, name: str) -> bool:
        # the dynamic projections (``dynamic_alpha_fn``, ``dynamic_beta_fn``) decay like the project's HC's
        # projection does; the static mixing weights and scales take none (``lime_arch.optim``)
        return name.rsplit(".", 1)[-1].endswith("_fn")


def hc_model(shape: Shape, v: Variant, vocab: int, seq: int, device) -> nn.Module:
    """The project's ``none`` decoder (seed 0: the weights of the bench's ``none`` model) with the
    hyper-connections package's residual connections."""
    torch.manual_seed(0)
    model = build_model(bench_cfg(shape, "none", device, seq, vocab))
    model.depth_mix = PackageResidual(v.options.get("kind"), model.cfg.n_layers, model.cfg.d_model)
    return model


def build(shape: Shape, v: Variant, vocab: int, seq: int, device) -> nn.Module:
    """``v`` at ``shape`` on ``device``, its weights drawn from seed 0."""
    torch.manual_seed(0)
    model = xt_model(shape, v, vocab, seq, device) if v.library == XT else hc_model(shape, v, vocab, seq, device)
    return model.to(device)
