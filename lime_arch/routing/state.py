"""The buffer mixer's execution: pooled tensors, the per-pass buffer state, autograd functions.

``BufferState`` owns one forward pass's K/V buffer and, during backward, the gradient buffers;
``Write0`` and ``LayerFn`` are the custom autograd functions that write each layer's K/V, route
it and do the gradient bookkeeping (see ``kvbuffer``'s module docstring for the design).
"""
from __future__ import annotations

import torch
from torch.autograd import Function

from lime_arch.routers import Router
from lime_arch.routing.plan import Block, Layout, Plan

Tensor = torch.Tensor


class Buf:
    """A pooled tensor and a memo of its views (slicing from Python costs microseconds per op)."""

    __slots__ = ("t", "memo")

    def __init__(self, t: Tensor):
        self.t, self.memo = t, {}

    def rows(self, a: int, b: int) -> Tensor:
        v = self.memo.get((a, b))
        if v is None:
            v = self.memo[(a, b)] = self.t[:, a:b]
        return v


class Pool:
    """Reuse of the large buffer tensors across forward passes on CPU.

    A fresh multi-MB tensor per step costs page faults on every first touch (the CPU allocator
    is plain malloc; above its mmap threshold every allocation is a new mapping): on the dev VM
    ~6 us per 4 KiB page, ~50 ms per step at 128 layers. CUDA has its caching allocator, so the
    pool is CPU-only. A tensor is handed back only when no view of it can be alive any more."""

    def __init__(self, max_tensors: int = 8):
        self.free: dict[tuple, list[Buf]] = {}
        self.order: list[tuple] = []
        self.max_tensors = max_tensors

    def get(self, shape, like: Tensor) -> Buf:
        """An uninitialised tensor of ``shape`` (``like``'s dtype and device), reused where possible."""
        key = (tuple(shape), like.dtype, like.device)
        if like.device.type == "cpu" and self.free.get(key):
            self.order.remove(key)
            return self.free[key].pop()
        return Buf(like.new_empty(shape))

    def put(self, b: Buf | None) -> None:
        if b is None or b.t.device.type != "cpu":
            return
        key = (tuple(b.t.shape), b.t.dtype, b.t.device)
        self.free.setdefault(key, []).append(b)
        self.order.append(key)
        while len(self.order) > self.max_tensors:
            old = self.order.pop(0)
            self.free[old].pop(0)


POOL = Pool()


