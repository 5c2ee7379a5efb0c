"""The buffer mixer's execution: the per-pass buffer state and the autograd functions.

``BufferState`` owns one forward pass's K/V buffer (pooled, ``lime_arch.routing.pool``) and,
during backward, the gradient buffers; ``WriteLayer0`` and ``RouteLayer`` are the custom
autograd functions that write each layer's K/V, route it and do the gradient bookkeeping. The
design is described in ``lime_arch.routing.mixers`` and in docs/ARCHITECTURE.md, "Routing
internals". Shapes: D is the batch dimension of the products and N the columns (K and V side by
side), both the router kind's (``BufferedKind.buffer_dims``: linear (1, 2*B*T*Hd), same-head
(R, 2*B*T*Hd), per-dim (Hd, 2*B*T)); a slot is ``rows_per_slot`` rows. Everything that depends on
the layout (K/V views of the buffer, the routed outputs) is asked of the kind.
"""
from __future__ import annotations

import weakref

import torch
from torch.autograd import Function

from lime_arch.router_base import Router
from lime_arch.routing.plan import LayerBlock, Layout, Plan
from lime_arch.routing.pool import POOL, Buf

Tensor = torch.Tensor
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every BufferState alive (for ``held_bytes``)


def held_bytes() -> int:
    """Bytes of the K/V buffers that live passes hold for their backward. Autograd's saved-tensor
    hooks do not see them (the buffer is written in place, outside ``save_for_backward``), so
    memory accounting adds them (``lime_arch.saved``)."""
    return sum(st.kv.numel() * st.kv.element_size() for st in list(_LIVE) if st.kv is not None)


