"""The benchmark's files: ``bench.md`` (tables and method), ``bench.csv`` (one row per router, impl
and shape), ``decode.csv`` (one row per decode router and batch), with ``--peers`` ``peers.csv``."""
from __future__ import annotations

import csv
from pathlib import Path

from orchestrator.bench.peer_table import peers_markdown, write_peers_csv

CSV_FIELDS = ["router", "impl", "depth_mix", "compile", "shape", "n_layers", "kv_heads", "step_ms", "wall_ms", "ratio",
              "ratio_lo", "ratio_hi", "ratio_min", "overhead_pct", "flop_overhead_pct", "target_pct", "verdict",
              "decided", "peak_mb", "mem_ratio", "step_mb", "flops_per_token", "alone_pct", "routing_gflops",
              "step_gflops", "gemm_pct", "roofline_gflops", "body_gflops",
              "routing_mb", "bw_gbs", "bw_floor_pct", "kept_mb", "transient_mb", "static_twin", "reps"]
DECODE_FIELDS = ["router", "shape", "batch", "new_tokens", "tok_s", "ratio", "ratio_lo", "ratio_hi", "reps",
                 "kv_bytes"]


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def write_outputs(out: Path, rows: list[dict], dec: list[dict], chk: list[dict], info: dict,
                  peers: dict | None = None) -> list[Path]:
    """``peers``: ``peers.run_peers``'s result (``lime bench --peers``), its section in bench.md."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.md", out / "bench.csv", out / "decode.csv"]
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(paths[2], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=DECODE_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(dec)
    if peers is not None and peers["rows"]:
        paths.append(write_peers_csv(out / "peers.csv", peers["rows"]))
    paths[0].write_text(_markdown(rows, dec, chk, info, peers))
    return paths


def _machine(info: dict) -> list[str]:
    L = ["| machine | |", "|---|---|"]
    for k in ("platform", "cpu", "cpu_count", "gpu", "torch", "threads", "device", "dtype", "clock"):
        L.append(f"| {k} | {info[k]} |")
    L.append(f"| memory bandwidth (256 MB copy, read+write) | {info['bandwidth_gbs']:.1f} GB/s |")
    L.append(f"| glibc malloc kept steady (mallopt) | {info.get('steady_malloc')} |")
    L.append(f"| load average at start / end | {', '.join(f'{x:.1f}' for x in info['load_start'])} / "
             f"{', '.join(f'{x:.1f}' for x in info['load_end'])} |")
    L.append(f"| batch x sequence, vocab | {info['batch']} x {info['seq']}, {info['vocab']} |")
    L.append(f"| torch.compile rows | {info.get('compile', 'none')} at {info.get('compile_shapes', '-')} |")
    if info.get("gemm_gflops"):
        L.append(f"| large GEMM (512^3 fp32 matmul, same threads) | {info['gemm_gflops']:.1f} GFLOP/s |")
    L.append(f"| paired rounds (cap per shape; rows stop once decided) | {info.get('rounds', 'fixed')} |")
    L.append(f"| run time | {info['seconds']:.0f} s |")
    return L


def _method(info: dict) -> str:
    return ("Method: all variants of a shape share one decoder body; every variant step runs between two "
            "`none` steps (none, v1, none, v2, none, ..., the order rotating each round), and `ratio` is the "
            "median over rounds of the variant's time over the mean of the two `none` steps around it, "
            f"measured with the {info['clock']} clock (pairing cancels this VM's drift: the same matmul runs "
            "+-15% for seconds at a time); `95% CI` is the distribution-free (sign-test) interval of that "
            "median; `step ms` and `wall ms` are medians. `FLOP %` is "
            f"`flop_overhead` (forward routing and depth-mix FLOPs over the baseline's, seq {info['seq']}); "
            "target = 1.5 x FLOP % + 1. "
            "`peak MB`: peak resident memory of one step after a warm-up step, fresh subprocess per case "
            "(see `orchestrator/bench/peak_memory.py`). `ratio (min)`: fastest variant step / fastest none step. "
            "`routing MB` "
            "is the traffic of the routing's products and copies per step; `bw floor %` the time that traffic "
            "takes at the measured memory bandwidth (between writing a slot and reading it, the layers' weights "
            "pass through the caches), as a share of `none`'s step. `alone %`: the routing's forward and backward "
            "outside the model (same shapes, minus `none`'s), as a share of `none`'s step; `routing GFLOP/s`: "
            "3 x its forward FLOPs over that time (a direct timing of the routing ops), `% GEMM` that rate over the "
            "large GEMM's in the same run, `in-step GFLOP/s` the routing's and depth mix's training FLOPs over "
            "their time inside the step (none's step x (ratio - 1), paired); `roofline GFLOP/s` (csv) is the "
            "rate at which the routing's traffic alone would take all its time at the measured bandwidth, "
            "capped at the GEMM's. `rounds`: paired rounds timed; unless the run asked for fixed rounds a row "
            "stops once the sign confidence sequence of its median ratio (anytime-valid, 95%) lies on one "
            "side of its target (`decided`: meets / misses; `undecided` at the cap) or, without a target, "
            "is at most 0.04 wide, and `95% CI` is that sequence. "
            "Rows with a `depth mix` are the paper's peer architectures over the none router (Table 17: "
            "DenseFormer, Hyper-Connections), without a target; their `FLOP %` is the depth mix's own FLOPs. "
            "Optimizer: AdamW with lime_arch's parameter groups, fused kernel. "
            "`compile`: `eager`, or the torch.compile mode of the model's forward (Inductor; `lime bench "
            "--compile MODE`), every variant and its `none` compiled alike: the paper's Table 17 setting. "
            "Compiled, the routing runs as opaque custom ops (the same kernels as eager), so `alone %` is "
            "the eager routing's time over the compiled `none` step.")


def _step_table(rows: list[dict]) -> list[str]:
    L = ["## Training step (like the paper's Table 17)", "",
         "| router | depth mix | shape | impl | compile | step ms | wall ms | ratio | 95% CI | ratio (min) | "
         "overhead % | FLOP % | target % | verdict | decided | rounds | alone % | routing GFLOP/s | % GEMM | "
         "in-step GFLOP/s | peak MB | mem ratio | routing MB | bw floor % |",
         "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
         "---:|"]
    for r in rows:
        L.append(f"| {r['router']} | {r.get('depth_mix', 'none')} | {r['shape']} | {r['impl']} | "
                 f"{r.get('compile', 'eager')} | "
                 f"{r['step_ms']:.1f} | {r['wall_ms']:.1f} | "
                 f"{r['ratio']:.3f} | {r['ratio_lo']:.3f}-{r['ratio_hi']:.3f} | {r['ratio_min']:.3f} | "
                 f"{r['overhead_pct']:+.1f} | {r['flop_overhead_pct']:.2f} | "
                 f"{_f(r.get('target_pct'))} | {r['verdict']} | {r.get('decided', '-')} | {r.get('reps', '-')} | "
                 f"{_f(r.get('alone_pct'))} | {_f(r.get('routing_gflops'))} | {_f(r.get('gemm_pct'), '{:.0f}')} | "
                 f"{_f(r.get('step_gflops'))} | {_f(r.get('peak_mb'), '{:.0f}')} | "
                 f"{_f(r.get('mem_ratio'), '{:.3f}')} | {_f(r.get('routing_mb'), '{:.0f}')} | "
                 f"{_f(r.get('bw_floor_pct'))} |")
    return L


def _bound_notes(rows: list[dict]) -> list[str]:
    """Why a failed row cannot meet its target here: the kernels, or the memory bandwidth."""
    L = []
    kb = [r for r in rows if r.get("verdict") == "fail: kernel-bound"]
    if kb:
        L += ["", "Kernel-bound rows: the routing alone (its forward and backward on random K/V, outside the "
              "model, minus `none`'s; `orchestrator/bench/alone.py`) already costs more than the target, at the "
              "GFLOP/s its small products reach here (M = KV heads rows) against the whole step's:", ""]
        for r in kb:
            L.append(f"- {r['router']} @ {r['shape']} {r.get('compile', 'eager')}: alone {r['alone_pct']:.1f}% of "
                     f"none's step, routing at "
                     f"{_f(r.get('routing_gflops'))} GFLOP/s vs the step's {r['body_gflops']:.1f} > target "
                     f"{r['target_pct']:.1f}% (in the step: {r['overhead_pct']:+.1f}%).")
    bound = [r for r in rows if r.get("verdict") == "fail: bandwidth-bound"]
    if bound:
        L += ["", "Bandwidth-bound rows (the routing's traffic alone, at the measured memory bandwidth, "
              "exceeds the FLOP-based target):", ""]
        for r in bound:
            L.append(f"- {r['router']} @ {r['shape']} {r.get('compile', 'eager')}: {r['routing_mb']:.0f} MB/step at "
                     f"{r['bw_gbs']:.1f} GB/s -> "
                     f"{r['bw_floor_pct']:.1f}% of none's {r['step_ms']/r['ratio']:.0f} ms step "
                     f"> target {r['target_pct']:.1f}% (measured {r['overhead_pct']:+.1f}%).")
    return L


def _twin_table(rows: list[dict]) -> list[str]:
    """Token-dependent routers (dynamic) against the static router reading the same sources."""
    pairs = []
    for r in rows:
        twin = next((t for t in rows if r.get("static_twin") and t["label"] == r["static_twin"]
                     and t["shape"] == r["shape"] and t["compile"] == r["compile"]), None)
        if twin is not None:
            pairs.append((r, twin))
    if not pairs:
        return []
    L = ["", "## Token-dependent routers against the static router of the same sources", "",
         "What the per-token weights cost (arXiv 2502.09245, Appendix E; its first version's Table 6 compares "
         "static and dynamic LIMe): `step vs static` is the dynamic row's step-time ratio to `none` over the "
         "static row's, `peak vs static` the same for the measured peak memory; `kept MB` and `transient MB` "
         "are the analytic routing activations of a step (`lime_arch.accounting.routing_memory`: kept for "
         "backward, and the most held at once on top in backward), dynamic / static. The dynamic routing "
         "keeps no per-token weights for backward (each layer is recomputed there, one at a time), so its "
         "extra memory is the grouped queries plus one layer's (B, T, R, n) weights.", "",
         "| router | static | shape | compile | step vs static | peak vs static | FLOP % (dyn / static) | "
         "kept MB | transient MB |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r, t in pairs:
        m, mt = r.get("mem_ratio"), t.get("mem_ratio")
        mem = "-" if m is None or mt is None else f"{m / mt:.3f}"
        L.append(f"| {r['router']} | {t['router']} | {r['shape']} | {r['compile']} | {r['ratio'] / t['ratio']:.3f} | "
                 f"{mem} | {r['flop_overhead_pct']:.2f} / {t['flop_overhead_pct']:.2f} | "
                 f"{r['kept_mb']:.1f} / {t['kept_mb']:.1f} | {r['transient_mb']:.1f} / {t['transient_mb']:.1f} |")
    return L


def _checks_table(chk: list[dict]) -> list[str]:
    L = ["## Checks against the targets", "", "| check | value | target | ok | note |", "|---|---:|---:|---|---|"]
    for c in chk:
        ok = "yes" if c["ok"] else "NO"
        L.append(f"| {c['check']} | {c['value']:.3f} | {c['target']:.3f} | {ok} | {c['note']} |")
    n_ok = sum(c["ok"] for c in chk)
    return L + ["", f"{n_ok}/{len(chk)} checks pass.", ""]


def _decode_table(dec: list[dict]) -> list[str]:
    L = ["## Decode (greedy KV-cache generation)", "",
         "Prompt of 16 tokens, then greedy decoding one token per call (`model(next, cache)`, "
         "argmax), the models interleaved token by token: each variant's token between two of "
         "`none`'s. `ratio`: median over pairs of none's time per token over the router's; "
         "`tok/s`: batch / median time per token; positions cycle through the 48 after the prompt.", "",
         "| router | shape | batch | tokens timed | tok/s | ratio to none | 95% CI | KV-cache bytes |",
         "|---|---|---:|---:|---:|---:|---:|---:|"]
    for d in dec:
        L.append(f"| {d['router']} | {d['shape']} | {d['batch']} | {d['new_tokens']} | {d['tok_s']:.1f} | "
                 f"{d['ratio']:.3f} | {d['ratio_lo']:.3f}-{d['ratio_hi']:.3f} | {d['kv_bytes']} |")
    return L + [""]


def _markdown(rows, dec, chk, info, peers: dict | None = None) -> str:
    L = ["# LIMe routing benchmark: step time, memory, FLOPs, decode (vs `none`)", ""]
    if info.get("quick"):
        L += ["**Quick smoke run (tiny shapes, one repetition): the numbers mean nothing.**", ""]
    L += _machine(info)
    L += ["", _method(info), ""]
    L += _step_table(rows)
    L += _bound_notes(rows)
    L += _twin_table(rows)
    L += [""] + _checks_table(chk)
    if dec:
        L += _decode_table(dec)
    if peers is not None:
        L += peers_markdown(peers)
    return "\n".join(L)
