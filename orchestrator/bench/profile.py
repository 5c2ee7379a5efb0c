"""``lime bench --profile``: where the routing's time goes, product by product.

The benchmark's ``kernel-bound`` verdict says that the routing alone (forward and backward outside
the model) already costs more than its target. This says why, for every router and shape asked:
the routing alone runs under ``torch.profiler`` (record_shapes), its products (bmm, baddbmm, mm,
addmm) are grouped by shape, and each group's achieved GFLOP/s (2 x batch x M x K x N per call
over the op's own CPU time) is set beside

  ref GFLOP/s    the same op on fresh contiguous operands of the same shape, timed alone (median of
                 ``reps`` calls, after warm-up): what the kernel library does with that shape
  large GEMM     a 512 x 512 x 512 matmul: what it does with a shape it likes

A product far below its reference is a layout or cache problem (strided views, cold operands);
one at its reference but far below the large GEMM is the kernel's limit on that shape (the
routing's products have M = KV heads rows). The time split gives the rest: copies (K/V writes,
gradient stores, clones, gathers) and everything that is not an op (Python, autograd). The
profiler adds about a microsecond per op, which matters for the smallest products only; the
pass time is the median of unprofiled passes, the ops' times come from profiled ones.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from orchestrator.bench.alone import _case
from orchestrator.bench.shapes import BATCH, SEQ, Shape
from orchestrator.bench.step import bench_cfg

PRODUCTS = ("aten::bmm", "aten::baddbmm", "aten::baddbmm_", "aten::mm", "aten::addmm", "aten::addmm_")
COPIES = ("aten::copy_", "aten::clone", "aten::cat", "aten::index_select", "aten::index_add_", "aten::zero_",
          "aten::fill_", "aten::stack")


def _dims(name: str, shapes: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a product event from its input shapes."""
    a, b = (shapes[1], shapes[2]) if "add" in name else (shapes[0], shapes[1])
    if len(a) == 3 and len(b) == 3:
        return a[0], a[1], a[2], b[2]
    if len(a) == 2 and len(b) == 2:
        return 1, a[0], a[1], b[1]
    return None


def _median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def reference_gflops(b: int, m: int, k: int, n: int, reps: int = 50) -> float:
    """GFLOP/s of ``torch.bmm`` on fresh contiguous operands of this shape (median of ``reps``)."""
    x, y = torch.randn(b, m, k), torch.randn(b, k, n)
    return 2 * b * m * k * n / _median_time(lambda: torch.bmm(x, y), reps) / 1e9


def large_gemm_gflops(size: int = 512, reps: int = 20) -> float:
    x, y = torch.randn(size, size), torch.randn(size, size)
    return 2 * size ** 3 / _median_time(lambda: torch.mm(x, y), reps) / 1e9


def profile_routing(router: str, shape: Shape, *, batch: int = BATCH, seq: int = SEQ, runs: int = 5,
                    ref_reps: int = 50) -> dict:
    """Profile ``runs`` forward + backward passes of the routing alone; returns per-product rows and
    the time split (seconds per pass)."""
    cfg = bench_cfg(shape, router, torch.device("cpu"), seq)
    run = _case(cfg, batch, seq, torch.device("cpu"))
    wall = _median_time(run, max(runs, 5))  # without the profiler (the first call warms plans and pools)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(runs):
            run()
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    split = {"products": 0.0, "copies": 0.0, "other ops": 0.0}
    for ev in prof.key_averages(group_by_input_shape=True):
        self_s = ev.self_cpu_time_total / 1e6 / runs
        if ev.key in PRODUCTS:
            split["products"] += self_s
            dims = _dims(ev.key, ev.input_shapes)
            if dims is not None:
                g = groups[(ev.key, *dims)]
                g[0] += ev.count / runs
                g[1] += self_s
        elif ev.key in COPIES:
            split["copies"] += self_s
        elif ev.key.startswith("aten::"):
            split["other ops"] += self_s
    # the ops' self times come from the profiled passes, the pass time from unprofiled ones
    split["python, autograd (the rest)"] = max(0.0, wall - sum(split.values()))
    rows = []
    for (op, b, m, k, n), (calls, secs) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        flops = 2 * b * m * k * n * calls
        rows.append({"router": router, "shape": shape.name, "op": op, "batch": b, "M": m, "K": k, "N": n,
                     "calls": calls, "ms": 1e3 * secs, "gflops": flops / secs / 1e9 if secs else None,
                     "ref_gflops": reference_gflops(b, m, k, n, ref_reps)})
    return {"router": router, "shape": shape.name, "rows": rows, "split": {k: 1e3 * v for k, v in split.items()},
            "wall_ms": 1e3 * wall}


def write_profile(out_dir: str | Path, results: list[dict], large: float, threads: int) -> Path:
    """``profile.md``: per router and shape, the time split and the products table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    L = ["# Routing profile: the products' GFLOP/s against same-shaped reference GEMMs", "",
         f"CPU, {threads} thread(s), fp32, batch {BATCH} x {SEQ} tokens; routing alone (forward + backward "
         f"on random K/V). Large GEMM (512^3): {large:.1f} GFLOP/s. See orchestrator/bench/profile.py.", ""]
    for res in results:
        L += [f"## {res['router']} @ {res['shape']}: {res['wall_ms']:.1f} ms per pass (median, unprofiled)", "",
              "| part | ms per pass |", "|---|---:|"]
        L += [f"| {k} | {v:.2f} |" for k, v in res["split"].items()]
        L += ["", "| op | batch | M | K | N | calls/pass | ms/pass | GFLOP/s | ref GFLOP/s | of ref | of large |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["rows"]:
            g, ref = r["gflops"] or 0.0, r["ref_gflops"]
            L.append(f"| {r['op']} | {r['batch']} | {r['M']} | {r['K']} | {r['N']} | {r['calls']:.0f} | "
                     f"{r['ms']:.2f} | {g:.1f} | {ref:.1f} | {g / ref:.2f} | {g / large:.2f} |")
        L += ["" if res["rows"] else "(no products)", ""]
    path = out / "profile.md"
    path.write_text("\n".join(L))
    return path


def run_profile(out_dir: str | Path, routers, shapes, *, threads: int = 1, runs: int = 5, ref_reps: int = 50,
                batch: int = BATCH, seq: int = SEQ) -> dict:
    """Profile every router at every shape on CPU; write ``profile.md``."""
    torch.set_num_threads(threads)
    results = [profile_routing(r, sh, batch=batch, seq=seq, runs=runs, ref_reps=ref_reps)
               for sh in shapes for r in routers]
    large = large_gemm_gflops()
    return {"path": str(write_profile(out_dir, results, large, torch.get_num_threads())), "results": results,
            "large_gflops": large}