class BufferState:
    """The buffer of one forward pass, its plan, and the gradient buffers during backward.

    Views of the pooled tensors are memoised on them (``Buf.memo``): a view op from Python costs
    several microseconds, which at GQA sizes is as much as the products themselves."""

    def __init__(self, router: Router, layout: Layout, plan: Plan, k: Tensor, weight_dtype: torch.dtype):
        B, T, R, Hd = k.shape
        self.L, self.R, self.B, self.T, self.Hd = router.n_layers, R, B, T, Hd
        self.layout, self.plan = layout, plan
        self.rows_per_slot, self.out_rows = layout.rows_per_slot, layout.out_rows
        self.kind = layout.kind
        self.D, self.N = self.kind.buffer_dims(B, T, R, Hd)
        self.kv_buf: Buf | None = POOL.get((self.D, self.L * self.rows_per_slot, self.N), k)
        self.kv = self.kv_buf.t
        # write views per slot, memoised on the pooled tensor
        self.write_views = self.kv_buf.memo.setdefault(("kvw", layout.kind, R, B, T), [None] * self.L)
        self.old_grad: Buf | None = None  # K/V gradient of old slots (blocked routers' old-slot part)
        self.old_grad_rows = 0  # rows [0, old_grad_rows) of old_grad hold values; never zero-filled whole
        self.old_part: dict[int, Tensor] = {}  # block -> its members' old-slot part, stacked (D, n_mem*out_rows, N)
        self.old_weights: dict[int, Tensor] = {}  # block -> its members' old-slot weight columns, stacked
        self.grad_out: dict[int, Buf] = {}  # block -> output gradients of its layers (D, n_layers*out_rows, N)
        self.in_weights: dict[int, Buf] = {}  # block -> in-block weights per layer, placed at their slots'
        #   columns (D, n_layers*out_rows, n_layers*rows_per_slot)
        self.weight_dtype = weight_dtype
        _LIVE.add(self)

    def release(self) -> None:
        """Hand the buffers back to the pool: after the last backward (``WriteLayer0``) or when the
        state dies. No view of them escapes (routed K/V and slot gradients are fresh tensors)."""
        POOL.put(self.kv_buf)  # gradient-side tensors are not pooled: they would sit in memory
        self.kv_buf = self.old_grad = self.kv = None  # between steps and raise the next step's peak
        self.grad_out, self.in_weights = {}, {}

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the pool may be gone
            pass

    # -- views ---------------------------------------------------------------------------------
    def _kv_views(self, t: Tensor, out_order: bool) -> tuple[Tensor, Tensor]:
        """(D, rows, N) -> K, V views: (B, T, R, Hd) (buffer order) or (B, R, T, Hd) (routed order)."""
        return self.kind.kv_views(t, self.B, self.T, self.R, self.Hd, out_order)

    def write(self, l: int, k: Tensor, v: Tensor) -> None:
        """Copy layer l's raw K and V into its slot."""
        views = self.write_views[l]
        if views is None:
            n = self.rows_per_slot
            views = self.write_views[l] = self._kv_views(self.kv_buf.rows(l * n, (l + 1) * n), False)
        views[0].copy_(k)
        views[1].copy_(v)

    def split(self, out: Tensor) -> tuple[Tensor, Tensor]:
        """Routed (D, out_rows, N) -> K, V as (B, R, T, Hd) with Hd contiguous (views, or the
        kind's one copy into attention's layout)."""
        return self.kind.split(out, self.B, self.T, self.R, self.Hd)

    def _old_slot_rows(self, blk: LayerBlock) -> Tensor:
        """The buffer rows of the block's old slots: a view if they are one run, else a gathered copy."""
        if blk.old_index is None:
            _, _, r0, r1 = blk.old_runs[0]
            return self.kv_buf.rows(r0, r1)
        return self.kv.index_select(1, blk.old_index.to(self.kv.device))

    # -- forward products ----------------------------------------------------------------------
    def old_slots_forward(self, b: int, old_cols: list[Tensor]) -> None:
        """P_b = W_old @ buf[old slots]: the old-slot part of every member of block b in one product
        (``old_cols``: each member's old-slot weight columns)."""
        blk, dt = self.plan.blocks[b], self.kv.dtype
        n_slots, n_out, n = len(blk.old_slots), self.out_rows, self.rows_per_slot
        if blk.dense_old:  # every member reads all old slots (full, first-j, dilated-d, ...)
            w_old = torch.cat(old_cols, dim=1) if len(old_cols) > 1 else old_cols[0]
            if w_old.dtype != dt:
                w_old = w_old.to(dt)
        else:
            w_old = old_cols[0].new_zeros(self.D, len(old_cols) * n_out, n_slots * n, dtype=dt)
            for i, (w, cols, n_src) in enumerate(zip(old_cols, blk.old_cols, blk.n_old)):
                dst = w_old[:, i * n_out:(i + 1) * n_out].view(self.D, n_out, n_slots, n)
                dst[:, :, cols] = w.to(dt).reshape(self.D, n_out, n_src, n)
        self.old_weights[b] = w_old
        self.old_part[b] = torch.bmm(w_old, self._old_slot_rows(blk))

    def route(self, w_in: Tensor, l: int) -> Tensor:
        """Layer l's routed K/V (D, out_rows, N): its block's old-slot part plus its in-block sources."""
        plan = self.plan
        if w_in.dtype != self.kv.dtype:
            w_in = w_in.to(self.kv.dtype)
        i = plan.member_idx[l]
        out, fresh = None, False
        if i is not None:
            b = plan.block_of[l]
            out = self.old_part[b][:, i * self.out_rows:(i + 1) * self.out_rows]
            if i == len(plan.blocks[b].members) - 1:
                del self.old_part[b]  # the last reader of this block's P
        if plan.in_single_run[l]:
            _, _, r0, r1 = plan.in_runs[l][0]
            x = self.kv_buf.rows(r0, r1)
            return torch.bmm(w_in, x) if out is None else torch.baddbmm(out, w_in, x)
        for c0, c1, r0, r1 in plan.in_runs[l]:
            a, x = w_in[:, :, c0:c1], self.kv_buf.rows(r0, r1)
            if fresh:
                out.baddbmm_(a, x)
            else:  # the first term makes a fresh tensor; P stays intact
                out = torch.bmm(a, x) if out is None else torch.baddbmm(out, a, x)
                fresh = True
        return out if fresh else out.clone()

    def place_in_weights(self, l: int, w_in: Tensor) -> None:
        """Put layer l's in-block weights into its block's ``in_weights`` (for the slot gradients)."""
        plan, n_out = self.plan, self.out_rows
        b = plan.block_of[l]
        blk = plan.blocks[b]
        block_w = self.in_weights.get(b)
        if block_w is None:
            nl = blk.l1 - blk.l0
            block_w = self.in_weights[b] = Buf(self.kv.new_zeros(self.D, nl * n_out, nl * self.rows_per_slot))
        i, base = l - blk.l0, blk.l0 * self.rows_per_slot
        if plan.in_single_run[l]:
            _, _, r0, r1 = plan.in_runs[l][0]
            block_w.t[:, i * n_out:(i + 1) * n_out, r0 - base:r1 - base] = w_in
        else:
            for c0, c1, r0, r1 in plan.in_runs[l]:
                block_w.t[:, i * n_out:(i + 1) * n_out, r0 - base:r1 - base] = w_in[:, :, c0:c1]

    # -- backward ------------------------------------------------------------------------------
    def store_grad_out(self, l: int, gk: Tensor | None, gv: Tensor | None) -> Tensor:
        """Copy layer l's output gradient into its rows of the block's grad_out; return those rows."""
        plan, n_out = self.plan, self.out_rows
        b = plan.block_of[l]
        blk = plan.blocks[b]
        block_grad = self.grad_out.get(b)
        if block_grad is None:
            # backward runs the block's layers in descending order (the link chain), so the first
            # one here is the highest that ran: only the rows above it need zeros (a partial forward)
            block_grad = self.grad_out[b] = Buf(self.kv.new_empty(self.D, (blk.l1 - blk.l0) * n_out, self.N))
            block_grad.t[:, (l - blk.l0 + 1) * n_out:].zero_()
        i = l - blk.l0
        rows = block_grad.t[:, i * n_out:(i + 1) * n_out]
        vk, vv = self._kv_views(rows, True)
        vk.zero_() if gk is None else vk.copy_(gk)
        vv.zero_() if gv is None else vv.copy_(gv)
        return rows

    def slot_grad_rows(self, s: int) -> Tensor | None:
        """grad_s = old_grad[s] (from later blocks) + W_in(s)^T @ grad_out[in-block readers of s], as a
        fresh (D, rows_per_slot, N) tensor; None when no reader of slot s got a gradient."""
        plan, n, n_out = self.plan, self.rows_per_slot, self.out_rows
        b = plan.block_of[s]
        block_grad = self.grad_out.get(b)
        out = self.old_grad.t[:, s * n:(s + 1) * n] if (s + 1) * n <= self.old_grad_rows else None
        fresh = False
        if block_grad is not None:
            w_in_all, g_all, l0 = self.in_weights[b].t, block_grad.t, plan.blocks[b].l0
            c = (s - l0) * n
            for la, lb in plan.reader_runs[s]:
                a = w_in_all[:, (la - l0) * n_out:(lb - l0) * n_out, c:c + n].transpose(1, 2)
                g = g_all[:, (la - l0) * n_out:(lb - l0) * n_out]
                if fresh:
                    out.baddbmm_(a, g)
                else:
                    out = torch.bmm(a, g) if out is None else torch.baddbmm(out, a, g)
                    fresh = True
        if out is None:
            return None
        if not fresh:  # a view of the gradient buffer, which is reused: copy
            out = out.clone()
        return out

    def slot_grad(self, s: int) -> tuple[Tensor, Tensor] | None:
        """Slot s's K and V gradients as (B, T, R, Hd) views of ``slot_grad_rows(s)``."""
        out = self.slot_grad_rows(s)
        return None if out is None else self._kv_views(out, False)

    def block_weight_grads(self, b: int, needs: list[bool]) -> list[Tensor | None]:
        """dW of every layer of block b from its leader on (``Plan.leaders``; ``needs`` in that order),
        every later layer's grad_out being stored: batched, one product of the block's grad_out rows
        with the buffer rows ``Plan.dw_rows`` (else one per layer and run); the old-slot columns from
        the members' product unless ``Plan.dw_merged`` put them in the batched one."""
        plan, blk = self.plan, self.plan.blocks[b]
        leader, n_out, n, D = plan.leaders[b], self.out_rows, self.rows_per_slot, self.D
        group = range(leader, blk.l1)
        block_grad = self.grad_out.get(b)
        if block_grad is None or not any(needs):  # no layer of the block got a gradient, or none is wanted
            return [None] * len(group)
        g = block_grad.rows((leader - blk.l0) * n_out, (blk.l1 - blk.l0) * n_out)  # (D, |group|*out_rows, N)
        dw_all = None
        if plan.dw_rows[b] is not None:
            dw_all = torch.bmm(g, self._rows_t(*plan.dw_rows[b]))  # (D, |group|*out_rows, |dw_rows|)
        dw_old: dict[int, Tensor] = {}
        if not plan.dw_merged[b] and any(nd for l, nd in zip(group, needs) if plan.member_idx[l] is not None):
            x_old = self._old_slot_rows(blk)
            mo = torch.bmm(self._member_grads(b, block_grad), x_old.transpose(1, 2))  # (D, n_mem*out_rows, |old|*n)
            for i, (m, cols, n_src) in enumerate(zip(blk.members, blk.old_cols, blk.n_old)):
                old = mo[:, i * n_out:(i + 1) * n_out]
                if not blk.dense_old:
                    old = old.reshape(D, n_out, len(blk.old_slots), n)[:, :, cols].reshape(D, n_out, n_src * n)
                dw_old[m] = old
        out: list[Tensor | None] = []
        for i, (l, need) in enumerate(zip(group, needs)):
            if not need:
                out.append(None)
                continue
            rows = g[:, i * n_out:(i + 1) * n_out] if dw_all is None else dw_all[:, i * n_out:(i + 1) * n_out]
            parts = [dw_old[l]] if l in dw_old else []
            if dw_all is None:  # g_l @ buf[run]^T per run of its in-block sources
                parts += [torch.bmm(rows, self._rows_t(c0, c1)) for _, _, c0, c1 in plan.dw_runs[l]]
            else:
                parts += [rows[:, :, c0:c1] for _, _, c0, c1 in plan.dw_runs[l]]
            out.append(self.layout.weight_grad(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2),
                                               self.weight_dtype))
        return out

    def _rows_t(self, r0: int, r1: int) -> Tensor:
        """``buf[:, r0:r1]^T`` (D, N, r1 - r0), memoised on the pooled buffer."""
        kb = self.kv_buf
        xt = kb.memo.get(("T", r0, r1))
        if xt is None:
            xt = kb.memo[("T", r0, r1)] = kb.rows(r0, r1).transpose(1, 2)
        return xt

    def _member_grads(self, b: int, block_grad: Buf) -> Tensor:
        """The members' rows of block b's grad_out: a view if they are one run, else a gathered copy."""
        blk, n_out = self.plan.blocks[b], self.out_rows
        if blk.member_rows is not None:
            return block_grad.rows(*blk.member_rows)
        idx = torch.tensor([(m - blk.l0) * n_out + r for m in blk.members for r in range(n_out)],
                           device=block_grad.t.device)
        return block_grad.t.index_select(1, idx)

    def old_slots_backward(self, b: int) -> None:
        """old_grad[old slots] += W_old^T grad_out[members]: the old slots' gradient from block b."""
        blk = self.plan.blocks[b]
        w_old = self.old_weights.pop(b)
        block_grad = self.grad_out.get(b)
        if block_grad is None:  # no layer of the block got a gradient
            return
        n, D = self.rows_per_slot, self.D
        g_members = self._member_grads(b, block_grad)
        if self.old_grad is None:
            self.old_grad = Buf(torch.empty_like(self.kv))
        grad = self.old_grad
        if blk.old_index is None:
            _, _, r0, r1 = blk.old_runs[0]
            fresh = r0 >= self.old_grad_rows  # rows [r0, r1) hold nothing yet: write, do not add
            self._zero_old_grad_to(r0 if fresh else r1)
            if D == 1:
                dst = grad.rows(r0, r1)
                torch.bmm(w_old.transpose(1, 2), g_members, out=dst) if fresh \
                    else dst.baddbmm_(w_old.transpose(1, 2), g_members)
            else:  # a batch dimension (strided rows): product, then add
                upd = torch.bmm(w_old.transpose(1, 2), g_members)
                grad.rows(r0, r1).copy_(upd) if fresh else grad.rows(r0, r1).add_(upd)
            self.old_grad_rows = max(self.old_grad_rows, r1)
        else:  # gathered rows
            self._zero_old_grad_to(blk.old_slots[-1] * n + n)
            grad.t.index_add_(1, blk.old_index.to(grad.t.device), torch.bmm(w_old.transpose(1, 2), g_members))

    def _zero_old_grad_to(self, r: int) -> None:
        """Zero-fill old_grad's rows [old_grad_rows, r): afterwards every row below r holds a value."""
        if r > self.old_grad_rows:
            self.old_grad.t[:, self.old_grad_rows:r].zero_()
            self.old_grad_rows = r

    def end_block(self, b: int) -> None:
        """Every slot of block b has its gradient and its old-slot part is done: free its buffers."""
        self.grad_out.pop(b, None)
        self.in_weights.pop(b, None)


    # -- one layer, forward and backward (the autograd functions and the compile ops call these) --
    def route_layer(self, l: int, k: Tensor, v: Tensor, w: Tensor, taken_weights, grad: bool = True) -> Tensor:
        """Write layer l's K/V into slot l and return its routed (D, out_rows, N). ``w`` is
        ``weight(l)``; a block's leader also gets the weights of the block's later layers
        (``Plan.taken``) and computes the block's old-slot part. ``grad``: keep what backward needs."""
        plan, layout = self.plan, self.layout
        self.write(l, k, v)
        b = plan.block_of[l]
        blk = plan.blocks[b]
        if l == plan.leaders[b] and blk.members:
            weight_of = dict(zip(plan.taken[b], taken_weights))
            weight_of[l] = w
            self.old_slots_forward(b, [layout.split_columns(weight_of[m], plan.n_old[m])[0] for m in blk.members])
        w_in = layout.split_columns(w, plan.n_old[l])[1]
        if grad:
            self.place_in_weights(l, w_in)
        return self.route(w_in, l)

    def backward_layer(self, l: int, gk: Tensor | None, gv: Tensor | None, need_w: bool, need_kv: bool,
                       need_taken: list[bool]) -> tuple[Tensor | None, Tensor | None, list[Tensor | None]]:
        """Layer l's backward (every later layer's has run): (slot l's gradient rows or None, dW of
        ``weight(l)`` or None, dW of the taken weights). Only a block's leader returns weight
        gradients: those of every layer of its block, in one product."""
        plan = self.plan
        self.store_grad_out(l, gk, gv)
        b = plan.block_of[l]
        blk = plan.blocks[b]
        dw, others = None, []
        if l == plan.leaders[b]:
            dw, *others = self.block_weight_grads(b, [need_w, *need_taken])
            if blk.members:
                self.old_slots_backward(b)
        slot_g = self.slot_grad_rows(l) if need_kv else None
        if l == blk.l0:
            self.end_block(b)
        return slot_g, dw, others


