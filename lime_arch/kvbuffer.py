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
  views of the buffer: no concatenation, memory O(L), not O(L^2). On CPU the buffer comes from
  a small pool (``_Pool``): a fresh multi-MB tensor per step costs page faults on first touch.
  Gradient-side tensors are not pooled (they would sit in memory between steps and raise the
  next step's peak).
- Blocking over layers. A product with only Mo output rows streams the buffer prefix once per
  layer and runs far below matmul speed (on the dev CPU ~8 GFLOP/s at 8 rows vs 35-50 at 64+).
  Layers are grouped in blocks of ``m``. When layer l0 starts block b every slot below l0 is
  written, so that layer also computes ``P_b = W_pre @ buf[U_b]`` once: the contribution of the
  old slots U_b (the union of the block's sources below l0) to every member of the block (the
  layers with such sources), m*Mo rows in one product. Each layer then adds only its in-block
  sources. ``_choose_block`` picks m from a traffic model of the router's source sets (16 for
  full at 64-128 layers, 8 at 16; no blocking, m = L, for last-j), with m*Mo <= 128.
- Autograd: one custom function per layer. Writing into a tensor in place breaks autograd's
  saved-tensor checks, so ``_Layer`` (layers >= 1) and ``_Write0`` (layer 0, which reads its
  K/V unrouted) do the bookkeeping themselves. Layer l's function consumes layer l-1's routed K
  (the *link*), so in backward layer l runs only after every later layer. A router weight enters
  exactly one function as it is (no autograd op in between); the first layer of a block also
  takes the other members' weights. Backward of layer l:
    * store g_l (its output gradient) into its rows of the block's grad-out buffer G_b, and
      dW of its in-block columns, g_l @ buf[in-block rows]^T;
    * at a block's first layer (every later layer of the block is done): the old-slot part with
      two products of m*Mo rows, dW_pre = G_b @ buf[U_b]^T and grad[U_b] += W_pre^T G_b (the only
      read-modify-write of the K/V gradient buffer, once per block), and the members' whole dW;
    * slot l's gradient, computed once: every reader of slot l is done, so
      grad_l = grad[l] + W_in(l)^T @ G_b[readers of l], one product over the stacked in-block
      weights ``W_in`` of the block (filled in forward), handed out as a fresh tensor.
  G_b starts at zero, so a layer whose output got no gradient contributes nothing (a partial
  forward stays exact). G_b and W_in are dropped at the block's first layer; at layer 0 the
  buffer goes back to the pool.
- Memory over the baseline: one copy of the raw K/V, one block of routed K/V in flight, and
  during backward the K/V gradient buffer (blocked routers only) and G_b of one block; the
  paper's concatenation holds O(L^2).
- Python overhead matters at these sizes (a view op from Python costs microseconds, more with
  cold caches inside a real step): per-layer K/V views of the pooled buffer are memoised on it,
  router weights' (D, Mo, cols) views are memoised per parameter (``_Layout.views``), and K/V
  views are made with ``as_strided``.