class BufferState:
    """The buffer of one forward pass, its plan, and the gradient buffers during backward.

    Views of the pooled tensors are memoised on them (``Buf.memo``): a view op from Python costs
    several microseconds, which at GQA sizes is as much as the products themselves."""

    def __init__(self, router: Router, lay: Layout, plan: Plan, k: Tensor, w_dtype: torch.dtype):
        B, T, R, Hd = k.shape
        self.L, self.R, self.B, self.T, self.Hd = router.n_layers, R, B, T, Hd
        self.lay, self.plan, self.rs, self.mo = lay, plan, lay.rs, lay.mo
        self.perdim = lay.kind == "perdim"
        self.D, self.N = (Hd, 2 * B * T) if self.perdim else ((R, 2 * B * T * Hd) if lay.kind == "diag"
                                                               else (1, 2 * B * T * Hd))
        self.bufb: Buf | None = POOL.get((self.D, self.L * self.rs, self.N), k)
        self.buf = self.bufb.t
        self.kvw = self.bufb.memo.setdefault(("kvw", lay.kind, R, B, T), [None] * self.L)  # write views per slot
        self.gradb: Buf | None = None  # K/V gradient of old slots (blocked routers' prefix part)
        self.grad_hi = 0  # rows [0, grad_hi) of gradb hold values; it is never zero-filled whole
        self.P: dict[int, Tensor] = {}  # block -> stacked old-slot part of its members (D, n_mem*Mo, N)
        self.Wp: dict[int, Tensor] = {}  # block -> W_pre
        self.G: dict[int, Buf] = {}  # block -> output gradients of its layers (D, n_layers*Mo, N)
        self.Win: dict[int, Buf] = {}  # block -> in-block weights, transposed per slot (D, nl*Mo, nl*rs)
        self.gw_in: dict[int, Tensor] = {}  # member layer -> dW of its in-block columns
        self.w_dtype = w_dtype

    def release(self) -> None:
        """Hand the buffers back to the pool: after the last backward (``Write0``) or when the
        state dies. No view of them escapes (routed K/V and slot gradients are fresh tensors)."""
        POOL.put(self.bufb)  # gradient-side tensors are not pooled: they would sit in memory
        self.bufb = self.gradb = self.buf = None  # between steps and raise the next step's peak
        self.G, self.Win = {}, {}

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the pool may be gone
            pass

    # -- views ---------------------------------------------------------------------------------
    def _kv(self, t: Tensor, out_order: bool) -> tuple[Tensor, Tensor]:
        """(D, rs|Mo, N) -> K, V views: (B, T, R, Hd) (buffer order) or (B, R, T, Hd) (routed order),
        as two ``as_strided`` views (one op each; view + permute + unbind would be three)."""
        B, T, R, Hd = self.B, self.T, self.R, self.Hd
        off = t.storage_offset()
        if self.perdim:  # t: (Hd, R, 2BT)
            sd, sr = t.stride(0), t.stride(1)
            size, stride = ((B, R, T, Hd), (T, sr, 1, sd)) if out_order else ((B, T, R, Hd), (T, 1, sr, sd))
            return t.as_strided(size, stride, off), t.as_strided(size, stride, off + B * T)
        sr = t.stride(0) if self.lay.kind == "diag" else t.stride(1)  # head stride
        size, stride = ((B, R, T, Hd), (T * Hd, sr, Hd, 1)) if out_order else ((B, T, R, Hd), (T * Hd, Hd, sr, 1))
        return t.as_strided(size, stride, off), t.as_strided(size, stride, off + B * T * Hd)

    def write(self, l: int, k: Tensor, v: Tensor) -> None:
        views = self.kvw[l]
        if views is None:
            views = self.kvw[l] = self._kv(self.bufb.rows(l * self.rs, (l + 1) * self.rs), False)
        views[0].copy_(k)
        views[1].copy_(v)

    def split(self, out: Tensor) -> tuple[Tensor, Tensor]:
        """Routed (D, Mo, N) -> K, V as (B, R, T, Hd) views with Hd contiguous."""
        if self.perdim:  # Hd is the product's batch dimension: one copy into attention's layout
            R, B, T, Hd = self.R, self.B, self.T, self.Hd
            kv = out.new_empty(2, B, R, T, Hd)
            kv.copy_(out.view(Hd, R, 2, B, T).permute(2, 3, 1, 4, 0))
            return kv.unbind(0)
        return self._kv(out, True)

    def _gather_u(self, blk: Block) -> Tensor:
        if blk.u_index is None:
            _, _, r0, r1 = blk.u_runs[0]
            return self.bufb.rows(r0, r1)
        return self.buf.index_select(1, blk.u_index.to(self.buf.device))

    # -- forward products ----------------------------------------------------------------------
    def prefix_forward(self, b: int, w_pre: list[Tensor]) -> None:
        """P_b = W_pre @ buf[U_b]: the old-slot part of every member of block b in one product."""
        blk, dt = self.plan.blocks[b], self.buf.dtype
        nu, mo, rs = len(blk.U), self.mo, self.rs
        if blk.dense_pre:  # every member reads all of U (full, first-j, dilated-d, ...)
            Wp = torch.cat(w_pre, dim=1) if len(w_pre) > 1 else w_pre[0]
            if Wp.dtype != dt:
                Wp = Wp.to(dt)
        else:
            Wp = w_pre[0].new_zeros(self.D, len(w_pre) * mo, nu * rs, dtype=dt)
            for i, (w, cols, n) in enumerate(zip(w_pre, blk.ucols, blk.n_pre)):
                dst = Wp[:, i * mo:(i + 1) * mo].view(self.D, mo, nu, rs)
                dst[:, :, cols] = w.to(dt).reshape(self.D, mo, n, rs)
        self.Wp[b] = Wp
        self.P[b] = torch.bmm(Wp, self._gather_u(blk))

    def route_forward(self, w_in: Tensor, l: int) -> Tensor:
        """Layer l's routed K/V (D, Mo, N): its block's old-slot part plus its in-block sources."""
        plan = self.plan
        if w_in.dtype != self.buf.dtype:
            w_in = w_in.to(self.buf.dtype)
        i = plan.member_idx[l]
        out, fresh = None, False
        if i is not None:
            b = plan.block_of[l]
            out = self.P[b][:, i * self.mo:(i + 1) * self.mo]
            if i == len(plan.blocks[b].members) - 1:
                del self.P[b]  # the last reader of this block's P
        if plan.in_one[l]:
            _, _, r0, r1 = plan.in_runs[l][0]
            x = self.bufb.rows(r0, r1)
            return torch.bmm(w_in, x) if out is None else torch.baddbmm(out, w_in, x)
        for c0, c1, r0, r1 in plan.in_runs[l]:
            a, x = w_in[:, :, c0:c1], self.bufb.rows(r0, r1)
            if fresh:
                out.baddbmm_(a, x)
            else:  # the first term makes a fresh tensor; P stays intact
                out = torch.bmm(a, x) if out is None else torch.baddbmm(out, a, x)
                fresh = True
        return out if fresh else out.clone()

    def place_win(self, l: int, w_in: Tensor) -> None:
        """Put layer l's in-block weights into its block's W_in (for the slot gradients)."""
        plan, mo = self.plan, self.mo
        b = plan.block_of[l]
        blk = plan.blocks[b]
        wb = self.Win.get(b)
        if wb is None:
            nl = blk.l1 - blk.l0
            wb = self.Win[b] = Buf(self.buf.new_zeros(self.D, nl * mo, nl * self.rs))
        i, base = l - blk.l0, blk.l0 * self.rs
        if plan.in_one[l]:
            _, _, r0, r1 = plan.in_runs[l][0]
            wb.t[:, i * mo:(i + 1) * mo, r0 - base:r1 - base] = w_in
        else:
            for c0, c1, r0, r1 in plan.in_runs[l]:
                wb.t[:, i * mo:(i + 1) * mo, r0 - base:r1 - base] = w_in[:, :, c0:c1]

    # -- backward ------------------------------------------------------------------------------
    def store_g(self, l: int, gk: Tensor | None, gv: Tensor | None) -> Tensor:
        """Copy layer l's output gradient into its rows of the block's G_b; return those rows."""
        plan, mo = self.plan, self.mo
        b = plan.block_of[l]
        blk = plan.blocks[b]
        gb = self.G.get(b)
        if gb is None:
            # backward runs the block's layers in descending order (the link chain), so the first
            # one here is the highest that ran: only the rows above it need zeros (a partial forward)
            gb = self.G[b] = Buf(self.buf.new_empty(self.D, (blk.l1 - blk.l0) * mo, self.N))
            gb.t[:, (l - blk.l0 + 1) * mo:].zero_()
        i = l - blk.l0
        rows = gb.t[:, i * mo:(i + 1) * mo]
        vk, vv = self._kv(rows, True)
        vk.zero_() if gk is None else vk.copy_(gk)
        vv.zero_() if gv is None else vv.copy_(gv)
        return rows

    def dw_in(self, l: int, g: Tensor) -> Tensor:
        """dW of layer l's in-block columns: g_l @ buf[in-block rows]^T, (D, Mo, n_in*rs)."""
        plan, bb = self.plan, self.bufb
        runs = plan.in_runs[l]
        if plan.in_one[l]:
            _, _, r0, r1 = runs[0]
            xt = bb.memo.get(("T", r0, r1))
            if xt is None:
                xt = bb.memo[("T", r0, r1)] = bb.rows(r0, r1).transpose(1, 2)
            return torch.bmm(g, xt)
        g3 = g.new_zeros(self.D, self.mo, runs[-1][1])
        for c0, c1, r0, r1 in runs:
            g3[:, :, c0:c1] = torch.bmm(g, bb.rows(r0, r1).transpose(1, 2))
        return g3

    def slot_grad(self, s: int) -> tuple[Tensor, Tensor] | None:
        """grad_s = grad[s] (old-slot part, from later blocks) + W_in(s)^T @ G_b[in-block readers]."""
        plan, rs, mo = self.plan, self.rs, self.mo
        b = plan.block_of[s]
        gb = self.G.get(b)
        out = self.gradb.t[:, s * rs:(s + 1) * rs] if (s + 1) * rs <= self.grad_hi else None
        fresh = False
        if gb is not None:
            wt, gt, l0 = self.Win[b].t, gb.t, plan.blocks[b].l0
            c = (s - l0) * rs
            for la, lb in plan.reader_runs[s]:
                a = wt[:, (la - l0) * mo:(lb - l0) * mo, c:c + rs].transpose(1, 2)
                g = gt[:, (la - l0) * mo:(lb - l0) * mo]
                if fresh:
                    out.baddbmm_(a, g)
                else:
                    out = torch.bmm(a, g) if out is None else torch.baddbmm(out, a, g)
                    fresh = True
        if out is None:
            return None
        if not fresh:  # a view of the gradient buffer, which is reused: copy
            out = out.clone()
        return self._kv(out, False)

    def prefix_backward(self, b: int, needs: list[bool]) -> list[Tensor | None]:
        """dW_pre = G_b @ buf[U_b]^T and grad[U_b] += W_pre^T G_b; the members' whole dW."""
        blk = self.plan.blocks[b]
        Wp = self.Wp.pop(b)
        gb = self.G.get(b)
        w_grads: list[Tensor | None] = [None] * len(blk.members)
        if gb is None:  # no layer of the block got a gradient
            return w_grads
        mo, rs, D = self.mo, self.rs, self.D
        if blk.mem_rows is not None:
            gP = gb.rows(*blk.mem_rows)
        else:
            idx = torch.tensor([(m - blk.l0) * mo + r for m in blk.members for r in range(mo)], device=gb.t.device)
            gP = gb.t.index_select(1, idx)
        xu = self._gather_u(blk)
        if any(needs):
            gWp = torch.bmm(gP, xu.transpose(1, 2))  # (D, n_mem*Mo, |U|*rs)
            nu = len(blk.U)
            for i, (m, cols, n) in enumerate(zip(blk.members, blk.ucols, blk.n_pre)):
                if not needs[i]:
                    continue
                pre = gWp[:, i * mo:(i + 1) * mo]
                if not blk.dense_pre:
                    pre = pre.reshape(D, mo, nu, rs)[:, :, cols].reshape(D, mo, n * rs)
                g_in = self.gw_in.pop(m, None)
                if g_in is None:  # the member's output got no gradient: its in-block part is zero
                    g_in = pre.new_zeros(D, mo, (len(self.plan.sources[m]) - n) * rs)
                w_grads[i] = self.lay.grad_w(torch.cat((pre, g_in), dim=2), self.w_dtype)
        if self.gradb is None:
            self.gradb = Buf(torch.empty_like(self.buf))
        grad = self.gradb
        if blk.u_index is None:
            _, _, r0, r1 = blk.u_runs[0]
            fresh = r0 >= self.grad_hi  # rows [r0, r1) hold nothing yet: write, do not add
            self._grad_zero_to(r0 if fresh else r1)
            if D == 1:
                dst = grad.rows(r0, r1)
                torch.bmm(Wp.transpose(1, 2), gP, out=dst) if fresh else dst.baddbmm_(Wp.transpose(1, 2), gP)
            else:  # a batch dimension (strided rows): product, then add
                upd = torch.bmm(Wp.transpose(1, 2), gP)
                grad.rows(r0, r1).copy_(upd) if fresh else grad.rows(r0, r1).add_(upd)
            self.grad_hi = max(self.grad_hi, r1)
        else:  # gathered rows
            self._grad_zero_to(blk.U[-1] * rs + rs)
            grad.t.index_add_(1, blk.u_index.to(grad.t.device), torch.bmm(Wp.transpose(1, 2), gP))
        return w_grads

    def _grad_zero_to(self, r: int) -> None:
        """Zero-fill gradb's rows [grad_hi, r): afterwards every row below r holds a value."""
        if r > self.grad_hi:
            self.gradb.t[:, self.grad_hi:r].zero_()
            self.grad_hi = r

    def end_block(self, b: int) -> None:
        """Every slot of block b has its gradient and its prefix is done: free G_b and W_in."""
        self.G.pop(b, None)
        self.Win.pop(b, None)


