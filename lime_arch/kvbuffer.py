"""Executing the routing: the K/V buffer and its mixers.

Every mixer maps raw K/V of the current tokens (B, T, R, Hd) to routed K/V (B, R, T, Hd).
Routing is per position, so the same code serves training, prefill and one-token decoding.

Design of ``BufferMixer`` (learned routers; why it is fast and lean):

- The buffer. Every layer writes its raw, pre-RoPE K and V once into a preallocated tensor
  ``buf`` of shape (D, L*rs, N); K and V of a head sit side by side in one row, so one product
  mixes both. Three layouts, chosen from the router (``_Layout``):
    linear  (full, first-j, last-j, dilated-d): D = 1,  rs = R rows per slot, N = 2*B*T*Hd;
    perdim  (per-dim):                          D = Hd, rs = R,               N = 2*B*T;
    diag    (no-head-mix: one weight per slot, same head index): D = R (a batch per head),
            rs = 1, N = 2*B*T*Hd, so the product does R*|S| MACs per column, not the R*|S|*R of
            the dense block-diagonal matrix.
  Routing layer l is ``W_l (D, Mo, |S_l|*rs) @ buf[source rows]`` (Mo = R, or 1 for diag) on
  views of the buffer: no concatenation, memory O(L), not O(L^2). The buffer (and the gradient
  buffer) come from a small pool on CPU (``_Pool``), since a fresh multi-MB tensor per step costs
  page faults on first touch.
- Blocking over layers. A product with only Mo output rows streams the whole buffer prefix once
  per layer and runs far below matmul speed (on the dev CPU ~8 GFLOP/s at 8 rows vs 35-50 at
  64). Layers are grouped in blocks of ``m``; when layer l0 starts block b every slot below l0 is
  written, so ``_Prefix`` computes ``P_b = W_pre @ buf[U_b]`` once: the contribution of the old
  slots U_b (the union of the block's sources below l0) to every layer of the block (m*Mo rows).
  Each layer then adds only its in-block sources (``_Route``). ``_choose_block`` picks m from a
  traffic model of the router's source sets (about sqrt(L) for full; no blocking, m = L, for
  last-j), with m*Mo <= 64.
- Autograd. Writing into a tensor in place breaks autograd's saved-tensor checks, so custom
  autograd functions do the bookkeeping, ordered by scalar *tokens*: ``_Write_l`` copies K/V
  into slot l and returns a token that ``_Write_{l+1}`` consumes (a chain); ``_Prefix_b``
  consumes l0's token; ``_Route_l`` consumes layer l's and its block's token. Backward:
    * ``_Route_l`` stores its output gradient g_l in its rows of the block's grad-out buffer G_b
      and computes dW for its in-block columns (g_l @ buf[in-block rows]^T). It does not touch
      the gradient of the K/V buffer at all.
    * ``_Prefix_b`` runs after every ``_Route`` of its block (their block token) and does the
      old-slot part with two products of m*Mo rows: dW_pre = G_b @ buf[U_b]^T and
      grad[U_b] += W_pre^T G_b (the only read-modify-write of the K/V gradient buffer, once per
      block).
    * ``_Write_s`` runs only after everything that reads slot s (it all hangs off the token chain
      above s). It computes slot s's gradient once, with one product over the G_b rows of its
      in-block readers: grad_s = grad[s] + W_in(s)^T @ G_b[readers], and hands that fresh tensor
      out; at s == l0 the block's G_b is freed, at s == 0 the buffers go back to the pool.
  G_b starts at zero, so a layer whose output got no gradient contributes nothing (a partial
  forward stays exact).
- Memory over the baseline: one copy of the raw K/V, one block of routed K/V in flight, and
  during backward the K/V gradient buffer (blocked routers only) and one or two G_b; the paper's
  concatenation holds O(L^2).
- Per-dim: the product's output has Hd as its batch dimension, so routed K/V are copied once
  into (B, R, T, Hd) order with Hd contiguous (attention kernels need that; SDPA would otherwise
  fall back to its slow math path).
- Without autograd (``no_grad``): the same products, without autograd functions. For a few
  tokens (decoding) each layer instead keeps [K|V] in a list and runs one product over the
  concatenated sources: the fewest ops, since there is no bandwidth to save.
- The uniform average needs no buffer at all: a running sum divided by l+1.
- ``ConcatMixer`` is the paper's pseudocode (grow the buffer by concatenation at every layer,
  multiply with the dense router): the benchmark's peer and an independent reference.
Source lists of a router must be sorted (all registered routers' are); plans are cached on the
router per block size.
"""
from __future__ import annotations

