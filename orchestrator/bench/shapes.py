"""What the benchmark measures: the shapes, batch and vocabulary, the peer, the routers (torch-free).

``lime bench --help`` and the option checks read this module, so it imports no torch: the router
registry is reached through ``lime_arch``'s lazy public names, only when ``bench_routers`` runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lime_arch
from lime_arch.errors import ConfigError

PEER = "full/concat"  # label of the naive reference: full routing, the paper's concatenation
# Vocabulary 2,048, not GPT-2's 50,257: at width 256 a 50k head would be 43% of the 16-layer
# model's FLOPs and 44% of its parameters (AdamW time), hiding the routing behind the LM head;
# with 2,048 the head is ~3% (the paper's 1B models' is ~9%).
VOCAB, BATCH, SEQ = 2048, 2, 64
QUICK_BATCH, QUICK_SEQ = 1, 16
# decode: the baseline, full, the paper's serving router (first-4) and the token-dependent dynamic
DECODE_ROUTERS, DECODE_BATCHES = ("none", "full", "first-4", "dynamic"), (1, 8)
# torch.compile modes of ``--compile``: "none" runs eager only; a mode adds compiled rows beside the
# eager ones, each paired against ``none`` compiled the same way (the paper's Table 17 was measured
# compiled with Inductor)
COMPILE_MODES = ("none", "default", "reduce-overhead")
# The shapes compiled by default: the paper's Table 17 models have 16 layers (1B, MHA and GQA). A
# whole-model Inductor build grows with depth: cold, one variant of L64-MHA took 220 s on the 2-core
# dev CPU (L16: 48 s), so compiled rows at L64 and L128 (16 variants each, and again in the memory
# subprocesses) would add well over an hour; ``--compile-shapes all`` asks for them.
COMPILE_SHAPES = ("L16-MHA", "L16-GQA")

# Router families run at their declared example argument (first-4: the paper's serving setting,
# arXiv 2502.09245 Table 18; dilated-8: its Table 15 setting).


@dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    n_kv_heads: int
    reps: int


# The deep config (``preset("deep32")``: width 256, FFN 1024, 8 heads) at 16 layers, MHA and GQA
# (2 KV heads), 64 and 128 layers; fewer interleaved rounds where a step takes longer.
SHAPES = (Shape("L16-MHA", 16, 8, 20), Shape("L16-GQA", 16, 2, 20), Shape("L64-MHA", 64, 8, 10),
          Shape("L128-MHA", 128, 8, 7))
# ``make bench`` (``lime bench --headline``): the shapes of the targets, every router eager and compiled
# and every depth mix eager at 16 layers, the routers and the peer at L64-MHA eager (the depth mixes'
# compiled and 64-layer rows, L128 and compiled memory are ``make bench-full``'s: each compiled variant
# is a cold Inductor build of ~48 s at 16 layers); the round caps aim at 20 minutes alone on the 2-core
# dev CPU (the estimate is in docs/BENCH.md)
HEADLINE_SHAPES, HEADLINE_MIX_SHAPES = ("L16-MHA", "L16-GQA", "L64-MHA"), ("L16-MHA", "L16-GQA")
HEADLINE_CAPS = {"L16-MHA": 8, "L16-GQA": 8, "L64-MHA": 7}
QUICK_SHAPES = (Shape("L3-MHA", 3, 8, 1), Shape("L3-GQA", 3, 2, 1))
# ``--peers`` runs at the shapes of at most this many layers (the headline L16-MHA and L16-GQA, or a quick
# run's): deeper, x-transformers' integrate_layers (each sublayer mixes every earlier one's hidden state,
# O(L^2)) would take minutes a round
PEER_MAX_LAYERS = 16
SHAPES_BY_NAME = {s.name: s for s in SHAPES + QUICK_SHAPES}


def bench_routers() -> tuple[str, ...]:
    """Every registered router in registration order, a family at its declared example argument
    (none, full, average, last-4, first-4, dilated-8, no-head-mix, per-dim with today's registry)."""
    return tuple(lime_arch.router_specs())


def bench_depth_mixes() -> tuple[str, ...]:
    """Every registered depth mix but ``none``, at its defaults, in registration order: the paper's
    Table 17 peers (arXiv 2502.09245) and the 2026 field (issue 27), each a row labelled
    ``none+<depth mix>`` (a label is ``router[/impl][+depth_mix]``), timed against none like every
    router, without a target. A newly registered mix gets its rows without being named here."""
    return tuple(d for d in lime_arch.depth_mix_specs() if d != "none")


def split_label(label: str) -> tuple[str, str, str]:
    """``router[/impl][+depth_mix]`` -> (router, impl, depth_mix), e.g. ``none+denseformer`` ->
    (none, buffer, denseformer), ``full/concat`` -> (full, concat, none)."""
    rest, _, depth_mix = label.partition("+")
    router, _, impl = rest.partition("/")
    return router, impl or "buffer", depth_mix or "none"


def depth_mix_labels(depth_mixes: Sequence[str]) -> tuple[str, ...]:
    """The benchmark labels of the depth-mix rows: each depth mix over the none router."""
    return tuple(f"none+{d}" for d in depth_mixes if d != "none")


def compile_shape_names(spec: str | None, ran: Sequence[str], quick: bool = False) -> tuple[str, ...]:
    """The shapes that get compiled rows: ``spec`` is ``all``, a comma-separated list, or None for
    the default (``COMPILE_SHAPES``; every shape of a quick run). ``ran``: the benchmarked shapes.
    An unknown name, or a list that compiles none of ``ran`` (a silently eager run), is a ConfigError."""
    if spec is None:
        names = tuple(ran) if quick else COMPILE_SHAPES
    else:
        names = tuple(SHAPES_BY_NAME) if spec == "all" else tuple(spec.split(","))
    bad = [n for n in names if n not in SHAPES_BY_NAME and n not in ran]  # ran: maybe a caller's own shapes
    if bad:
        raise ConfigError(f"bench.compile_shapes: unknown {', '.join(bad)}; allowed: all, {', '.join(SHAPES_BY_NAME)}")
    if not set(names) & set(ran):
        raise ConfigError(f"bench.compile_shapes: {', '.join(names)} compiles none of the benchmarked shapes "
                          f"({', '.join(ran)}); pass --compile-shapes all or some of them")
    return names
