"""Where the buffer mixer's work goes: the buffer layout, layer blocks, per-layer plans, traffic.

``Layout`` says how one layer's K/V sit in the buffer (``rows_per_slot`` rows per layer) and how
a router's ``weight(l)`` becomes the (D, out_rows, columns) operand of a batched product, as the
router's kind defines them (``lime_arch.routing.kinds.buffered``).
``Plan`` fixes, for one router and block size, which products every layer runs: layers are
grouped in blocks of ``block`` consecutive layers; a block's *members* are its layers with
sources below the block's first layer (*old slots*), whose old-slot part is computed in one
product when the block starts; every layer then adds its *in-block* sources itself. Plans depend
only on the router's source sets, so they are cached on the router.

``traffic`` is the one model of what a plan moves through memory, in slots (one layer's K and V
for the whole batch): the block chooser minimises a weighted form of it, and ``step_traffic``
turns it into bytes for the benchmark's bandwidth floor. The design as a whole is described in
``lime_arch.routing.mixers`` and in docs/ARCHITECTURE.md, "Routing internals".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lime_arch.router_base import Router

Tensor = torch.Tensor

MAX_BLOCK_ROWS = 128  # block * out_rows: output rows of a block product; beyond this the speed-up saturates
BLOCK_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # candidates of the chooser (and the whole depth)


def row_runs(pairs: list[tuple[int, int]], rows_per_slot: int) -> list[tuple[int, int, int, int]]:
    """(weight column index, slot) pairs -> contiguous runs (col0, col1, row0, row1) in units of rows."""
    runs, i = [], 0
    while i < len(pairs):
        j = i
        while j + 1 < len(pairs) and pairs[j + 1][1] == pairs[j][1] + 1 and pairs[j + 1][0] == pairs[j][0] + 1:
            j += 1
        n = rows_per_slot
        runs.append((pairs[i][0] * n, (pairs[j][0] + 1) * n, pairs[i][1] * n, (pairs[j][1] + 1) * n))
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


class LayerBlock:
    """Layers l0..l1-1 of one block and the old slots (sources below l0) its members read."""

    def __init__(self, l0: int, l1: int):
        self.l0, self.l1 = l0, l1
        self.members: list[int] = []  # layers of the block (>= 1) with sources below l0
        self.n_old: list[int] = []  # per member: number of its sources below l0
        self.old_slots: list[int] = []  # sorted union of the members' sources below l0
        self.old_cols: list[list[int]] = []  # per member: positions of its old sources in old_slots
        self.dense_old = False  # every member reads all of old_slots, in their order
        self.old_runs: list[tuple[int, int, int, int]] = []  # old_slots as buffer row runs
        self.old_index: Tensor | None = None  # buffer row index of old_slots (when not one run)
        self.member_rows: tuple[int, int] | None = None  # members as a row range of the block's grad_out


def layer_blocks(sources: list[list[int]], block: int) -> list[LayerBlock]:
    """The layers in blocks of ``block``, each with its members and their old slots."""
    L = len(sources)
    blocks = [LayerBlock(l0, min(l0 + block, L)) for l0 in range(0, L, block)]
    for blk in blocks:
        for l in range(max(blk.l0, 1), blk.l1):
            old = [s for s in sources[l] if s < blk.l0]
            if old:
                blk.members.append(l)
                blk.n_old.append(len(old))
        blk.old_slots = sorted({s for l in blk.members for s in sources[l] if s < blk.l0})
        pos = {s: i for i, s in enumerate(blk.old_slots)}
        blk.old_cols = [[pos[s] for s in sources[l][:n]] for l, n in zip(blk.members, blk.n_old)]
        blk.dense_old = all(c == list(range(len(blk.old_slots))) for c in blk.old_cols)
    return blocks


@dataclass(frozen=True)
class Traffic:
    """Slots one training step (forward and backward) of the buffer mixer reads and writes, by what
    moves them. A slot is one layer's K and V for the whole batch, as large as one routed output;
    router weights are left out (tiny)."""

    in_block: int  # in-block sources: read in forward, for dW, and their readers' grad_out rows
    old_slots: int  # block products over old slots: P (read old slots, write P), members read P,
    #   dW_old (read grad_out rows and old slots), grad[old] += W_old^T grad_out (read, read-modify-write)
    old_products: int  # blocks with members (each runs the two old-slot products above)
    grad_buffer: int  # the K/V gradient buffer of old slots (when any block has members): zero fill,
    #   one read per slot
    fixed: int  # K/V writes, routed outputs, grad_out zero fill and stores, dW outputs, slot
    #   gradients, per-dim's copies into attention's layout and back

    @property
    def slots(self) -> int:
        return self.in_block + self.old_slots + self.grad_buffer + self.fixed

    def block_cost(self) -> float:
        """The block chooser's objective: in-block slots were written moments before and are read
        from cache, so they count half; each block's old-slot products cost 2 slots more for their
        fixed overhead. The K/V gradient buffer is left out, which favours blocking slightly; the
        block sizes chosen (and the model's numerics with them) depend on exactly this form."""
        return self.in_block / 2 + self.old_slots + 2 * self.old_products


def traffic(sources: list[list[int]], blocks: list[LayerBlock], copies: bool = False) -> Traffic:
    """The traffic of the plan with these source sets and blocks (see ``Traffic``); ``copies``: the
    kind copies routed K/V into attention's layout and their gradients back (per-dim)."""
    L = len(sources)
    in_block = 3 * sum(sum(s >= blk.l0 for s in sources[l]) for blk in blocks for l in range(max(blk.l0, 1), blk.l1))
    with_members = [blk for blk in blocks if blk.members]
    old = sum(4 * (len(blk.old_slots) + len(blk.members)) for blk in with_members)
    # fixed: write K/V (read + write); zero grad_out; per layer >= 1 its output, its grad_out store
    # (read + write) and its dW; per slot its gradient; a copying kind copies the output and its gradient
    fixed = 2 * L + L + 4 * (L - 1) + L + (4 * (L - 1) if copies else 0)
    return Traffic(in_block=in_block, old_slots=old, old_products=len(with_members),
                   grad_buffer=2 * L if with_members else 0, fixed=fixed)


def choose_block(sources: list[list[int]], out_rows: int) -> int:
    """The block size of least ``Traffic.block_cost`` (ties: the larger), at most MAX_BLOCK_ROWS rows."""
    L = len(sources)
    cap = max(1, MAX_BLOCK_ROWS // out_rows)
    candidates = sorted({m for m in BLOCK_SIZES if m <= min(cap, L)} | {L})
    return min(candidates, key=lambda m: (traffic(sources, layer_blocks(sources, m)).block_cost(), -m))


class Plan:
    """Which products each layer runs, for one router and block size (sources never change)."""

    def __init__(self, router: Router, block: int, rows_per_slot: int, out_rows: int):
        L, n = router.n_layers, rows_per_slot
        self.block, self.rows_per_slot, self.out_rows = block, rows_per_slot, out_rows
        self.sources = [router.sources(l) for l in range(L)]
        for l, src in enumerate(self.sources):
            if src != sorted(set(src)):
                raise ValueError(f"router {router.spec}: sources({l}) must be sorted and unique, got {src}")
        self.blocks = layer_blocks(self.sources, block)
        self.block_of = [l // block for l in range(L)]
        self.member_idx: list[int | None] = [None] * L  # position of the layer among its block's members
        for blk in self.blocks:
            for i, m in enumerate(blk.members):
                self.member_idx[m] = i
        self.n_old = [0] * L  # sources below the block start: the first n_old weight column groups
        self.in_runs: list[list] = []  # per layer: runs (col0, col1, row0, row1) over its in-block
        #   sources; columns relative to the in-block weight slice, rows absolute buffer rows
        self.in_single_run: list[bool] = []  # the in-block sources are one run covering the whole slice
        # every source as buffer row runs (the no-grad few-token path of linear routers)
        self.source_runs = [row_runs(list(enumerate(src)), n) for src in self.sources]
        readers: list[list[tuple[int]]] = [[] for _ in range(L)]
        for l, src in enumerate(self.sources):
            l0 = self.blocks[self.block_of[l]].l0
            n_old = self.n_old[l] = sum(s < l0 for s in src)
            runs = row_runs([(i - n_old, s) for i, s in enumerate(src) if s >= l0], n)
            self.in_runs.append(runs)
            self.in_single_run.append(len(runs) == 1 and runs[0][0] == 0 and runs[0][1] == (len(src) - n_old) * n)
            if l > 0:
                for s in src:
                    if s >= l0:
                        readers[s].append((l,))
        for blk in self.blocks:
            blk.old_runs = row_runs(list(enumerate(blk.old_slots)), n)
            if len(blk.old_runs) > 1:
                blk.old_index = torch.tensor([s * n + r for s in blk.old_slots for r in range(n)])
            if blk.members and blk.members == list(range(blk.members[0], blk.members[-1] + 1)):
                blk.member_rows = ((blk.members[0] - blk.l0) * out_rows, (blk.members[-1] + 1 - blk.l0) * out_rows)
        # per block: its leader, the first layer >= 1 (None for a block of layer 0 alone), which runs
        # the block's batched products: P in forward; in backward, after every later layer of the
        # block, the dW of every layer of the block in one product and the old slots' gradient. Its
        # function therefore takes the weights of the block's other layers (``taken``).
        self.leaders: list[int | None] = [max(blk.l0, 1) if max(blk.l0, 1) < blk.l1 else None for blk in self.blocks]
        self.taken = [[] if ld is None else list(range(ld + 1, blk.l1)) for ld, blk in zip(self.leaders, self.blocks)]
        # the leader's dW of its block: layer l's dW is g_l @ buf[its sources]^T. Batched, it is one
        # product of the block's grad_out rows (from the leader's on) with the buffer rows
        # ``dw_rows[b]``, which holds, beside every layer's wanted columns, its products with the
        # block's other slots: the old slots and the block's slots when the old slots are one run right
        # below the block and every layer of the block is a member (``dw_merged``: full, no-head-mix,
        # per-dim), else the block's slots, the old-slot columns coming from the members' product. It
        # is batched when at least half of it is wanted (the block's lower triangle, for full routing);
        # sparse in-block sources (last-j, dilated-d, first-j's) keep one product per layer and run
        # (``dw_rows[b]`` None). Per layer, ``dw_runs``: weight columns [col0, col1) are product
        # columns [c0, c1) (batched), or buffer rows [c0, c1) (per run).
        self.dw_rows: list[tuple[int, int] | None] = []
        self.dw_merged: list[bool] = []
        self.dw_runs: list[list[tuple[int, int, int, int]]] = [[] for _ in range(L)]
        for b, blk in enumerate(self.blocks):
            ld = self.leaders[b]
            group = [] if ld is None else list(range(ld, blk.l1))
            merged = bool(group) and blk.members == group and len(blk.old_runs) == 1 \
                and blk.old_runs[0][3] == blk.l0 * n
            r0 = blk.old_runs[0][2] if merged else blk.l0 * n
            wanted = sum(len(self.sources[l]) if merged else len(self.sources[l]) - self.n_old[l] for l in group)
            batched = bool(group) and 2 * wanted * n >= len(group) * (blk.l1 * n - r0)
            self.dw_rows.append((r0, blk.l1 * n) if batched else None)
            self.dw_merged.append(merged and batched)
            for l in group:
                if merged and batched:
                    self.dw_runs[l] = [(c0, c1, a - r0, e - r0) for c0, c1, a, e in self.source_runs[l]]
                else:  # the in-block columns (after the n_old old ones)
                    cut, base = self.n_old[l] * n, r0 if batched else 0
                    self.dw_runs[l] = [(cut + c0, cut + c1, a - base, e - base) for c0, c1, a, e in self.in_runs[l]]
        # in-block readers of each slot as runs of consecutive layers [la, lb)
        self.reader_runs = [[(g[0][0], g[-1][0] + 1) for g in layer_groups(r)] for r in readers]

    def traffic(self, copies: bool = False) -> Traffic:
        return traffic(self.sources, self.blocks, copies)


class Layout:
    """How one layer's K/V sit in the buffer and how ``weight(l)`` becomes (D, out_rows, columns):
    the router's kind says (``lime_arch.routing.kinds``: ``slot_rows``, ``operand``,
    ``weight_grad``); this object checks the router's weights against it once and memoises views
    of the weights that are parameters. linear: D = 1, R rows per slot, operand (1, R, |S|R);
    per-dim: D = Hd, R rows, (Hd, R, |S|R); same-head: D = R, 1 row, (R, 1, |S|)."""

    def __init__(self, router: Router, memoize: bool = True):
        kind = router.kind
        if not kind.learned:
            raise ValueError(f"router {router.spec}: kind {kind.name} has no weights to lay out")
        self.kind, self.R, self.Hd = kind, router.R, router.head_dim
        self.rows_per_slot = self.out_rows = kind.slot_rows(router.R)
        self.memo: dict[tuple, tuple] = {}  # (id(param), tag) -> (param, data_ptr, dtype, views)
        self.memoize = memoize  # False: a layout shared by many models (the compile ops) keeps no views
        with torch.no_grad():  # the contract of weight(l), checked once per router
            for l in range(1, router.n_layers):
                w, want = router.weight(l), router.operand_shape(l)
                if w is None or tuple(w.shape) != want:
                    got = None if w is None else tuple(w.shape)
                    raise ValueError(f"router {router.spec}: weight({l}) has shape {got}; kind "
                                     f"{kind.name} multiplies {want}")

    def operand(self, w: Tensor) -> Tensor:
        """The router's weight of a layer as (D, out_rows, |S|*rows_per_slot) (used inside autograd functions)."""
        return self.kind.operand(w)

    def _memo(self, w: Tensor, tag, build, views: bool = True):
        """``build()`` (under no_grad), memoised per parameter and ``tag`` while it is a set of views
        of the parameter's current storage (``.data`` replaced, e.g. by ``.double()``, rebuilds;
        in-place optimizer updates show through the views). Computed weights are not memoised."""
        key = (id(w), tag)
        c = self.memo.get(key)
        if c is not None and c[0] is w and c[1] == w.data_ptr() and c[2] == w.dtype:
            return c[3]
        with torch.no_grad():
            out = build()
        if views and self.memoize and isinstance(w, torch.nn.Parameter):
            self.memo[key] = (w, w.data_ptr(), w.dtype, out)
        return out

    def split_columns(self, w: Tensor, n_old: int) -> tuple[Tensor, Tensor]:
        """(old-slot columns, in-block columns) of ``operand(w)``. An operand that is a copy, not a
        view (per-dim's contiguous one), is rebuilt every time."""
        def build():
            op, cut = self.kind.operand(w), n_old * self.rows_per_slot
            return op[:, :, :cut], (op[:, :, cut:] if n_old else op)
        return self._memo(w, n_old, build, views=self.kind.operand_is_view)

    def column_slices(self, w: Tensor, runs: list) -> list[Tensor]:
        """``w[:, c0:c1]`` per run (decode's few-token path of linear routers)."""
        return self._memo(w, "cols", lambda: [w[:, c0:c1] for c0, c1, _ in runs])

    def weight_grad(self, g: Tensor, dtype: torch.dtype) -> Tensor:
        """A (D, out_rows, |S|*rows_per_slot) gradient back in the shape of ``weight(l)``."""
        return self.kind.weight_grad(g, dtype)


def layout_for(router: Router) -> Layout:
    """The router's layout, built once and kept on the router."""
    lay = router.__dict__.get("_lime_layout")
    if lay is None:
        lay = router.__dict__["_lime_layout"] = Layout(router)
    return lay


def plan_for(router: Router, lay: Layout, block: int | None) -> Plan:
    """The router's plan for ``block`` (None: the chooser's), cached on the router."""
    cache = router.__dict__.setdefault("_lime_plans", {})
    if block is None:
        if ("auto", lay.out_rows) not in cache:
            sources = [router.sources(l) for l in range(router.n_layers)]
            cache[("auto", lay.out_rows)] = choose_block(sources, lay.out_rows)
        block = cache[("auto", lay.out_rows)]
    key = (block, lay.rows_per_slot, lay.out_rows)
    if key not in cache:
        cache[key] = Plan(router, block, lay.rows_per_slot, lay.out_rows)
    return cache[key]


def step_traffic(router: Router, batch: int, seq: int, elem_bytes: int = 4,
                 block: int | None = None) -> tuple[int, int]:
    """(slots, bytes) the routing reads and writes in one training step of ``batch`` sequences of
    ``seq`` tokens: the kind's count (``RouterKind.traffic_slots``). The buffered kinds count the
    plan the buffer mixer runs (``block`` None: the chooser's); ``none`` moves nothing; the running
    mean moves about 10 slots per layer (forward: an add, 3 slots, and a divide, 2; backward about
    the same)."""
    slot = 2 * batch * seq * router.R * router.head_dim * elem_bytes  # one layer's K and V
    slots = router.kind.traffic_slots(router, block)
    return slots, slots * slot