import torch
from torch.autograd import Function

from .routers import Router

Tensor = torch.Tensor

MAX_BLOCK_ROWS = 128  # m * Mo: output rows of a block product; beyond this the speed-up saturates
SMALL_N = 4096  # below this many columns (D * N) no-grad routing takes the few-ops list path


def _runs(pairs: list[tuple[int, int]], rs: int) -> list[tuple[int, int, int, int]]:
    """(weight column index, slot) pairs -> contiguous runs (col0, col1, row0, row1) in units of rows."""
    runs, i = [], 0
    while i < len(pairs):
        j = i
        while j + 1 < len(pairs) and pairs[j + 1][1] == pairs[j][1] + 1 and pairs[j + 1][0] == pairs[j][0] + 1:
            j += 1
        runs.append((pairs[i][0] * rs, (pairs[j][0] + 1) * rs, pairs[i][1] * rs, (pairs[j][1] + 1) * rs))
        i = j + 1
    return runs


def _groups(xs: list) -> list[list]:
    """Split a sorted list of (layer, ...) tuples into runs of consecutive layers."""
    out: list[list] = []
    for x in xs:
        if out and x[0] == out[-1][-1][0] + 1:
            out[-1].append(x)
        else:
            out.append([x])
    return out


class _Buf:
    """A pooled tensor and a memo of its views (slicing from Python costs microseconds per op)."""

    __slots__ = ("t", "memo")

    def __init__(self, t: Tensor):
        self.t, self.memo = t, {}

    def rows(self, a: int, b: int) -> Tensor:
        v = self.memo.get((a, b))
        if v is None:
            v = self.memo[(a, b)] = self.t[:, a:b]
        return v


class _Pool:
    """Reuse of the large buffer tensors across forward passes on CPU.

    A fresh multi-MB tensor per step costs page faults on every first touch (the CPU allocator
    is plain malloc; above its mmap threshold every allocation is a new mapping): on the dev VM
    ~6 us per 4 KiB page, ~50 ms per step at 128 layers. CUDA has its caching allocator, so the
    pool is CPU-only. A tensor is handed back only when no view of it can be alive any more."""

    def __init__(self, max_tensors: int = 8):
        self.free: dict[tuple, list[_Buf]] = {}
        self.order: list[tuple] = []
        self.max_tensors = max_tensors

    def get(self, shape, like: Tensor, zero: bool = False) -> _Buf:
        key = (tuple(shape), like.dtype, like.device)
        if like.device.type == "cpu" and self.free.get(key):
            self.order.remove(key)
            b = self.free[key].pop()
            if zero:
                b.t.zero_()
            return b
        return _Buf(like.new_zeros(shape) if zero else like.new_empty(shape))

    def put(self, b: _Buf | None) -> None:
        if b is None or b.t.device.type != "cpu":
            return
        key = (tuple(b.t.shape), b.t.dtype, b.t.device)
        self.free.setdefault(key, []).append(b)
        self.order.append(key)
        while len(self.order) > self.max_tensors:
            old = self.order.pop(0)
            self.free[old].pop(0)


_POOL = _Pool()


def _traffic(sources: list[list[int]], m: int) -> float:
    """Modelled memory traffic (in slots) of blocking with size m; see ``_choose_block``."""
    L, cost = len(sources), 0.0
    for l0 in range(0, L, m):
        U, nmem = set(), 0
        for l in range(max(l0, 1), min(l0 + m, L)):
            pre = [s for s in sources[l] if s < l0]
            if pre:
                U.update(pre)
                nmem += 1
            # in-block: read in forward, dW, slot gradient; slots just written, cache-hot: cheaper
            cost += 1.5 * (len(sources[l]) - len(pre))
        if nmem:
            cost += 4 * (len(U) + nmem) + 2  # P: read U, write P; backward: dW_pre and grad[U] += ...
    return cost