class WriteLayer0(Function):
    """Layer 0: write its K/V (it reads them unrouted); hand out slot 0's gradient, free all."""

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, state: BufferState):
        state.write(0, k, v)
        ctx.state = state
        return k.new_zeros(())

    @staticmethod
    def backward(ctx, g_token: Tensor):
        state = ctx.state
        g = state.slot_grad(0)
        state.release()
        return (None, None, None) if g is None else (g[0], g[1], None)


class RouteLayer(Function):
    """Layer l >= 1: write its K/V into slot l and route (``BufferState.route_layer``). ``w`` is
    ``weight(l)`` as the router returned it. The first layer of a block with members also takes the
    other members' weights (``member_weights``), computes the block's old-slot part P in forward
    and, in backward (which runs after every later layer of the block), the old-slot gradients and
    the members' whole dW.

    Backward (``BufferState.backward_layer``): store the output gradient into grad_out, dW of the
    in-block columns (a member keeps it for the block's first layer), then slot l's gradient (every
    reader of slot l is done)."""

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, w: Tensor, link: Tensor, state: BufferState, l: int,
                *member_weights: Tensor):
        ctx.state, ctx.l = state, l
        return state.split(state.route_layer(l, k, v, w, member_weights))

    @staticmethod
    def backward(ctx, gk: Tensor | None, gv: Tensor | None):
        state, l = ctx.state, ctx.l
        need = ctx.needs_input_grad
        slot_g, dw, others = state.backward_layer(l, gk, gv, need[2], need[0] or need[1],
                                                  [need[6 + i] for i in range(len(need) - 6)])
        slot_gk, slot_gv = (None, None) if slot_g is None else state._kv_views(slot_g, False)
        return (slot_gk, slot_gv, dw, None, None, None, *others)
