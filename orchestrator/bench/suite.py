"""``run_bench``: the whole benchmark, from the machine's description to the files written.

For every router and shape (``shapes.py``) it measures, against the ``none`` baseline of the same
shape and in the same process: the training step time (``timing.py``: paired, interleaved
repetitions on one shared decoder body, added until each row's interval decides its target or is
narrow enough, ``stopping.py``), the routing alone outside the model (``alone.py``), the
peak memory of one step (``memory.py``: a fresh subprocess per case on CPU), the analytic forward
FLOPs per token and routing overhead (``lime_arch.accounting``) and the bytes the routing moves
per step at the measured bandwidth; the same for the naive peer (full routing with
``routing_impl="concat"``, the paper's concatenation); the same for the paper's peer
architectures and the 2026 field (``none+denseformer``, ``none+hyper-connections``, ``none+mhc``,
...: depth mixes over the none router, the analogue of its Table 17, without a target); and the
decode speed of none, full and first-4. ``targets.py`` gives the verdicts, ``outputs.py`` writes
the files. With a compile mode (``compile``: ``default``, ``reduce-overhead``) every shape is timed
a second time with every variant's forward compiled (Inductor), ``none`` included, and those rows
(``compile`` column) sit beside the eager ones: the setting of the paper's Table 17. The routing
alone is the same kernels compiled or not (the routing runs as opaque ops under compile) and is
measured once; decode stays eager.

CPU runs fp32 with one thread by default (OpenMP barriers under oversubscription make
multi-threaded timings meaningless on a shared 2-core box); CUDA runs bf16 autocast with
flash-attn when installed.
"""
from __future__ import annotations

import ctypes
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lime_arch.accounting import flop_overhead, flops_per_token, routing_memory
from lime_arch.routers import build_router
from orchestrator.bench import peak_memory as mem
from orchestrator.bench.alone import time_alone
from orchestrator.bench.outputs import write_outputs
from orchestrator.bench.peers import run_peers
from orchestrator.bench.profile import large_gemm_gflops
from orchestrator.bench.shapes import (
    BATCH,
    PEER,
    QUICK_BATCH,
    QUICK_SEQ,
    QUICK_SHAPES,
    SEQ,
    SHAPES,
    VOCAB,
    Shape,
    bench_depth_mixes,
    bench_routers,
    compile_shape_names,
    depth_mix_labels,
    split_label,
)
from orchestrator.bench.step import bench_cfg, clock, device_of
from orchestrator.bench.stopping import Stopping, ratio_target
from orchestrator.bench.targets import checks, step_target
from orchestrator.bench.timing import time_decode, time_shape


def steady_malloc() -> bool:
    """Keep freed memory in glibc's heap (no trimming, no per-tensor mmap) in this process.

    With glibc's defaults the heap is trimmed and big tensors are fresh mappings, so a step
    page-faults on tens of MB it freed a moment ago; on the dev VM that is ~6 us per 4 KiB page
    and adds random +-5% to every variant. This is what tcmalloc/jemalloc give PyTorch on CPU;
    it affects every variant alike. Returns False where mallopt is unavailable."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim, m_mmap = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
        return bool(libc.mallopt(m_mmap, 1 << 30)) and bool(libc.mallopt(m_trim, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def machine_info(device: torch.device, threads: int) -> dict:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "-",
            "torch": torch.__version__, "threads": threads, "device": device.type,
            "dtype": "bf16 autocast" if device.type == "cuda" else "fp32"}


@dataclass(frozen=True)
class _Setup:
    """What every case of one run shares."""

    dev: torch.device
    threads: int
    amp: bool
    quick: bool
    batch: int
    seq: int
    bw: float  # measured streaming bandwidth, GB/s
    compile: str | None = None  # a torch.compile mode: compiled rows beside the eager ones
    compile_shapes: frozenset[str] = frozenset()  # the shapes that get them
    gemm: float = 0.0  # a 512^3 fp32 matmul's GFLOP/s here, same threads: what the kernels do with a shape they like
    caps: dict | None = None  # shape name -> most paired rounds (adaptive: ``stopping``); None: fixed Shape.reps
    mix_shapes: frozenset[str] | None = None  # the shapes that get the depth-mix rows (None: all)
    memory_compiled: bool = True  # peak memory of the compiled rows too (each case compiles again)
    compile_mixes: bool = True  # compiled rows of the depth mixes too

    def case(self, cfg, with_amp: bool = True, compile_mode: str | None = None) -> dict:
        """A memory worker's case (JSON-able); the quick run's in-process cases leave out ``amp``."""
        out = {"cfg": cfg.to_dict(), "batch": self.batch, "seq": self.seq, "threads": self.threads,
               "device": self.dev.type}
        if compile_mode is not None:
            out["compile"] = compile_mode
        return {**out, "amp": self.amp} if with_amp else out


def _mode(row: dict) -> str | None:
    """A row's torch.compile mode, None for eager."""
    return None if row["compile"] == "eager" else row["compile"]


