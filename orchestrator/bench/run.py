"""``python -m orchestrator.bench.run``: step time, peak memory, FLOPs and decode speed of every router.

For every router and shape the benchmark measures, against the ``none`` baseline of the same
shape and in the same process:
- the training step time (forward, backward, AdamW step; median over interleaved repetitions),
- the peak memory of the step (``bench_mem``: fresh subprocess per case on CPU),
- the analytic forward FLOPs per token and routing overhead (``lime_arch.accounting``),
- the bytes the routing moves per step and the time that takes at the measured bandwidth,
the same figures for the naive peer (full routing with ``routing_impl="concat"``: the paper's
concatenation), and the decode speed (KV-cache generation) of none, full and first-4.

Method (documented in the output too):
- Shapes: the deep config (``preset("deep32")``: width 256, FFN 1024, 8 heads) at 16 layers
  (MHA and GQA with 2 KV heads), 64 and 128 layers; batch 2 x 64 tokens. Vocabulary 2,048, not
  GPT-2's 50,257: at width 256 a 50k head would be 43% of the 16-layer model's FLOPs and 44% of
  its parameters (AdamW time), hiding the routing behind the LM head; with 2,048 the head is
  ~3% (the 1B models' is ~9%), so the ratios measure routing against the transformer body.
- Interleaving: all variants of a shape share one decoder body (same weights; each variant
  brings its own router and AdamW param groups, the body's optimizer state is shared) and are
  stepped round-robin, the order rotating every round; the ratio is the median over rounds of
  (variant time / none time in the same round), robust to the machine's load drifting.
- Clock: on CPU with one thread, the thread's CPU time (``time.thread_time``: CPU autograd runs
  on the calling thread), which a loaded shared machine disturbs far less than wall time; the
  wall-clock median is reported too. With more threads, and on CUDA (synchronized), wall time.
- CPU runs fp32 with one thread by default (OpenMP barriers under oversubscription make
  multi-threaded timings meaningless on a shared 2-core box); CUDA runs bf16 autocast with
  flash-attn when installed.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lime_arch.accounting import flops_per_token, routing_overhead
from lime_arch.config import ModelConfig, preset
from lime_arch.errors import ConfigError
from lime_arch.model import KVCache, build_model
from lime_arch.optim import param_groups
from lime_arch.routers import build_router, parse_router
from orchestrator.bench import memory as bench_mem
from orchestrator.bench.alone import time_alone

ROUTERS = ("none", "full", "first-4", "last-4", "dilated-8", "no-head-mix", "per-dim", "average")
PEER = "full/concat"  # label of the naive reference: full routing, the paper's concatenation
VOCAB, BATCH, SEQ = 2048, 2, 64
QUICK_BATCH, QUICK_SEQ = 1, 16
DECODE_ROUTERS, DECODE_BATCHES = ("none", "full", "first-4"), (1, 8)
TARGETS = {"decode": {"full": 0.90, "first-4": 0.95}, "mem_full_64": 1.03, "vs_peer": 0.5}


@dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    n_kv_heads: int
    reps: int


SHAPES = (Shape("L16-MHA", 16, 8, 20), Shape("L16-GQA", 16, 2, 20), Shape("L64-MHA", 64, 8, 10),
          Shape("L128-MHA", 128, 8, 7))
QUICK_SHAPES = (Shape("L3-MHA", 3, 8, 1), Shape("L3-GQA", 3, 2, 1))


def steady_malloc() -> bool:
    """Keep freed memory in glibc's heap (no trimming, no per-tensor mmap) in this process.

    With glibc's defaults the heap is trimmed and big tensors are fresh mappings, so a step
    page-faults on tens of MB it freed a moment ago; on the dev VM that is ~6 us per 4 KiB page
    and adds random +-5% to every variant. This is what tcmalloc/jemalloc give PyTorch on CPU;
    it affects every variant alike. Returns False where mallopt is unavailable."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        m_trim, m_mmap = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
        return bool(libc.mallopt(m_mmap, 1 << 30)) and bool(libc.mallopt(m_trim, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def _device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def bench_cfg(shape: Shape, label: str, device: torch.device, seq: int = SEQ, vocab: int = VOCAB) -> ModelConfig:
    router, _, impl = label.partition("/")
    attn = "flash" if device.type == "cuda" else "sdpa"
    return preset("deep32", n_layers=shape.n_layers, n_kv_heads=shape.n_kv_heads, router=router,
                  routing_impl=impl or "buffer", vocab_size=vocab, max_seq_len=seq, attn_impl=attn)


def _autocast(device: torch.device, amp: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if amp and device.type == "cuda" else nullcontext()


def _train_step(model, opt, idx, device, amp) -> None:
    with _autocast(device, amp):
        logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _adamw(model):
    """AdamW with lime_arch's parameter groups; the fused kernel where this torch has it. The
    for-loop implementation costs ~1 ms of Python per parameter tensor on the dev CPU, so every
    router weight matrix (one per layer) would add optimizer time unrelated to routing."""
    groups = param_groups(model, lr=1e-4, weight_decay=0.1)
    try:
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8)


def make_step(cfg: ModelConfig, batch: int, seq: int, device: torch.device, amp: bool):
    """A standalone model, optimizer and batch: ``step()`` runs one training step (memory worker)."""
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    opt = _adamw(model)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
    return lambda: _train_step(model, opt, idx, device, amp)


def _clock(device: torch.device, threads: int):
    if device.type == "cuda":
        def cuda_clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()
        return cuda_clock, "wall (CUDA synchronized)"
    if threads == 1:
        return time.thread_time, "thread CPU time"
    return time.perf_counter, "wall"


class _SharedBody:
    """All variants of one shape on one decoder body; each brings its router and optimizer."""

    def __init__(self, shape: Shape, labels, device, amp, batch, seq):
        torch.manual_seed(0)
        self.device, self.amp = device, amp
        self.cfgs = {lab: bench_cfg(shape, lab, device, seq) for lab in labels}
        self.model = build_model(self.cfgs[labels[0]]).to(device)
        self.routers = {lab: build_router(c.router, n_layers=c.n_layers, n_kv_heads=c.kv_heads, head_dim=c.head_dim,
                                          init=c.router_init).to(device) for lab, c in self.cfgs.items()}
        self.body = [p for n, p in self.model.named_parameters() if not n.startswith("router.")]
        self.opts: dict[str, torch.optim.Optimizer] = {}
        self.state: dict | None = None
        self.idx = torch.randint(0, VOCAB, (batch, seq + 1), device=device)

    def step(self, label: str) -> None:
        m = self.model
        m.router, m.cfg = self.routers[label], self.cfgs[label]
        if label not in self.opts:
            opt = self.opts[label] = _adamw(m)
            if self.state is not None:  # share the body's AdamW state (memory; values are irrelevant)
                for p in self.body:
                    opt.state[p] = self.state[p]
        _train_step(m, self.opts[label], self.idx, self.device, self.amp)
        if self.state is None:
            self.state = {p: self.opts[label].state[p] for p in self.body}


def median_ci(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics (j, k) with
    P(j <= Binomial(n, 1/2) < k) >= level (the sign-test interval); the range when n is small."""
    x, n = sorted(xs), len(xs)
    cdf, acc = [], 0.0
    for i in range(n + 1):
        acc += math.comb(n, i) / 2 ** n
        cdf.append(acc)
    # P(X <= j) <= (1 - level) / 2 gives [x_(j+1), x_(n-j)] (1-based); too few samples: the range
    j = max([i for i in range(n) if cdf[i] <= (1 - level) / 2] or [0])
    return x[j], x[n - 1 - j]


def paired_times(step, labels, base: str, reps: int, clock, on_step=None) -> tuple[dict, dict, dict]:
    """Time ``step(label)`` with every variant between two ``base`` steps: base, v1, base, v2, base,
    ... (variant order rotating each round). A variant's ratio is its time over the mean of the
    two base steps around it, which cancels the machine's drift (on the dev VM the same matmul
    runs 15% faster or slower for seconds at a time). Returns (times, walls, ratios) per label."""
    variants = [lab for lab in labels if lab != base]
    times = {lab: [] for lab in labels}
    walls = {lab: [] for lab in labels}
    ratios = {lab: [] for lab in variants}

    def one(lab):
        w0, t0 = time.perf_counter(), clock()
        step(lab)
        dt = clock() - t0
        times[lab].append(dt)
        walls[lab].append(time.perf_counter() - w0)
        if on_step is not None:
            on_step(lab)
        return dt

    for r in range(reps):
        k = r % len(variants) if variants else 0
        prev = one(base)
        for lab in variants[k:] + variants[:k]:
            t = one(lab)
            nxt = one(base)
            ratios[lab].append(t / (0.5 * (prev + nxt)))
            prev = nxt
    ratios[base] = [1.0] * reps
    return times, walls, ratios


def time_shape(shape: Shape, labels, device, threads, amp=False, batch=BATCH, seq=SEQ, warmup=2,
               hwm: bool = False) -> dict:
    """Per label: CPU/wall step times and paired ratios to none (``paired_times``).
    ``hwm``: also the resident high-water mark of one step per label, in this process (the quick
    run's cheap stand-in for the per-case subprocess)."""
    clock, _ = _clock(device, threads)
    sb = _SharedBody(shape, list(labels), device, amp, batch, seq)
    for _ in range(warmup):
        for lab in labels:
            sb.step(lab)
    peaks: dict[str, dict] = {}
    step = sb.step
    if hwm and device.type == "cpu":
        def step(lab):  # noqa: F811 - the measuring variant of sb.step
            got = bench_mem.rss_peak(lambda: sb.step(lab))
            if got is not None:
                peaks.setdefault(lab, {"peak_mb": got[0] / 2**20, "step_mb": (got[0] - got[1]) / 2**20,
                                       "method": "VmHWM of one step in the benchmark process (quick run)"})
    times, walls, ratios = paired_times(step, list(labels), "none", shape.reps, clock)
    out = {}
    for lab, t in times.items():
        lo, hi = median_ci(ratios[lab])
        out[lab] = {"step_ms": 1e3 * statistics.median(t), "wall_ms": 1e3 * statistics.median(walls[lab]),
                    "ratio": statistics.median(ratios[lab]), "ratio_lo": lo, "ratio_hi": hi,
                    "ratio_min": min(t) / min(times["none"]), "reps": len(ratios[lab]), "_peak": peaks.get(lab)}
    return out


def time_decode(shape: Shape, device, amp, reps: int, prompt: int, new: int) -> list[dict]:
    """Tokens/s of greedy KV-cache decoding for none, full and first-4. Every model prefills the
    same prompt, then decodes one token per call (``model(next, cache)``, argmax: what
    ``generate`` runs), interleaved token by token and paired like training (a variant's token
    between two of none's), so drift over seconds cancels. Positions cycle through
    [prompt, prompt + new), so every model decodes at the same context lengths. ``reps`` rounds."""
    clock, _ = _clock(device, torch.get_num_threads())
    models = {}
    for lab in DECODE_ROUTERS:
        torch.manual_seed(0)
        models[lab] = build_model(bench_cfg(shape, lab, device, seq=prompt + new)).to(device).eval()
    rows = []
    for B in DECODE_BATCHES:
        idx = torch.randint(0, VOCAB, (B, prompt), device=device)
        state = {}
        with torch.no_grad(), _autocast(device, amp):
            for lab, m in models.items():
                dtype = torch.bfloat16 if amp and device.type == "cuda" else next(m.parameters()).dtype
                cache = KVCache(m.cfg, B, prompt + new, device, dtype)
                state[lab] = [cache, m(idx, cache)[:, -1].argmax(-1, keepdim=True)]

            def step(lab, state=state):
                cache, tok = state[lab]
                if cache.pos >= prompt + new:
                    cache.pos = prompt
                state[lab][1] = models[lab](tok, cache)[:, -1].argmax(-1, keepdim=True)

            for lab in models:  # warm-up
                step(lab)
            times, _, ratios = paired_times(step, list(models), "none", reps, clock)
        for lab in models:
            kv = state[lab][0].nbytes()
            inv = [1 / r for r in ratios[lab]]
            lo, hi = median_ci(inv)
            rows.append({"router": lab, "shape": shape.name, "batch": B, "new_tokens": len(times[lab]),
                         "tok_s": B / statistics.median(times[lab]), "ratio": statistics.median(inv),
                         "ratio_lo": lo, "ratio_hi": hi, "reps": len(inv), "kv_bytes": kv})
    return rows


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


def run_bench(out_dir: str | os.PathLike = "results/bench", quick: bool = False, *, device: str | None = None,
              threads: int | None = 1, shapes: tuple[Shape, ...] | None = None, routers=ROUTERS,
              memory: bool = True, decode: bool = True) -> dict:
    """Run the benchmark, write ``bench.md``, ``bench.csv`` and ``decode.csv`` under ``out_dir``.

    Returns ``{"paths": [...], "rows": [...], "decode": [...], "checks": [...], "machine": {...}}``.
    ``quick``: tiny shapes, one repetition, memory in-process except one subprocess case."""
    from orchestrator.bench.outputs import checks, write_outputs  # noqa: PLC0415 - keeps this module short

    t_start = time.perf_counter()
    dev = _device(device)
    if threads and dev.type == "cpu":
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    amp = dev.type == "cuda"
    shapes = shapes or (QUICK_SHAPES if quick else SHAPES)
    batch, seq = (QUICK_BATCH, QUICK_SEQ) if quick else (BATCH, SEQ)
    labels = list(dict.fromkeys(["none", *routers, PEER]))
    malloc = steady_malloc() if dev.type == "cpu" and not quick else False
    load0 = os.getloadavg()
    bw = bench_mem.measure_bandwidth(32 if quick else 256)
    rows = []
    first_case = {"cfg": bench_cfg(shapes[0], "none", dev, seq).to_dict(), "batch": batch, "seq": seq,
                  "threads": threads, "device": dev.type, "amp": amp}
    sub = bench_mem.start_subprocess(first_case) if memory and quick else None  # overlaps the timing
    for sh in shapes:
        if quick:
            sh = Shape(sh.name, sh.n_layers, sh.n_kv_heads, 1)
        timed = time_shape(sh, labels, dev, threads, amp, batch, seq,
                           warmup=1 if quick or sh.n_layers >= 64 else 2, hwm=quick and memory)
        base_ms = timed["none"]["step_ms"]
        cfgs = {lab: bench_cfg(sh, lab, dev, seq) for lab in labels}
        alone = time_alone(cfgs, batch, seq, dev, 1 if quick else max(3, 160 // sh.n_layers), _clock(dev, threads)[0])
        for lab, cfg in cfgs.items():
            fl = flops_per_token(cfg, seq)
            # at DRAM bandwidth: between writing a slot and reading it the layers' weights (4 MB per
            # layer at width 256) pass through the caches
            traffic = bench_mem.routing_traffic(cfg, batch, seq, 2 if amp else 4)
            floor_ms = None if traffic is None else 1e3 * traffic / (bw * 1e9)
            rows.append({"router": lab.split("/")[0], "impl": "concat" if lab == PEER else "buffer",
                         "label": lab, "shape": sh.name, "n_layers": sh.n_layers, "kv_heads": sh.n_kv_heads,
                         **timed[lab], "overhead_pct": 100 * (timed[lab]["ratio"] - 1),
                         "flop_overhead_pct": 100 * routing_overhead(cfg, seq), "flops_per_token": fl["total"],
                         "alone_pct": 100 * 1e3 * alone[lab] / base_ms,
                         "routing_gflops": 3 * fl["routing"] * batch * seq / alone[lab] / 1e9 if alone[lab] else None,
                         "body_gflops": 3 * fl["base"] * batch * seq / (base_ms / 1e3) / 1e9,
                         "routing_mb": None if traffic is None else traffic / 2**20, "bw_gbs": bw,
                         "bw_floor_pct": None if floor_ms is None else 100 * floor_ms / base_ms, "cfg": cfg})
    if memory:
        if quick:  # in-process high-water marks; the subprocess path once, for the first none
            mems = [r.pop("_peak") or bench_mem.measure_in_process(
                {"cfg": r["cfg"].to_dict(), "batch": batch, "seq": seq, "threads": threads, "device": dev.type})
                for r in rows]
            for r, m in zip(rows, mems):
                r.update(peak_mb=m["peak_mb"], step_mb=m["step_mb"], mem_method=m["method"])
            rows[0]["subprocess_peak_mb"] = bench_mem.finish_subprocess(sub)["peak_mb"]
        else:
            cases = [{"cfg": r["cfg"].to_dict(), "batch": batch, "seq": seq, "threads": threads,
                      "device": dev.type, "amp": amp} for r in rows]
            for r, m in zip(rows, bench_mem.measure_many(cases, workers=1 if dev.type == "cuda" else 2)):
                r.update(peak_mb=m["peak_mb"], step_mb=m["step_mb"], mem_method=m["method"])
        for row in rows:
            base = next(r for r in rows if r["shape"] == row["shape"] and r["label"] == "none")
            row["mem_ratio"] = row["peak_mb"] / base["peak_mb"]
    for row in rows:
        row.pop("_peak", None)
    dec = []
    if decode:
        sh = shapes[0]
        dec = time_decode(sh, dev, amp, reps=2 if quick else 150, prompt=4 if quick else 16, new=4 if quick else 48)
    info = machine_info(dev, threads)
    info.update(bandwidth_gbs=bw, steady_malloc=malloc, load_start=load0, load_end=os.getloadavg(),
                clock=_clock(dev, threads)[1], batch=batch, seq=seq, vocab=VOCAB, quick=quick,
                seconds=time.perf_counter() - t_start)
    chk = checks(rows, dec)
    paths = write_outputs(Path(out_dir), rows, dec, chk, info)
    for row in rows:
        row.pop("cfg")
    return {"paths": [str(p) for p in paths], "rows": rows, "decode": dec, "checks": chk, "machine": info}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by ``python -m orchestrator.bench.run`` and ``lime bench``)."""
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one repetition (a smoke test)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1; see lime_arch/bench.py)")
    ap.add_argument("--shapes", help="comma-separated subset of " + ",".join(s.name for s in SHAPES + QUICK_SHAPES))
    ap.add_argument("--routers", help="comma-separated routers (default: " + ",".join(ROUTERS) + ")")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode timing")


def options(a: argparse.Namespace) -> dict:
    """Checked keyword arguments of ``run_bench``; a bad value raises one ConfigError line."""
    by = {s.name: s for s in SHAPES + QUICK_SHAPES}
    shapes = None
    if a.shapes:
        bad = [n for n in a.shapes.split(",") if n not in by]
        if bad:
            raise ConfigError(f"bench.shapes: unknown {', '.join(bad)}; allowed: {', '.join(by)}")
        shapes = tuple(by[n] for n in a.shapes.split(","))
    routers = tuple(a.routers.split(",")) if a.routers else ROUTERS
    for r in routers:
        try:
            parse_router(r)
        except ConfigError as e:
            raise ConfigError(str(e).replace("model.router", "bench.routers", 1)) from None
    if a.device not in (None, "cpu", "cuda"):
        raise ConfigError(f"bench.device: {a.device!r}; allowed: cpu, cuda")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("bench.device: cuda requested but torch sees no CUDA device here")
    if a.threads is not None and a.threads < 1:
        raise ConfigError(f"bench.threads: must be >= 1, got {a.threads}")
    return {"out_dir": a.out, "quick": a.quick, "device": a.device, "threads": a.threads, "shapes": shapes,
            "routers": routers, "memory": not a.no_memory, "decode": not a.no_decode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.bench.run", description=__doc__.splitlines()[0])
    add_arguments(ap)
    try:
        kw = options(ap.parse_args(argv))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_summary(run_bench(**kw))
    return 0


def print_summary(out: dict) -> None:
    """The files written and the count of passed checks (both command lines)."""
    for p in out["paths"]:
        print(f"wrote {p}")
    n_ok = sum(c["ok"] for c in out["checks"])
    print(f"{n_ok}/{len(out['checks'])} checks pass; {out['machine']['seconds']:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