class Write0(Function):
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


class LayerFn(Function):
    """Layer l >= 1: write its K/V into slot l and route. ``w`` is the router's weight of the layer
    as it is (no autograd op in between). The first layer of a block with members also takes
    the other members' weights (``ws``), computes P_b in forward and, in backward (which runs
    after every later layer of the block), the block's old-slot part and the members' whole dW.

    Backward: store the output gradient into G_b, dW of the in-block columns (a member keeps it
    for the block's first layer), then slot l's gradient (every reader of slot l is done)."""

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, w: Tensor, link: Tensor, state: BufferState, l: int, *ws: Tensor):
        plan = state.plan
        ctx.state, ctx.l = state, l
        state.write(l, k, v)
        b = plan.block_of[l]
        blk = plan.blocks[b]
        lay = state.lay
        if l == blk.l0 and blk.members:
            w_of = dict(zip(plan.others[b], ws))
            w_of[l] = w
            state.prefix_forward(b, [lay.views(w_of[m], plan.n_pre[m])[0] for m in blk.members])
        w_in = lay.views(w, plan.n_pre[l])[1]
        state.place_win(l, w_in)
        return state.split(state.route_forward(w_in, l))

    @staticmethod
    def backward(ctx, gk: Tensor | None, gv: Tensor | None):
        state, l = ctx.state, ctx.l
        plan = state.plan
        g = state.store_g(l, gk, gv)  # (D, Mo, N)
        gw = None
        member = plan.member_idx[l] is not None
        if ctx.needs_input_grad[2]:
            g3 = state.dw_in(l, g)
            if member:  # the block's first layer adds the old-slot columns
                state.gw_in[l] = g3
            else:
                gw = state.lay.grad_w(g3, state.w_dtype)
        b = plan.block_of[l]
        blk = plan.blocks[b]
        others: list[Tensor | None] = []
        if l == blk.l0 and blk.members:
            oth = plan.others[b]
            needs = [ctx.needs_input_grad[2] if m == l else ctx.needs_input_grad[6 + oth.index(m)]
                     for m in blk.members]
            grads = dict(zip(blk.members, state.prefix_backward(b, needs)))
            if member:
                gw = grads.pop(l)
            others = [grads[m] for m in oth]
        gs = state.slot_grad(l) if (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]) else None
        if l == blk.l0:
            state.end_block(b)
        gk_, gv_ = (None, None) if gs is None else gs
        return (gk_, gv_, gw, None, None, None, *others)
