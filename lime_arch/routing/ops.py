"""The buffer mixer as opaque custom ops, for ``torch.compile``.

Dynamo cannot trace the buffer mixer: it writes into pooled tensors in place, memoises views of
them and keeps Python state between layers and between forward and backward. Under
``torch.compile`` the mixer therefore calls these ``torch.library`` ops instead of its autograd
functions; Inductor sees each as one opaque call with a fake (meta) kernel for shapes and strides,
and a registered autograd formula that calls the backward op. The ops run exactly the eager
mixer's code (``BufferState.route_layer`` / ``backward_layer``), so the routing's numerics are the
eager ones; only the rest of the model is compiled.

  lime::route_begin(k, v, ...) -> token                    layer 0: a new pass, slot 0 written
  lime::route_layer(k, v, w, token, members, ...) -> (kv, token)   layer l >= 1: write slot l, route
  lime::route_layer_backward / lime::route_begin_backward  their backward

The *token* is a CPU float64 scalar holding the pass id; ``PASSES`` maps it to the pass's
``BufferState``. Every op consumes the previous layer's token and each backward returns a
gradient for it, so data dependencies alone order the ops as eager autograd does (forward by
layer, backward from the last layer down, ``route_begin_backward`` last, which releases the
buffers). ``kv`` holds routed K and V as one (2, B, R, T, Hd) tensor (a custom op may not return
two views of one storage). The plan and layout come from the router's spec: ``_config`` rebuilds
the router on the meta device (its sources depend only on the spec and the depth), so the
compiled graph holds names and numbers only. A pass whose backward never runs stays in ``PASSES``
until ``MAX_PASSES`` newer passes push it out.

The ops are generic over the router's kind: the shapes and strides of their outputs (and of the
fake kernels') come from the kind object (``BufferedKind.rows_shape``, ``kv_pair``,
``routed_pair``, ``routed_like``), so a new buffered kind needs no change here.
"""
from __future__ import annotations

import functools
import itertools

import torch

from lime_arch.router_base import Router, build_router
from lime_arch.routing.plan import Layout, Plan, plan_for
from lime_arch.routing.state import BufferState

Tensor = torch.Tensor
MAX_PASSES = 8  # forward passes in flight (a grad-mode pass waits for its backward)
_TAGS = (torch.Tag.cudagraph_unsafe,)  # Python state: CUDA graphs cannot replay these ops


@functools.lru_cache(maxsize=128)
def _config(spec: str, n_layers: int, R: int, Hd: int, block: int) -> tuple[Router, Layout, Plan]:
    """The router's structure (a meta-device copy), its layout and plan; ``block`` < 0: the chooser's."""
    with torch.device("meta"):
        router = build_router(spec, n_layers=n_layers, n_kv_heads=R, head_dim=Hd, init="identity")
    layout = Layout(router, memoize=False)  # weights come from many models: memoise no views
    return router, layout, plan_for(router, layout, None if block < 0 else block)


@torch.compiler.assume_constant_result
def members_taken(spec: str, n_layers: int, R: int, Hd: int, block: int) -> tuple[tuple[int, ...], ...]:
    """Per layer: the later layers of its block whose weights its op takes (it leads the block)."""
    _, _, plan = _config(spec, n_layers, R, Hd, block)
    out = [()] * n_layers
    for b, leader in enumerate(plan.leaders):
        if leader is not None:
            out[leader] = tuple(plan.taken[b])
    return tuple(out)