def _meta_router(spec: str, sh: Shape, head_dim: int):
    with torch.device("meta"):
        return build_router(spec, n_layers=sh.n_layers, n_kv_heads=sh.n_kv_heads, head_dim=head_dim, init="identity")


def static_twins(labels: Sequence[str], sh: Shape, head_dim: int) -> dict[str, str]:
    """Each token-dependent router's label -> the static learned router among ``labels`` that reads
    the same sources at every layer (one its class derives from first, else the first registered:
    dynamic -> full, dynamic-first-4 -> first-4): the rows its cost is compared with in ``bench.md``."""
    plain = [lab for lab in labels if split_label(lab)[1:] == ("buffer", "none")]
    routers = {lab: _meta_router(split_label(lab)[0], sh, head_dim) for lab in plain}
    srcs = {lab: [r.sources(l) for l in range(sh.n_layers)] for lab, r in routers.items()}
    out = {}
    for lab, r in routers.items():
        if r.kind.token_dependent:
            same = [o for o, ro in routers.items() if not ro.kind.token_dependent and ro.kind.learned
                    and srcs[o] == srcs[lab]]
            # the declaration a router's class derives from (its implementation class is a mix per class)
            twin = next((o for o in same if isinstance(r, getattr(type(routers[o]), "declaration", type(routers[o])))),
                        same[0] if same else None)
            if twin is not None:
                out[lab] = twin
    return out


def _row(s: _Setup, sh: Shape, lab: str, cfg, timed: dict, alone_s: float, mode: str | None = None) -> dict:
    """One row of ``bench.csv`` (plus the config, dropped before returning)."""
    base_ms = timed["none"]["step_ms"]
    fl = flops_per_token(cfg, s.seq)
    # at DRAM bandwidth: between writing a slot and reading it the layers' weights (4 MB per layer
    # at width 256) pass through the caches
    traffic = mem.routing_traffic(cfg, s.batch, s.seq, 2 if s.amp else 4)
    floor_ms = None if traffic is None else 1e3 * traffic / (s.bw * 1e9)
    tokens = s.batch * s.seq
    router, impl, depth_mix = split_label(lab)
    rmem = routing_memory(cfg, s.batch, s.seq, 2 if s.amp else 4)
    # the routing's FLOPs per step: training = 3 x forward; alone times the router's routing only, the
    # step's difference to none (paired ratio x none's step) times the router's and the depth mix's
    routing_flops = 3 * fl["routing"] * tokens
    extra_flops = 3 * (fl["total"] - fl["base"]) * tokens
    in_step_s = base_ms / 1e3 * (timed[lab]["ratio"] - 1)
    routing_gflops = routing_flops / alone_s / 1e9 if alone_s and routing_flops else None
    return {"router": router, "impl": impl, "depth_mix": depth_mix, "compile": mode or "eager",
            "label": lab, "shape": sh.name, "n_layers": sh.n_layers, "kv_heads": sh.n_kv_heads,
            **timed[lab], "overhead_pct": 100 * (timed[lab]["ratio"] - 1),
            "flop_overhead_pct": 100 * flop_overhead(cfg, s.seq), "flops_per_token": fl["total"],
            "alone_pct": 100 * 1e3 * alone_s / base_ms,
            "routing_gflops": routing_gflops,
            "step_gflops": extra_flops / in_step_s / 1e9 if in_step_s > 0 and extra_flops else None,
            "gemm_pct": None if routing_gflops is None or not s.gemm else 100 * routing_gflops / s.gemm,
            # the memory-bandwidth roofline of the routing's products: FLOPs over the time their traffic takes
            "roofline_gflops": (min(s.gemm, routing_flops / (floor_ms / 1e3) / 1e9)
                                if floor_ms and routing_flops and s.gemm else None),
            "body_gflops": 3 * fl["base"] * tokens / (base_ms / 1e3) / 1e9,
            "routing_mb": None if traffic is None else traffic / 2**20, "bw_gbs": s.bw,
            "bw_floor_pct": None if floor_ms is None else 100 * floor_ms / base_ms,
            "kept_mb": rmem["kept"] / 2**20, "transient_mb": rmem["transient"] / 2**20, "cfg": cfg}


