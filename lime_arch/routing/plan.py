"""Where the buffer mixer's work goes: layouts, layer blocks and per-layer plans.

``Layout`` says how one layer's K/V sit in the buffer and how a router's weights become
(D, Mo, cols) operands; ``Plan`` fixes, for one router and block size, which products every
layer runs (its sources below and inside its block, the block's union of old slots, the
readers of each slot). Plans depend only on the router's source sets, so they are cached on
the router. The design is described in ``kvbuffer``'s module docstring.
"""
from __future__ import annotations

import torch

from lime_arch.routers import Router

Tensor = torch.Tensor

MAX_BLOCK_ROWS = 128  # m * Mo: output rows of a block product; beyond this the speed-up saturates


def runs_of(pairs: list[tuple[int, int]], rs: int) -> list[tuple[int, int, int, int]]:
    """(weight column index, slot) pairs -> contiguous runs (col0, col1, row0, row1) in units of rows."""
    runs, i = [], 0
    while i < len(pairs):
        j = i
        while j + 1 < len(pairs) and pairs[j + 1][1] == pairs[j][1] + 1 and pairs[j + 1][0] == pairs[j][0] + 1:
            j += 1
        runs.append((pairs[i][0] * rs, (pairs[j][0] + 1) * rs, pairs[i][1] * rs, (pairs[j][1] + 1) * rs))
        i = j + 1
    return runs


def layer_groups(xs: list) -> list[list]:
    """Split a sorted list of (layer, ...) tuples into runs of consecutive layers."""
    out: list[list] = []
    for x in xs:
        if out and x[0] == out[-1][-1][0] + 1:
            out[-1].append(x)
        else:
            out.append([x])
    return out


def traffic(sources: list[list[int]], m: int) -> float:
    """Modelled memory traffic (in slots) of blocking with size m; see ``choose_block``."""
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


def choose_block(sources: list[list[int]], mo: int) -> int:
    L = len(sources)
    cap = max(1, MAX_BLOCK_ROWS // mo)
    cands = sorted({m for m in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if m <= min(cap, L)} | {L})
    return min(cands, key=lambda m: (traffic(sources, m), -m))


class Block:
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


class Plan:
    """Which products each layer runs, for one router and block size (sources never change)."""

    def __init__(self, router: Router, block: int, rs: int, mo: int):
        L = router.n_layers
        self.block, self.rs, self.mo = block, rs, mo
        self.sources = [router.sources(l) for l in range(L)]
        for l, src in enumerate(self.sources):
            if src != sorted(set(src)):
                raise ValueError(f"router {router.spec}: sources({l}) must be sorted and unique, got {src}")
        self.blocks = [Block(l0, min(l0 + block, L)) for l0 in range(0, L, block)]
        self.block_of = [l // block for l in range(L)]
        self.member_idx: list[int | None] = [None] * L  # position of the layer among its block's members
        self.n_pre = [0] * L  # sources below the block start: the first n_pre weight column groups
        self.in_runs: list[list] = []  # per layer: runs (col0, col1, row0, row1) over its in-block
        #   sources; columns relative to the in-block weight slice, rows absolute buffer rows
        self.in_one: list[bool] = []  # the in-block sources are one run covering the whole slice
        # every source as buffer row runs (the no-grad few-token path of linear routers)
        self.all_runs = [runs_of(list(enumerate(src)), rs) for src in self.sources]
        readers: list[list[tuple[int, int]]] = [[] for _ in range(L)]
        for l, src in enumerate(self.sources):
            blk = self.blocks[self.block_of[l]]
            pre = [s for s in src if s < blk.l0]
            self.n_pre[l] = len(pre)
            runs = runs_of([(i - len(pre), s) for i, s in enumerate(src) if s >= blk.l0], rs)
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
        self.reader_runs = [[(g[0][0], g[-1][0] + 1) for g in layer_groups(r)] for r in readers]
        for blk in self.blocks:
            blk.U = sorted({s for l in blk.members for s in self.sources[l] if s < blk.l0})
            pos = {s: i for i, s in enumerate(blk.U)}
            blk.ucols = [[pos[s] for s in self.sources[l][:n]] for l, n in zip(blk.members, blk.n_pre)]
            blk.dense_pre = all(c == list(range(len(blk.U))) for c in blk.ucols)
            blk.u_runs = runs_of(list(enumerate(blk.U)), rs)
            if len(blk.u_runs) > 1:
                blk.u_index = torch.tensor([s * rs + r for s in blk.U for r in range(rs)])
            if blk.members and blk.members == list(range(blk.members[0], blk.members[-1] + 1)):
                blk.mem_rows = ((blk.members[0] - blk.l0) * mo, (blk.members[-1] + 1 - blk.l0) * mo)


def plan_for(router: Router, lay: Layout, block: int | None) -> Plan:
    cache = router.__dict__.setdefault("_lime_plans", {})
    if block is None:
        if ("auto", lay.mo) not in cache:
            cache[("auto", lay.mo)] = choose_block([router.sources(l) for l in range(router.n_layers)], lay.mo)
        block = cache[("auto", lay.mo)]
    key = (block, lay.rs, lay.mo)
    if key not in cache:
        cache[key] = Plan(router, block, lay.rs, lay.mo)
    return cache[key]


class Layout:
    """How K/V of one layer sit in the buffer and how the router's weights become (D, Mo, cols)."""

    def __init__(self, router: Router):
        R = router.R
        self.kind = "diag" if router.kind == "linear" and router.same_head else router.kind
        self.R, self.Hd = R, router.head_dim
        self.rs = 1 if self.kind == "diag" else R
        self.mo = 1 if self.kind == "diag" else R
        self.cache: dict[tuple, tuple] = {}  # (id(param), tag) -> (param, data_ptr, dtype, views)
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

    def _memo(self, w: Tensor, tag, build, views: bool = True):
        """``build()`` (under no_grad), memoised per parameter and ``tag`` while it is a set of views
        of the parameter's current storage (``.data`` replaced, e.g. by ``.double()``, rebuilds;
        in-place optimizer updates show through the views)."""
        key = (id(w), tag)
        c = self.cache.get(key)
        if c is not None and c[0] is w and c[1] == w.data_ptr() and c[2] == w.dtype:
            return c[3]
        with torch.no_grad():
            out = build()
        if views and isinstance(w, torch.nn.Parameter):
            self.cache[key] = (w, w.data_ptr(), w.dtype, out)
        return out

    def views(self, w: Tensor, n_pre: int) -> tuple[Tensor, Tensor]:
        """(old-slot columns, in-block columns) of ``w3(w)``. Per-dim's ``w3`` is a contiguous
        copy, not a view, so it is rebuilt every time."""
        def build():
            w3, cut = self.w3(w), n_pre * self.rs
            return w3[:, :, :cut], (w3[:, :, cut:] if n_pre else w3)
        return self._memo(w, n_pre, build, views=self.kind != "perdim")

    def col_slices(self, w: Tensor, runs: list) -> list[Tensor]:
        """``w[:, c0:c1]`` per run (decode's few-token path of linear routers)."""
        return self._memo(w, "cols", lambda: [w[:, c0:c1] for c0, c1, _ in runs])

    def grad_w(self, g3: Tensor, dtype: torch.dtype) -> Tensor:
        """A (D, Mo, |S|*rs) gradient back in the router weight's shape."""
        if self.kind == "linear":
            return g3.squeeze(0).to(dtype)
        if self.kind == "perdim":
            return g3.permute(1, 2, 0).to(dtype)
        return g3.squeeze(1).to(dtype)  # diag: (R, 1, |S|) -> the parameter's (R, |S|)