- Per-dim: the product's output has Hd as its batch dimension, so routed K/V are copied once
  into (B, R, T, Hd) order with Hd contiguous (attention kernels need that; SDPA would otherwise
  fall back to its slow math path), and its weights are made contiguous per layer (bmm needs a
  unit stride per matrix).
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
        # every source as buffer row runs (the no-grad few-token path of linear routers)
        self.all_runs = [_runs(list(enumerate(src)), rs) for src in self.sources]
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
        self.kind = "diag" if router.kind == "linear" and router.same_head else router.kind
        self.R, self.Hd = R, router.head_dim
        self.rs = 1 if self.kind == "diag" else R
        self.mo = 1 if self.kind == "diag" else R
        self.cache: dict[tuple, tuple] = {}  # (id(param), n_pre) -> (param, w3, old-slot cols, in-block cols)
        # read the parameters straight from the list: the base class's weight(l) is the parameter
        # itself, and a same-head router's parameter (R, |S|) is the diagonal the product needs
        self.direct = router.learned and (type(router).weight is Router.weight or self.kind == "diag")

    def w3(self, w: Tensor) -> Tensor:
        """The router's weight of a layer as (D, Mo, |S|*rs) (views, used inside autograd functions)."""
        if self.kind == "linear":
            return w.unsqueeze(0)  # (1, R, |S|R)
        if self.kind == "perdim":  # (Hd, R, |S|R), made contiguous: bmm needs a unit stride per matrix
            return w.permute(2, 0, 1).contiguous()
        return w.unsqueeze(1)  # diag: the same-head parameter (R, |S|) -> (R, 1, |S|)

    def views(self, w: Tensor, n_pre: int) -> tuple[Tensor, Tensor]:
        """(old-slot columns, in-block columns) of ``w3(w)``; memoised for a parameter used as it
        is (valid while its storage is: ``.data`` replaced, e.g. by ``.double()``, recomputes)."""
        key = (id(w), n_pre)
        memo = self.kind != "perdim" and isinstance(w, torch.nn.Parameter)
        c = self.cache.get(key) if memo else None
        if c is not None and c[0] is w and c[1].data_ptr() == w.data_ptr() and c[1].dtype == w.dtype:
            return c[2], c[3]
        with torch.no_grad():
            w3 = self.w3(w)
            cut = n_pre * self.rs
            out = (w3[:, :, :cut], w3[:, :, cut:] if n_pre else w3)
        if memo:
            self.cache[key] = (w, w3, *out)
        return out

    def col_slices(self, w: Tensor, runs: list) -> list[Tensor]:
        """``w[:, c0:c1]`` per run, memoised for a parameter like ``views`` (decode's few-token path)."""
        key = (id(w), "cols")
        c = self.cache.get(key)
        if c is not None and c[0] is w and c[1] == w.data_ptr() and c[2] == w.dtype:
            return c[3]
        out = [w[:, c0:c1] for c0, c1, _ in runs]
        if isinstance(w, torch.nn.Parameter):
            self.cache[key] = (w, w.data_ptr(), w.dtype, out)
        return out

    def grad_w(self, g3: Tensor, dtype: torch.dtype) -> Tensor:
        """A (D, Mo, |S|*rs) gradient back in the router weight's shape."""
        if self.kind == "linear":
            return g3.squeeze(0).to(dtype)
        if self.kind == "perdim":
            return g3.permute(1, 2, 0).to(dtype)
        return g3.squeeze(1).to(dtype)  # diag: (R, 1, |S|) -> the parameter's (R, |S|)


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
        self.grad_hi = 0  # rows [0, grad_hi) of gradb hold values; it is never zero-filled whole
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
        blk = plan.blocks[b]
        wb = self.Win.get(b)
        if wb is None:
            nl = blk.l1 - blk.l0
            wb = self.Win[b] = _Buf(self.buf.new_zeros(self.D, nl * mo, nl * self.rs))
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
            gb = self.G[b] = _Buf(self.buf.new_empty(self.D, (blk.l1 - blk.l0) * mo, self.N))
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
            self.gradb = _Buf(torch.empty_like(self.buf))
        grad = self.gradb
        if blk.u_index is None:
            _, _, r0, r1 = blk.u_runs[0]
            fresh = self._grad_upto(r0, r1)  # rows [r0, r1) hold nothing yet: write, do not add
            if D == 1:
                dst = grad.rows(r0, r1)
                torch.bmm(Wp.transpose(1, 2), gP, out=dst) if fresh else dst.baddbmm_(Wp.transpose(1, 2), gP)
            else:  # a batch dimension (strided rows): product, then add
                upd = torch.bmm(Wp.transpose(1, 2), gP)
                grad.rows(r0, r1).copy_(upd) if fresh else grad.rows(r0, r1).add_(upd)
        else:  # gathered rows
            self._grad_upto(blk.U[-1] * rs + rs, None)
            grad.t.index_add_(1, blk.u_index.to(grad.t.device), torch.bmm(Wp.transpose(1, 2), gP))
        return w_grads

    def _grad_upto(self, r0: int, r1: int | None) -> bool:
        """Extend the valued rows of gradb to cover [r0, r1) (r1 None: [0, r0), zero-filled).
        True when [r0, r1) held nothing, so the caller writes instead of adding."""
        hi, t = self.grad_hi, self.gradb.t
        if r1 is None:
            if r0 > hi:
                t[:, hi:r0].zero_()
                self.grad_hi = r0
            return False
        if r0 >= hi:
            if r0 > hi:
                t[:, hi:r0].zero_()
            self.grad_hi = r1
            return True
        if r1 > hi:
            t[:, hi:r1].zero_()
            self.grad_hi = r1
        return False

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
        self.lay = router.__dict__.get("_lime_layout")
        if self.lay is None:
            self.lay = router.__dict__["_lime_layout"] = _Layout(router)
        self.wlist: list[Tensor] | None = None
        self.plan = _plan(router, self.lay, block)
        self.state: _BufferState | None = None
        self.link: Tensor | None = None  # what the next layer's autograd function consumes
        self.mode = "grad"
        self.kvs: list[Tensor] = []
        self.sbuf: _Buf | None = None
        self.small: list | None = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        router, plan = self.router, self.plan
        if l == 0:  # one decision per forward pass
            self.wlist = list(router.weights) if self.lay.direct else None
            ps = self.wlist if self.wlist is not None else list(router.parameters())
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
            ws = [self._weight(m) for m in plan.others[b]] if l == plan.blocks[b].l0 else ()
            kr, vr = _Layer.apply(k, v, self._weight(l), self.link, st, l, *ws)
            self.link = kr  # the next layer's function consumes it: the backward chain
            return kr, vr
        st.write(l, k, v)
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        b, lay = plan.block_of[l], self.lay
        blk = plan.blocks[b]
        if l == blk.l0 and blk.members:
            st.prefix_forward(b, [lay.views(self._weight(m), plan.n_pre[m])[0] for m in blk.members])
        return st.split(st.route_forward(lay.views(self._weight(l), plan.n_pre[l])[1], l))

    def _weight(self, l: int) -> Tensor:
        return self.wlist[l - 1] if self.wlist is not None else self.router.weight(l)

    def _small_views(self, B: int, T: int, R: int, Hd: int) -> list:
        """Per layer of the slot tensor: K and V write views in (B, T, R, Hd) order, and the
        source row runs as (col0, col1, rows)."""
        t, out = self.sbuf.t, []
        for l in range(self.router.n_layers):
            slot = t[l * R:(l + 1) * R].view(R, B, T, 2 * Hd)
            out.append((slot[..., :Hd].permute(1, 2, 0, 3), slot[..., Hd:].permute(1, 2, 0, 3),
                        [(c0, c1, t[r0:r1]) for c0, c1, r0, r1 in self.plan.all_runs[l]]))
        return out

    def _route_small(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """No autograd, a few tokens (decoding). Linear routers: each layer's [K|V] goes once into
        its rows of a (L*R, B*T*2Hd) slot tensor and the product runs over row ranges of it (full
        and last-j: one slice, first-j: two), so nothing is concatenated per layer (re-copying
        every earlier slot at every layer cost full routing ~10% of decode speed at batch 8).
        Same-head and per-dim routers keep [K|V] in a list and concatenate their sources."""
        B, T, R, Hd = k.shape
        if self.lay.kind == "linear":
            L = self.router.n_layers
            if l == 0:  # pooled on CPU, with its views memoised: a decode step is ~10 small ops per layer
                self.sbuf = _POOL.get((L * R, B * T * 2 * Hd), k)
                self.small = self.sbuf.memo.get(("small", self.plan, B, T, R, Hd))
                if self.small is None:
                    self.small = self.sbuf.memo[("small", self.plan, B, T, R, Hd)] = self._small_views(B, T, R, Hd)
            kw, vw, runs = self.small[l]
            kw.copy_(k)
            vw.copy_(v)
            if l == L - 1:  # every read of this pass is below; the outputs are fresh tensors
                _POOL.put(self.sbuf)
            if l == 0:
                return k.transpose(1, 2), v.transpose(1, 2)
            w = self._weight(l)
            if w.dtype != k.dtype:
                w = w.to(k.dtype)
            if len(runs) == 1:
                out = torch.mm(w, runs[0][2])
            else:
                ws = self.lay.col_slices(w, runs)
                out = torch.mm(ws[0], runs[0][2])
                for a, (_, _, x) in zip(ws[1:], runs[1:]):
                    out.addmm_(a, x)
            size, stride = (B, R, T, Hd), (T * 2 * Hd, B * T * 2 * Hd, 2 * Hd, 1)
            return out.as_strided(size, stride), out.as_strided(size, stride, Hd)
        self.kvs.append(torch.cat((k, v), dim=-1).permute(2, 0, 1, 3))  # (R, B, T, 2Hd) view
        if l == 0:
            return k.transpose(1, 2), v.transpose(1, 2)
        w = self._weight(l)
        src = self.plan.sources[l]
        x = torch.cat([self.kvs[s] for s in src], dim=0)  # (|S|R, B, T, 2Hd), contiguous
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        kind = self.lay.kind
        if kind == "perdim":  # (R, |S|R, Hd), the same weights for K and V
            out = torch.einsum("hcd,cnd->hnd", torch.cat((w, w), dim=-1),
                               x.view(len(src) * R, B * T, 2 * Hd)).contiguous()  # einsum may permute
        elif kind == "diag":  # the same-head parameter (R, |S|): head h reads head h of each source
            out = torch.bmm(w.unsqueeze(1), x.view(len(src), R, -1).transpose(0, 1)).view(R, -1)
        else:  # (R, |S|R)
            out = torch.mm(w, x.view(len(src) * R, -1))  # (R, B*T*2Hd)
        size, stride = (B, R, T, Hd), (T * 2 * Hd, B * T * 2 * Hd, 2 * Hd, 1)
        return out.as_strided(size, stride), out.as_strided(size, stride, Hd)


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
