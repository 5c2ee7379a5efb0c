"""Paired timing of training steps and decode tokens against the ``none`` baseline.

Every variant's step runs between two ``none`` steps (none, v1, none, v2, none, ..., the order
rotating each round); a variant's ratio is its time over the mean of the two ``none`` steps
around it, which cancels the machine's drift (on the dev VM the same matmul runs 15% faster or
slower for seconds at a time). The reported ratio is the median over rounds, with the
distribution-free (sign-test) confidence interval of that median; with a stopping rule
(``stopping``), rounds are added only until each row's interval decides its target, and the
interval is the anytime-valid sign confidence sequence.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from lime_arch.model import KVCache, build_model
from orchestrator.bench.peak_memory import rss_peak
from orchestrator.bench.shapes import BATCH, DECODE_BATCHES, DECODE_ROUTERS, SEQ, VOCAB, Shape
from orchestrator.bench.step import SharedBody, autocast, bench_cfg, clock
from orchestrator.bench.stopping import Stopping


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


def paired_times(step, labels, base: str, reps: int, clock, on_step=None, done=None) -> tuple[dict, dict, dict]:
    """Time ``step(label)`` with every variant between two ``base`` steps: base, v1, base, v2, base,
    ... (variant order rotating each round). A variant's ratio is its time over the mean of the
    two base steps around it. ``done(label, ratios)``: whether a variant stops before the next
    round (``stopping.Stopping.done``); the others go on, at most ``reps`` rounds, and the run ends
    when none is left. Returns (times, walls, ratios) per label; ``ratios[base]`` has one 1.0 per round."""
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

    rounds = 0
    for r in range(reps):
        active = [lab for lab in variants if done is None or not done(lab, ratios[lab])]
        if variants and not active:
            break
        k = r % len(active) if active else 0
        prev = one(base)
        for lab in active[k:] + active[:k]:
            t = one(lab)
            nxt = one(base)
            ratios[lab].append(t / (0.5 * (prev + nxt)))
            prev = nxt
        rounds += 1
    ratios[base] = [1.0] * rounds
    return times, walls, ratios


def _hwm_step(sb: SharedBody, peaks: dict[str, dict]):
    """``sb.step`` that also records the resident high-water mark of each label's first step."""
    def step(lab):
        got = rss_peak(lambda: sb.step(lab))
        if got is not None:
            peaks.setdefault(lab, {"peak_mb": got[0] / 2**20, "step_mb": (got[0] - got[1]) / 2**20,
                                   "method": "VmHWM of one step in the benchmark process (quick run)"})
    return step


def time_shape(shape: Shape, labels, device, threads, amp=False, batch=BATCH, seq=SEQ, warmup=2,
               hwm: bool = False, compile_mode: str | None = None, rule: Stopping | None = None,
               targets: dict[str, float | None] | None = None) -> dict:
    """Per label: CPU/wall step times and paired ratios to none (``paired_times``).
    ``hwm``: also the resident high-water mark of one step per label, in this process (the quick
    run's cheap stand-in for the per-case subprocess), under the key ``_peak``. ``compile_mode``:
    every variant (none included) compiled that way; the warm-up steps compile. ``rule``: rounds
    added only until each label's interval decides its ratio target (``targets``, None: no target)
    or is narrow enough, at most ``rule.cap`` (``stopping``), and the interval reported is the
    anytime-valid sign confidence sequence; without: ``shape.reps`` rounds and the fixed-n
    sign-test interval."""
    clk, _ = clock(device, threads)
    sb = SharedBody(shape, list(labels), device, amp, batch, seq, compile_mode)
    for _ in range(warmup):
        for lab in labels:
            sb.step(lab)
    peaks: dict[str, dict] = {}
    step = _hwm_step(sb, peaks) if hwm and device.type == "cpu" else sb.step
    targets = targets or {}
    done = None if rule is None else (lambda lab, rs: rule.done(rs, targets.get(lab)))
    times, walls, ratios = paired_times(step, list(labels), "none", shape.reps if rule is None else rule.cap,
                                        clk, done=done)
    out = {}
    for lab, t in times.items():
        lo, hi = median_ci(ratios[lab]) if rule is None or lab == "none" else rule.interval(ratios[lab])
        out[lab] = {"step_ms": 1e3 * statistics.median(t), "wall_ms": 1e3 * statistics.median(walls[lab]),
                    "ratio": statistics.median(ratios[lab]), "ratio_lo": lo, "ratio_hi": hi,
                    "ratio_min": min(t) / min(times["none"]), "reps": len(ratios[lab]), "_peak": peaks.get(lab),
                    "decided": "-" if rule is None else rule.side(ratios[lab], targets.get(lab))}
    return out


def _decode_models(shape: Shape, device, ctx: int) -> dict:
    models = {}
    for lab in DECODE_ROUTERS:
        torch.manual_seed(0)
        models[lab] = build_model(bench_cfg(shape, lab, device, seq=ctx)).to(device).eval()
    return models


def _decode_batch(models: dict, B: int, device, amp, reps: int, prompt: int, new: int, clk) -> list[dict]:
    """Prefill the same prompt in every model, then time paired single-token decode steps."""
    idx = torch.randint(0, VOCAB, (B, prompt), device=device)
    state = {}
    with torch.no_grad(), autocast(device, amp):
        for lab, m in models.items():
            dtype = torch.bfloat16 if amp and device.type == "cuda" else next(m.parameters()).dtype
            cache = KVCache(m.cfg, B, prompt + new, device, dtype)
            state[lab] = [cache, m(idx, cache)[:, -1].argmax(-1, keepdim=True)]

        def step(lab):
            cache, tok = state[lab]
            if cache.pos >= prompt + new:
                cache.pos = prompt
            state[lab][1] = models[lab](tok, cache)[:, -1].argmax(-1, keepdim=True)

        for lab in models:  # warm-up
            step(lab)
        times, _, ratios = paired_times(step, list(models), "none", reps, clk)
    rows = []
    for lab in models:
        inv = [1 / r for r in ratios[lab]]
        lo, hi = median_ci(inv)
        rows.append({"router": lab, "batch": B, "new_tokens": len(times[lab]),
                     "tok_s": B / statistics.median(times[lab]), "ratio": statistics.median(inv),
                     "ratio_lo": lo, "ratio_hi": hi, "reps": len(inv), "kv_bytes": state[lab][0].nbytes()})
    return rows


def time_decode(shape: Shape, device, amp, reps: int, prompt: int, new: int) -> list[dict]:
    """Tokens/s of greedy KV-cache decoding for none, full and first-4. Every model prefills the
    same prompt, then decodes one token per call (``model(next, cache)``, argmax: what
    ``generate`` runs), interleaved token by token and paired like training (a variant's token
    between two of none's), so drift over seconds cancels. Positions cycle through
    [prompt, prompt + new), so every model decodes at the same context lengths. ``reps`` rounds."""
    clk, _ = clock(device, torch.get_num_threads())
    models = _decode_models(shape, device, prompt + new)
    rows = []
    for B in DECODE_BATCHES:
        for row in _decode_batch(models, B, device, amp, reps, prompt, new, clk):
            rows.append({"router": row.pop("router"), "shape": shape.name, **row})
    return rows