class _Passes:
    """Live passes by id (a pass in grad mode lives until its layer-0 backward)."""

    def __init__(self):
        self.states: dict[int, BufferState] = {}
        self.ids = itertools.count(1)

    def open(self, state: BufferState) -> Tensor:
        pid = next(self.ids)
        self.states[pid] = state
        while len(self.states) > MAX_PASSES:  # oldest first: dicts keep insertion order
            self.states.pop(next(iter(self.states))).release()
        return torch.tensor(float(pid), dtype=torch.float64)

    def get(self, token: Tensor) -> BufferState:
        pid = int(token.item())
        state = self.states.get(pid)
        if state is None:
            raise RuntimeError(f"routing pass {pid} is gone: more than {MAX_PASSES} forward passes were "
                               "in flight before its backward (lime_arch.routing.ops.MAX_PASSES)")
        return state

    def close(self, token: Tensor) -> None:
        state = self.states.pop(int(token.item()), None)
        if state is not None:
            state.release()


PASSES = _Passes()


def _token_like() -> Tensor:
    return torch.empty((), dtype=torch.float64, device="cpu")


def _weight_out(g: Tensor | None, like: Tensor, need: bool) -> Tensor:
    """A weight gradient as the op returns it: contiguous, ``like``'s shape, its own storage (a block's
    weight gradients are views of one product, and an op's outputs may not alias); empty when not needed."""
    if not need:
        return like.new_empty(0)
    if g is None:
        return torch.zeros_like(like, memory_format=torch.contiguous_format)
    return g if g._base is None and g.is_contiguous() else g.clone(memory_format=torch.contiguous_format)


# -- layer 0 ----------------------------------------------------------------------------------
@torch.library.custom_op("lime::route_begin", mutates_args=(), tags=_TAGS)
def route_begin(k: Tensor, v: Tensor, spec: str, n_layers: int, R: int, Hd: int, block: int,
                weight_dtype: torch.dtype, grad: bool) -> Tensor:
    router, layout, plan = _config(spec, n_layers, R, Hd, block)
    state = BufferState(router, layout, plan, k, weight_dtype)
    state.write(0, k, v)
    token = PASSES.open(state)
    if not grad and n_layers == 1:
        PASSES.close(token)
    return token


@route_begin.register_fake
def _(k, v, spec, n_layers, R, Hd, block, weight_dtype, grad):
    return _token_like()


@torch.library.custom_op("lime::route_begin_backward", mutates_args=(), tags=_TAGS)
def route_begin_backward(token: Tensor, g_token: Tensor, B: int, T: int, dtype: torch.dtype,
                         device: torch.device, spec: str, n_layers: int, R: int, Hd: int, block: int) -> Tensor:
    state = PASSES.get(token)
    kind = state.kind
    rows = state.slot_grad_rows(0)
    if rows is None:  # no layer read slot 0 with a gradient
        rows = torch.zeros(kind.rows_shape(B, T, R, Hd, state.rows_per_slot), dtype=dtype, device=device)
    PASSES.close(token)
    return kind.kv_pair(rows.contiguous(), B, T, R, Hd, False)


@route_begin_backward.register_fake
def _(token, g_token, B, T, dtype, device, spec, n_layers, R, Hd, block):
    _, layout, _ = _config(spec, n_layers, R, Hd, block)
    kind = layout.kind
    rows = torch.empty(kind.rows_shape(B, T, R, Hd, layout.rows_per_slot), dtype=dtype, device=device)
    return kind.kv_pair(rows, B, T, R, Hd, False)


def _begin_setup(ctx, inputs, output) -> None:
    k = inputs[0]
    ctx.save_for_backward(output)
    ctx.cfg = tuple(inputs[2:7])  # spec, n_layers, R, Hd, block
    ctx.kv = (k.shape[0], k.shape[1], k.dtype, k.device)


def _begin_backward(ctx, g_token):
    (token,) = ctx.saved_tensors
    g_token = torch.zeros((), dtype=torch.float64) if g_token is None else g_token
    g = route_begin_backward(token, g_token, *ctx.kv, *ctx.cfg)
    return g[0], g[1], None, None, None, None, None, None, None


torch.library.register_autograd("lime::route_begin", _begin_backward, setup_context=_begin_setup)