def _shape_rows(s: _Setup, sh: Shape, labels: list[str], memory_on: bool) -> list[dict]:
    """Time every label of one shape (paired steps, eager and, with a compile mode, compiled; then
    the routing alone) and build its rows."""
    if s.quick:
        sh = Shape(sh.name, sh.n_layers, sh.n_kv_heads, 1)
    if s.mix_shapes is not None and sh.name not in s.mix_shapes:
        labels = [lab for lab in labels if split_label(lab)[2] == "none"]
    modes = [None] if s.compile is None or sh.name not in s.compile_shapes else [None, s.compile]
    cfgs = {lab: bench_cfg(sh, lab, s.dev, s.seq) for lab in labels}
    targets = {lab: ratio_target(step_target({"router": r, "impl": i, "depth_mix": d,
                                              "flop_overhead_pct": 100 * flop_overhead(cfg, s.seq)}))
               for lab, cfg in cfgs.items() for r, i, d in [split_label(lab)]}
    rule = None if s.quick or s.caps is None else Stopping(s.caps.get(sh.name, sh.reps))
    def of(mode):  # the labels timed in a mode: compiled depth mixes only if asked (each a cold Inductor build)
        return [lab for lab in labels if mode is None or s.compile_mixes or split_label(lab)[2] == "none"]
    timed = {mode: time_shape(sh, of(mode), s.dev, s.threads, s.amp, s.batch, s.seq,
                              warmup=1 if s.quick or sh.n_layers >= 64 else 2, hwm=s.quick and memory_on,
                              compile_mode=mode, rule=rule, targets=targets) for mode in modes}
    reps = 1 if s.quick else max(3, 160 // sh.n_layers)
    alone = time_alone(cfgs, s.batch, s.seq, s.dev, reps, clock(s.dev, s.threads)[0])
    rows = [_row(s, sh, lab, cfgs[lab], timed[mode], alone[lab], mode) for mode in modes for lab in of(mode)]
    twins = static_twins(labels, sh, cfgs["none"].head_dim)
    for r in rows:
        if r["label"] in twins:
            r["static_twin"] = twins[r["label"]]
    return rows


def _add_memory(s: _Setup, rows: list[dict], sub) -> None:
    """Peak memory per row, and each row's ratio to its shape's ``none``. Quick: the in-process
    high-water marks ``time_shape`` took (the subprocess path once, for the first none, in ``sub``);
    otherwise a fresh subprocess per case."""
    if not s.memory_compiled:  # the headline run: a compiled case would compile again in its subprocess
        rows = [r for r in rows if r["compile"] == "eager"]
    if s.quick:
        mems = [r.pop("_peak") or mem.measure_in_process(s.case(r["cfg"], False, _mode(r))) for r in rows]
    else:
        mems = mem.measure_many([s.case(r["cfg"], True, _mode(r)) for r in rows],
                                workers=1 if s.dev.type == "cuda" else 2)
    for r, m in zip(rows, mems):
        r.update(peak_mb=m["peak_mb"], step_mb=m["step_mb"], mem_method=m["method"])
    if sub is not None:
        rows[0]["subprocess_peak_mb"] = mem.finish_subprocess(sub)["peak_mb"]
    for row in rows:
        base = next(r for r in rows if r["shape"] == row["shape"] and r["label"] == "none"
                    and r["compile"] == row["compile"])
        row["mem_ratio"] = row["peak_mb"] / base["peak_mb"]


def run_bench(out_dir: str | os.PathLike = "results/bench", quick: bool = False, *, device: str | None = None,
              threads: int | None = 1, shapes: tuple[Shape, ...] | None = None,
              routers: Sequence[str] | None = None, memory: bool = True, decode: bool = True,
              depth_mixes: Sequence[str] | None = None, compile: str | None = None,
              compile_shapes: Sequence[str] | None = None, steady_heap: bool = False,
              caps: dict[str, int] | None = None, fixed_rounds: bool = False,
              depth_mix_shapes: Sequence[str] | None = None, memory_compiled: bool = True,
              compile_depth_mixes: bool = True, peers: bool = False) -> dict:
    """Run the benchmark, write ``bench.md``, ``bench.csv`` and ``decode.csv`` under ``out_dir``.

    ``routers``: router specs (default: every registered router, ``shapes.bench_routers``); ``none``
    and the peer are always added; ``depth_mixes``: the peer architectures, each a ``none+<depth mix>``
    row (default: every registered depth mix at its defaults, ``shapes.bench_depth_mixes``), at the
    shapes named in ``depth_mix_shapes`` (default: all). Rounds: each shape's paired rounds go on only
    until every row's interval decides its target or is narrow enough (``stopping``), at most
    ``caps[shape name]`` (default: the shape's ``reps``, at least the rule's 7); ``fixed_rounds``: exactly
    ``reps`` rounds and fixed-n intervals, as before. ``memory_compiled=False``: peak memory of the
    eager rows only (a compiled case compiles again in its subprocess); ``compile_depth_mixes=False``:
    the depth mixes eager only (each compiled variant is a cold Inductor build). ``quick``: tiny shapes,
    one repetition, memory in-process except one subprocess case. ``compile``: a torch.compile mode
    (``default``, ``reduce-overhead``; None or ``none``: eager only) whose rows are added beside the
    eager ones, at the shapes named in ``compile_shapes`` (default: ``shapes.COMPILE_SHAPES``, the paper's
    16-layer Table 17 models; every shape of a quick run). ``steady_heap``: on CPU, outside a quick run,
    keep freed memory in glibc's heap (``steady_malloc``) for steadier timings; it lasts for the rest of
    the process and cannot be undone, so only a process that ends with the run asks for it (``lime
    bench`` does; a test or a notebook that goes on does not). ``peers``: after the rows, the peers table
    (``peers.run_peers``: x-transformers and the hyper-connections package, the optional extra) at the
    shapes of at most 16 layers, as many interleaved rounds as each shape's cap (one in a quick run).
    Returns ``{"paths": [...], "rows": [...], "decode": [...], "checks": [...], "machine": {...}}``, with
    ``peers`` also ``"peers": {"rows": [...], "versions": {...}, "skipped": line or None}``."""
    t_start = time.perf_counter()
    dev = device_of(device)
    if threads and dev.type == "cpu":
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    shapes = shapes or (QUICK_SHAPES if quick else SHAPES)
    if compile not in (None, "none") and compile_shapes is None:
        compile_shapes = compile_shape_names(None, [sh.name for sh in shapes], quick)
    labels = list(dict.fromkeys(["none", *(bench_routers() if routers is None else routers), PEER,
                                 *depth_mix_labels(bench_depth_mixes() if depth_mixes is None else depth_mixes)]))
    if not fixed_rounds:
        least = Stopping(1).min_rounds  # below it the sequence is the whole line: no row could decide
        caps = {sh.name: max(least, (caps or {}).get(sh.name, sh.reps)) for sh in shapes}
    malloc = steady_malloc() if steady_heap and dev.type == "cpu" and not quick else False
    load0 = os.getloadavg()
    batch, seq = (QUICK_BATCH, QUICK_SEQ) if quick else (BATCH, SEQ)
    s = _Setup(dev, threads, dev.type == "cuda", quick, batch, seq, mem.measure_bandwidth(32 if quick else 256),
               None if compile in (None, "none") else compile, frozenset(compile_shapes or ()),
               large_gemm_gflops(reps=3 if quick else 20), None if fixed_rounds else caps,
               None if depth_mix_shapes is None else frozenset(depth_mix_shapes), memory_compiled,
               compile_depth_mixes)
    # quick: the subprocess path once, for the first shape's none, overlapping the timing
    sub = mem.start_subprocess(s.case(bench_cfg(shapes[0], "none", dev, seq))) if memory and quick else None
    rows = [row for sh in shapes for row in _shape_rows(s, sh, labels, memory)]
    if memory:
        _add_memory(s, rows, sub)
    for row in rows:
        row.pop("_peak", None)
    dec = []
    if decode:
        dec = time_decode(shapes[0], dev, s.amp, reps=2 if quick else 150, prompt=4 if quick else 16,
                          new=4 if quick else 48)
    peer_out = None
    if peers:
        rounds = {sh.name: 1 if quick else (caps or {}).get(sh.name, sh.reps) for sh in shapes}
        peer_out = run_peers(shapes, dev, threads, batch, seq, rounds, warmup=1 if quick else 2)
    info = machine_info(dev, threads)
    info.update(bandwidth_gbs=s.bw, steady_malloc=malloc, load_start=load0, load_end=os.getloadavg(),
                clock=clock(dev, threads)[1], batch=batch, seq=seq, vocab=VOCAB, quick=quick,
                compile=s.compile or "none", gemm_gflops=s.gemm,
                rounds="fixed" if fixed_rounds or quick else
                ", ".join(f"{k} <= {v}" for k, v in caps.items()),
                compile_shapes=",".join(sh.name for sh in shapes if s.compile and sh.name in s.compile_shapes) or "-",
                seconds=time.perf_counter() - t_start)
    chk = checks(rows, dec)
    paths = write_outputs(Path(out_dir), rows, dec, chk, info, peer_out)
    for row in rows:
        row.pop("cfg")
    out = {"paths": [str(p) for p in paths], "rows": rows, "decode": dec, "checks": chk, "machine": info}
    return out if peer_out is None else {**out, "peers": peer_out}