def _choose_block(sources: list[list[int]], mo: int) -> int:
    L = len(sources)
    cap = max(1, MAX_BLOCK_ROWS // mo)
    cands = sorted({m for m in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if m <= min(cap, L)} | {L})
    return min(cands, key=lambda m: (_traffic(sources, m), -m))


class _Block:
    def __init__(self, l0: int, l1: int):
        self.l0, self.l1 = l0, l1  # layers l0..l1-1
        self.members: list[int] = []  # layers of the block with sources below l0
        self.n_pre: list[int] = []  # per member: number of its sources below l0
        self.ucols: list[list[int]] = []  # per member: positions of those sources in U
        self.U: list[int] = []  # sorted union of the members' sources below l0
        self.u_runs: list[tuple[int, int, int, int]] = []  # U as buffer row runs
        self.u_index: Tensor | None = None  # row index of U in the buffer (when U is not one run)
        self.mem_rows: tuple[int, int] | None = None  # members as a row range of G_b (if contiguous)
        self.dense_pre = False  # every member reads all of U, in U's order


class _Plan:
    """Which products each layer runs, for one router and block size (sources never change)."""

    def __init__(self, router: Router, block: int, rs: int, mo: int):
        L = router.n_layers
        self.block, self.rs, self.mo = block, rs, mo
        self.sources = [router.sources(l) for l in range(L)]
        for l, src in enumerate(self.sources):
            if src != sorted(set(src)):
                raise ValueError(f"router {router.spec}: sources({l}) must be sorted and unique, got {src}")
        self.blocks = [_Block(l0, min(l0 + block, L)) for l0 in range(0, L, block)]
        self.block_of = [l // block for l in range(L)]
        self.member_idx: list[int | None] = [None] * L  # position of the layer among its block's members
        self.n_pre = [0] * L  # sources below the block start: the first n_pre weight column groups
        self.in_runs: list[list] = []  # per layer: runs (col0, col1, row0, row1) over its in-block
        #   sources; columns relative to the in-block weight slice, rows absolute buffer rows
        self.in_one: list[bool] = []  # the in-block sources are one run covering the whole slice
        readers: list[list[tuple[int, int]]] = [[] for _ in range(L)]
        for l, src in enumerate(self.sources):
            blk = self.blocks[self.block_of[l]]
            pre = [s for s in src if s < blk.l0]
            self.n_pre[l] = len(pre)
            runs = _runs([(i - len(pre), s) for i, s in enumerate(src) if s >= blk.l0], rs)
            self.in_runs.append(runs)
            self.in_one.append(len(runs) == 1 and runs[0][0] == 0 and runs[0][1] == (len(src) - len(pre)) * rs)
            if l > 0:
                for s in src:
                    if s >= blk.l0:
                        readers[s].append((l,))
            if pre and l > 0:
                self.member_idx[l] = len(blk.members)
                blk.members.append(l)
                blk.n_pre.append(len(pre))
        # per block: the members other than its first layer (extra inputs of that layer's function)
        self.others = [[m for m in blk.members if m != blk.l0] for blk in self.blocks]
        # in-block readers of each slot as runs of consecutive layers [la, lb)
        self.reader_runs = [[(g[0][0], g[-1][0] + 1) for g in _groups(r)] for r in readers]
        for blk in self.blocks:
            blk.U = sorted({s for l in blk.members for s in self.sources[l] if s < blk.l0})
            pos = {s: i for i, s in enumerate(blk.U)}
            blk.ucols = [[pos[s] for s in self.sources[l][:n]] for l, n in zip(blk.members, blk.n_pre)]
            blk.dense_pre = all(c == list(range(len(blk.U))) for c in blk.ucols)
            blk.u_runs = _runs(list(enumerate(blk.U)), rs)
            if len(blk.u_runs) > 1:
                blk.u_index = torch.tensor([s * rs + r for s in blk.U for r in range(rs)])
            if blk.members and blk.members == list(range(blk.members[0], blk.members[-1] + 1)):
                blk.mem_rows = ((blk.members[0] - blk.l0) * mo, (blk.members[-1] + 1 - blk.l0) * mo)


def _plan(router: Router, lay: "_Layout", block: int | None) -> _Plan:
    cache = router.__dict__.setdefault("_lime_plans", {})
    if block is None:
        if ("auto", lay.mo) not in cache:
            cache[("auto", lay.mo)] = _choose_block([router.sources(l) for l in range(router.n_layers)], lay.mo)
        block = cache[("auto", lay.mo)]
    key = (block, lay.rs, lay.mo)
    if key not in cache:
        cache[key] = _Plan(router, block, lay.rs, lay.mo)
    return cache[key]


class _Layout:
    """How K/V of one layer sit in the buffer and how the router's weights become (D, Mo, cols)."""

    def __init__(self, router: Router):
        R, L = router.R, router.n_layers
        self.kind = router.kind
        if router.kind == "linear" and R > 1 and L > 1 and router.weight_shape(1)[1] == len(router.sources(1)):
            self.kind = "diag"  # one weight per source slot (same head index), routers.py's convention
        self.R, self.Hd = R, router.head_dim
        self.rs = 1 if self.kind == "diag" else R
        self.mo = 1 if self.kind == "diag" else R

    def w3(self, w: Tensor) -> Tensor:
        """The router's weight of a layer as (D, Mo, |S|*rs) (views, used inside autograd functions)."""
        if self.kind == "linear":
            return w.unsqueeze(0)  # (1, R, |S|R)
        if self.kind == "perdim":  # (Hd, R, |S|R), made contiguous: bmm needs a unit stride per matrix
            return w.permute(2, 0, 1).contiguous()
        R = self.R  # diag: the block-diagonal (R, |S|R) -> its diagonals, (R, 1, |S|)
        return w.view(R, -1, R).diagonal(0, 0, 2).t().unsqueeze(1)

    def grad_w(self, g3: Tensor, dtype: torch.dtype) -> Tensor:
        """A (D, Mo, |S|*rs) gradient back in the router weight's shape."""
        if self.kind == "linear":
            return g3.squeeze(0).to(dtype)
        if self.kind == "perdim":
            return g3.permute(1, 2, 0).to(dtype)
        R, n = self.R, g3.shape[-1]  # diag: onto the diagonal of each (R, R) block
        g = g3.new_zeros(R, n, R, dtype=dtype)
        g.diagonal(0, 0, 2).copy_(g3[:, 0, :].t())
        return g.view(R, n * R)


class _BufferState:
    """The buffer of one forward pass, its plan, and the gradient buffers during backward.

    Views of the pooled tensors are memoised on them (``_Buf.memo``): a view op from Python costs
    several microseconds, which at GQA sizes is as much as the products themselves."""

    def __init__(self, router: Router, lay: _Layout, plan: _Plan, k: Tensor, w_dtype: torch.dtype):
        B, T, R, Hd = k.shape
        self.L, self.R, self.B, self.T, self.Hd = router.n_layers, R, B, T, Hd
        self.lay, self.plan, self.rs, self.mo = lay, plan, lay.rs, lay.mo
        self.perdim = lay.kind == "perdim"
        self.D, self.N = (Hd, 2 * B * T) if self.perdim else ((R, 2 * B * T * Hd) if lay.kind == "diag"
                                                               else (1, 2 * B * T * Hd))
        self.bufb: _Buf | None = _POOL.get((self.D, self.L * self.rs, self.N), k)
        self.buf = self.bufb.t
        self.kvw = self.bufb.memo.setdefault(("kvw", lay.kind, R, B, T), [None] * self.L)  # write views per slot
        self.gradb: _Buf | None = None  # K/V gradient of old slots (blocked routers' prefix part)
        self.P: dict[int, Tensor] = {}  # block -> stacked old-slot part of its members (D, n_mem*Mo, N)
        self.Wp: dict[int, Tensor] = {}  # block -> W_pre
        self.G: dict[int, _Buf] = {}  # block -> output gradients of its layers (D, n_layers*Mo, N)
        self.Win: dict[int, _Buf] = {}  # block -> in-block weights, transposed per slot (D, nl*Mo, nl*rs)
        self.gw_in: dict[int, Tensor] = {}  # member layer -> dW of its in-block columns
        self.w_dtype = w_dtype

    def release(self) -> None:
        """Hand the buffers back to the pool: after the last backward (``_Write0``) or when the
        state dies. No view of them escapes (routed K/V and slot gradients are fresh tensors)."""
        _POOL.put(self.bufb)  # gradient-side tensors are not pooled: they would sit in memory
        self.bufb = self.gradb = self.buf = None  # between steps and raise the next step's peak
        self.G, self.Win = {}, {}

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the pool may be gone
            pass

    # -- views ---------------------------------------------------------------------------------
    def _kv(self, t: Tensor, out_order: bool) -> tuple[Tensor, Tensor]:
        """(D, rs|Mo, N) -> K, V views: (B, T, R, Hd) (buffer order) or (B, R, T, Hd) (routed order)."""
        R, B, T, Hd = self.R, self.B, self.T, self.Hd
        if self.perdim:
            kv = t.view(Hd, R, 2, B, T).permute(2, 3, 1, 4, 0) if out_order else \
                t.view(Hd, R, 2, B, T).permute(2, 3, 4, 1, 0)
        else:
            kv = t.view(R, 2, B, T, Hd).permute(1, 2, 0, 3, 4) if out_order else \
                t.view(R, 2, B, T, Hd).permute(1, 2, 3, 0, 4)
        return kv.unbind(0)

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

    def _gather_u(self, blk: _Block) -> Tensor:
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
        wb = self.Win.get(b)
        if wb is None:
            blk = plan.blocks[b]
            nl = blk.l1 - blk.l0
            wb = self.Win[b] = _Buf(self.buf.new_zeros(self.D, nl * mo, nl * self.rs))
        l0 = plan.blocks[b].l0
        key = ("w", mo, l - l0, l0 * self.rs, *plan.in_runs[l])  # the geometry: pooled tensors are shared
        dsts = wb.memo.get(key)
        if dsts is None:
            i, base = l - l0, l0 * self.rs
            dsts = wb.memo[key] = [(wb.t[:, i * mo:(i + 1) * mo, r0 - base:r1 - base], c0, c1)
                                   for c0, c1, r0, r1 in plan.in_runs[l]]
        if plan.in_one[l]:
            dsts[0][0].copy_(w_in)
        else:
            for dst, c0, c1 in dsts:
                dst.copy_(w_in[:, :, c0:c1])

    # -- backward ------------------------------------------------------------------------------
    def store_g(self, l: int, gk: Tensor | None, gv: Tensor | None) -> Tensor:
        """Copy layer l's output gradient into its rows of the block's G_b; return those rows."""
        plan, mo = self.plan, self.mo
        b = plan.block_of[l]
        blk = plan.blocks[b]
        gb = self.G.get(b)
        if gb is None:
            gb = self.G[b] = _Buf(self.buf.new_zeros(self.D, (blk.l1 - blk.l0) * mo, self.N))
        i = l - blk.l0
        key = ("g", self.lay.kind, self.R, i, self.B, self.T)
        m = gb.memo.get(key)
        if m is None:
            rows = gb.rows(i * mo, (i + 1) * mo)
            m = gb.memo[key] = (rows, self._kv(rows, True))
        if gk is not None:
            m[1][0].copy_(gk)
        if gv is not None:
            m[1][1].copy_(gv)
        return m[0]

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
        out = self.gradb.rows(s * rs, (s + 1) * rs) if self.gradb is not None else None
        fresh = False
        if gb is not None:
            wb, l0 = self.Win[b], plan.blocks[b].l0
            for la, lb in plan.reader_runs[s]:
                key = ("a", mo, rs, la - l0, lb - l0, s - l0)
                a = wb.memo.get(key)
                if a is None:
                    c = (s - l0) * rs
                    a = wb.memo[key] = wb.t[:, (la - l0) * mo:(lb - l0) * mo, c:c + rs].transpose(1, 2)
                g = gb.rows((la - l0) * mo, (lb - l0) * mo)
                if fresh:
                    out.baddbmm_(a, g)
                else:
                    out = torch.bmm(a, g) if out is None else torch.baddbmm(out, a, g)
                    fresh = True
        if out is None:
            return None
        if not fresh:  # a view of the pooled gradient buffer: copy
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
            self.gradb = _Buf(torch.zeros_like(self.buf))
        grad = self.gradb
        if blk.u_index is None and D == 1:
            _, _, r0, r1 = blk.u_runs[0]
            grad.rows(r0, r1).baddbmm_(Wp.transpose(1, 2), gP)
        else:  # gathered rows, or a batch dimension (strided rows): product, then add
            upd = torch.bmm(Wp.transpose(1, 2), gP)
            if blk.u_index is None:
                _, _, r0, r1 = blk.u_runs[0]
                grad.rows(r0, r1).add_(upd)
            else:
                grad.t.index_add_(1, blk.u_index.to(grad.t.device), upd)
        return w_grads

    def end_block(self, b: int) -> None:
        """Every slot of block b has its gradient and its prefix is done: free G_b and W_in."""
        self.G.pop(b, None)
        self.Win.pop(b, None)


class _Write0(Function):
    """Layer 0: write its K/V (it reads them unrouted); hand out slot 0's gradient, free all."""

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, state: _BufferState):
        state.write(0, k, v)
        ctx.state = state
        return k.new_zeros(())

    @staticmethod
    def backward(ctx, g_token: Tensor):
        state = ctx.state
        g = state.slot_grad(0)
        state.release()
        return (None, None, None) if g is None else (g[0], g[1], None)


class _Layer(Function):
    """Layer l >= 1: write its K/V into slot l and route. ``w`` is the router's weight of the layer
    as it is (no autograd op in between). The first layer of a block with members also takes
    the other members' weights (``ws``), computes P_b in forward and, in backward (which runs
    after every later layer of the block), the block's old-slot part and the members' whole dW.

    Backward: store the output gradient into G_b, dW of the in-block columns (a member keeps it
    for the block's first layer), then slot l's gradient (every reader of slot l is done)."""

    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, w: Tensor, link: Tensor, state: _BufferState, l: int, *ws: Tensor):
        plan = state.plan
        ctx.state, ctx.l = state, l
        state.write(l, k, v)
        b = plan.block_of[l]
        blk = plan.blocks[b]
        if l == blk.l0 and blk.members:
            w_of = dict(zip(plan.others[b], ws))
            w_of[l] = w
            rs = state.rs
            state.prefix_forward(b, [state.lay.w3(w_of[m])[:, :, :plan.n_pre[m] * rs] for m in blk.members])
        n_pre = plan.n_pre[l]
        w3 = state.lay.w3(w)
        w_in = w3[:, :, n_pre * state.rs:] if n_pre else w3
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