# -- layers >= 1 ------------------------------------------------------------------------------
@torch.library.custom_op("lime::route_layer", mutates_args=(), tags=_TAGS)
def route_layer(k: Tensor, v: Tensor, w: Tensor, token: Tensor, members: list[Tensor], spec: str, n_layers: int,
                R: int, Hd: int, block: int, l: int, grad: bool) -> tuple[Tensor, Tensor]:
    state = PASSES.get(token)
    kv = state.kind.routed_pair(state.route_layer(l, k, v, w, members, grad), state.B, state.T, R, Hd)
    if not grad and l == n_layers - 1:  # no backward will come: the buffer goes back now
        PASSES.close(token)
    return kv, token.clone()


@route_layer.register_fake
def _(k, v, w, token, members, spec, n_layers, R, Hd, block, l, grad):
    _, layout, _ = _config(spec, n_layers, R, Hd, block)
    return layout.kind.routed_like(k, k.shape[0], k.shape[1], R, Hd), _token_like()


@torch.library.custom_op("lime::route_layer_backward", mutates_args=(), tags=_TAGS)
def route_layer_backward(g_kv: Tensor, g_token: Tensor, token: Tensor, w: Tensor, members: list[Tensor],
                         spec: str, n_layers: int, R: int, Hd: int, block: int, l: int, need_kv: bool,
                         need_w: bool, need_members: list[bool]) -> tuple[Tensor, Tensor, list[Tensor], Tensor]:
    state = PASSES.get(token)
    rows, dw, others = state.backward_layer(l, g_kv[0], g_kv[1], need_w, need_kv, need_members)
    kind, B, T = state.kind, state.B, state.T
    if rows is None:
        rows = g_kv.new_zeros(kind.rows_shape(B, T, R, Hd, state.rows_per_slot))
    slot = kind.kv_pair(rows.contiguous(), B, T, R, Hd, False)
    return (slot, _weight_out(dw, w, need_w), [_weight_out(g, m, n) for g, m, n in zip(others, members, need_members)],
            torch.zeros((), dtype=torch.float64))


@route_layer_backward.register_fake
def _(g_kv, g_token, token, w, members, spec, n_layers, R, Hd, block, l, need_kv, need_w, need_members):
    _, layout, _ = _config(spec, n_layers, R, Hd, block)
    B, T, kind = g_kv.shape[1], g_kv.shape[3], layout.kind
    rows = g_kv.new_empty(kind.rows_shape(B, T, R, Hd, layout.rows_per_slot))
    return (kind.kv_pair(rows, B, T, R, Hd, False), _weight_out(None, w, need_w),
            [_weight_out(None, m, n) for m, n in zip(members, need_members)], _token_like())


def _layer_setup(ctx, inputs, output) -> None:
    k, v, w, token, members = inputs[:5]
    ctx.save_for_backward(token, w, *members)
    ctx.cfg = tuple(inputs[5:11])  # spec, n_layers, R, Hd, block, l
    ctx.kv_meta = (output[0].shape, output[0].dtype, output[0].device)


def _layer_backward(ctx, g_kv, g_token):
    token, w, *members = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_members = [bool(need[4])] * len(members) if isinstance(need[4], bool) else [bool(n) for n in need[4]]
    if g_token is None:
        g_token = torch.zeros((), dtype=torch.float64)
    if g_kv is None:  # neither routed K nor V reached the loss
        shape, dtype, device = ctx.kv_meta
        g_kv = torch.zeros(shape, dtype=dtype, device=device)
    slot, dw, m_grads, g_link = route_layer_backward(g_kv, g_token, token, w, members, *ctx.cfg,
                                                     bool(need[0] or need[1]), bool(need[2]), need_members)
    return (slot[0], slot[1], dw if need[2] else None, g_link,
            [g if n else None for g, n in zip(m_grads, need_members)], None, None, None, None, None, None, None)


torch.library.register_autograd("lime::route_layer", _layer_backward, setup_context=_layer_setup)
