"""Benchmark helpers: peak memory of one training step, memory bandwidth, routing traffic.

Peak memory on CPU. Each case runs in a fresh subprocess (``python -m orchestrator.bench.peak_memory``)
with ``MALLOC_MMAP_THRESHOLD_=65536``: every tensor of 64 KiB or more is its own mapping and is
returned to the OS when freed, so the resident set follows the live tensors (activations
included) instead of the malloc heap's high-water mark of earlier work. After one warm-up step
(which creates the AdamW state), the worker writes "5" to ``/proc/self/clear_refs`` (resets
VmHWM to the current RSS) and reads VmHWM after the measured step: the peak resident memory of
that step, covering parameters, gradients, optimizer state and the activations alive at the
peak. On CUDA it is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
That this sees activations is visible in the table itself: the concatenation peer, whose saved
activations grow as L^2, shows a peak far above ``none`` at depth (and the measurement also
reports the step's increment over the resident set before it, ``step_mb``).

Routing traffic. ``routing_traffic`` counts the bytes the buffer mixer's products and copies
read and write in one training step (forward, backward), from the same plan the mixer runs;
``measure_bandwidth`` times a large tensor copy in the calling process. Their quotient is the
time routing needs at the machine's streaming bandwidth, whatever its FLOPs: the benchmark's
evidence where a step-time target is out of reach because the routing is bandwidth-bound.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import torch

from lime_arch.config import ModelConfig
from lime_arch.routers import build_router
from lime_arch.routing import plan as kvplan
from orchestrator.bench.step import make_step

MMAP_THRESHOLD = 65536


# -- peak memory --------------------------------------------------------------------------------
def _read_status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_peak(fn) -> tuple[int, int] | None:
    """(RSS high-water mark during ``fn()``, RSS before it) in bytes; None where the mark cannot be
    reset (no writable /proc/self/clear_refs)."""
    if not _reset_hwm():
        return None
    before = _read_status()["VmRSS"]
    fn()
    return _read_status()["VmHWM"], before


def measure_in_process(case: dict) -> dict:
    """Peak memory of one training step of ``case`` in this process (see the module docstring)."""
    torch.set_num_threads(case.get("threads", 1))
    dev = torch.device(case.get("device", "cpu"))
    step = make_step(ModelConfig.from_dict(case["cfg"]), case["batch"], case["seq"], dev, case.get("amp", False),
                     case.get("compile"))
    step()  # warm-up: AdamW state, allocator pools, the compiled graphs
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(dev)
        return {"peak_mb": peak / 2**20, "step_mb": (peak - before) / 2**20, "method": "cuda max_memory_allocated"}
    got = rss_peak(step)
    if got is None:
        raise RuntimeError("/proc/self/clear_refs is not writable: cannot reset the RSS high-water mark")
    peak, before = got
    threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_", "default")
    return {"peak_mb": peak / 2**20, "step_mb": (peak - before) / 2**20,
            "method": f"VmHWM after clear_refs, MALLOC_MMAP_THRESHOLD_={threshold}"}


def start_subprocess(case: dict) -> subprocess.Popen:
    """Start ``measure_in_process(case)`` in a fresh interpreter with the mmap threshold set."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), OMP_NUM_THREADS=str(case.get("threads", 1)))
    return subprocess.Popen([sys.executable, "-m", "orchestrator.bench.peak_memory", json.dumps(case)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_subprocess(proc: subprocess.Popen, timeout: float = 900.0) -> dict:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker failed ({proc.returncode}): {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def measure_many(cases: list[dict], workers: int = 2) -> list[dict]:
    """One fresh subprocess per case, ``workers`` at a time (each reads its own high-water mark)."""
    results: list[dict | None] = [None] * len(cases)
    running: list[tuple[int, subprocess.Popen]] = []
    for i, case in enumerate(cases):
        if len(running) >= workers:
            j, proc = running.pop(0)
            results[j] = finish_subprocess(proc)
        running.append((i, start_subprocess(case)))
    for j, proc in running:
        results[j] = finish_subprocess(proc)
    return results  # type: ignore[return-value]


# -- bandwidth and traffic ----------------------------------------------------------------------
def measure_bandwidth(mb: int = 128, reps: int = 5) -> float:
    """Streaming bandwidth in GB/s (bytes read + written per second) of a ``mb`` MB tensor copy
    (best of ``reps``): DRAM for large sizes, cache for small ones."""
    n = mb * 2**20 // 4
    a = torch.ones(n)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best / 1e9


def routing_traffic(cfg: ModelConfig, batch: int, seq: int, elem: int = 4) -> int | None:
    """Bytes the routing reads and writes in one training step (forward and backward): the plan the
    buffer mixer runs, counted by ``lime_arch.routing.plan.step_traffic`` (the model the block
    chooser minimises). ``none`` moves nothing; the concatenation peer is not modelled (None)."""
    if cfg.routing_impl == "concat":
        return None
    with torch.device("meta"):
        router = build_router(cfg.router, n_layers=cfg.n_layers, n_kv_heads=cfg.kv_heads,
                              head_dim=cfg.head_dim, init="identity", options=cfg.router_dynamic, d_model=cfg.d_model)
    return kvplan.step_traffic(router, batch, seq, elem)[1]


if __name__ == "__main__":  # the subprocess worker: one case in, one JSON line out
    print(json.dumps(measure_in_process(json.loads(sys.argv[1]))))