class IdentityMixer:
    def __init__(self, router: Router):
        self.router = router

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k.transpose(1, 2), v.transpose(1, 2)


class MeanMixer:
    """Uniform average of layers 0..l as a running sum: O(1) work per layer."""

    def __init__(self, router: Router):
        self.router = router
        self.sk = self.sv = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.sk = k if l == 0 else self.sk + k
        self.sv = v if l == 0 else self.sv + v
        return (self.sk / (l + 1)).transpose(1, 2), (self.sv / (l + 1)).transpose(1, 2)


class BufferMixer:
    """Learned routers (linear, same-head and per-dim) over the preallocated, blocked buffer."""

    def __init__(self, router: Router, block: int | None = None):
        self.router = router
        self.lay = _Layout(router)
        self.plan = _plan(router, self.lay, block)
        self.state: _BufferState | None = None
        self.link: Tensor | None = None  # what the next layer's autograd function consumes
        self.mode = "grad"
        self.kvs: list[Tensor] = []

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        router, plan = self.router, self.plan
        if l == 0:  # one decision per forward pass
            ps = list(router.parameters())
            self.mode = "grad" if torch.is_grad_enabled() and (
                k.requires_grad or v.requires_grad or any(p.requires_grad for p in ps)) else "nograd"
            B, T, R, Hd = k.shape
            if self.mode == "nograd" and 2 * B * T * Hd * (Hd if self.lay.kind == "perdim" else 1) < SMALL_N:
                self.mode, self.kvs = "small", []
            else:
                self.state = _BufferState(router, self.lay, plan, k, ps[0].dtype if ps else k.dtype)
        if self.mode == "small":
            return self._route_small(l, k, v)
        st = self.state
        if self.mode == "grad":
            if l == 0:
                self.link = _Write0.apply(k, v, st)
                return k.transpose(1, 2), v.transpose(1, 2)
            b = plan.block_of[l]
            ws = [router.weight(m) for m in plan.others[b]] if l == plan.blocks[b].l0 else ()
            kr, vr = _Layer.apply(k, v, router.weight(l), self.link, st, l, *ws)
            self.link = kr  # the next layer's function consumes it: the backward chain
            return kr, vr
        st.write(l, k, v)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        b, lay, rs = plan.block_of[l], self.lay, self.lay.rs
        blk = plan.blocks[b]
        if l == blk.l0 and blk.members:
            st.prefix_forward(b, [lay.w3(router.weight(m))[:, :, :plan.n_pre[m] * rs] for m in blk.members])
        n_pre = plan.n_pre[l]
        w3 = lay.w3(router.weight(l))
        return st.split(st.route_forward(w3[:, :, n_pre * rs:] if n_pre else w3, l))

    def _route_small(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """No autograd, a few tokens (decoding): keep each layer's [K|V] in a list and run one
        product over the concatenated sources; the fewest ops, since there is no bandwidth to save."""
        Hd = k.shape[-1]
        self.kvs.append(torch.cat((k, v), dim=-1))  # (B, T, R, 2Hd)
        w = self.router.weight(l)
        if w is None:
            return k.transpose(1, 2), v.transpose(1, 2)
        src = self.plan.sources[l]
        x = self.kvs[src[0]] if len(src) == 1 else torch.cat([self.kvs[s] for s in src], dim=2)
        w = w.to(x.dtype)
        if w.dim() == 3:  # per-dim: (R, |S|R, Hd), the same weights for K and V
            out = torch.einsum("hcd,btcd->bthd", torch.cat((w, w), dim=-1), x)
        else:  # (R, |S|R); same-head routers are block-diagonal here, negligible at this size
            out = torch.matmul(w, x)  # (B, T, R, 2Hd)
        return out[..., :Hd].transpose(1, 2), out[..., Hd:].transpose(1, 2)


class ConcatMixer:
    """The paper's pseudocode: concatenate the whole buffer at every layer, then multiply."""

    def __init__(self, router: Router):
        self.router = router
        self.kb = self.vb = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.kb = k if l == 0 else torch.cat([self.kb, k], dim=2)  # (B, T, (l+1)R, Hd)
        self.vb = v if l == 0 else torch.cat([self.vb, v], dim=2)
        if l == 0 or self.router.kind == "identity":
            return k.transpose(1, 2), v.transpose(1, 2)
        d = self.router.dense(l).to(device=k.device, dtype=k.dtype)
        eq = "hc,btcd->bhtd" if d.dim() == 2 else "hcd,btcd->bhtd"
        return torch.einsum(eq, d, self.kb), torch.einsum(eq, d, self.vb)


_MIXERS = {"identity": IdentityMixer, "mean": MeanMixer}


def make_mixer(router: Router, routing_impl: str = "buffer", *, block: int | None = None):
    """A fresh mixer for one forward pass. ``block`` overrides the layer-block size of the buffer
    mixer (tests; None lets ``_choose_block`` pick it)."""
    if routing_impl == "concat":
        return ConcatMixer(router)
    if router.kind in ("linear", "perdim"):
        return BufferMixer(router, block)
    return _MIXERS[router.kind](router)
