"""The benchmark's targets and verdicts (torch-free).

The project's acceptance targets for the buffer mixer, measured against ``none`` in the same
process:
- step time: overhead <= 1.5 x the analytic routing FLOP overhead + 1 point, per router and
  shape (the paper reports +1.16% for GQA and +10.49% for MHA at 1B, compiled: arXiv 2502.09245,
  Table 17);
- at 64 layers and more, full routing's overhead <= ``vs_peer`` x the naive concatenation's;
- peak memory of full routing at 64 layers <= ``mem_full_64`` x none's (Table 17: +0.00% / +0.01%);
- decode tokens/s >= ``decode[router]`` x none's (Table 18: first-4 decodes 2.9% to 8.8% slower),
  with KV-cache bytes equal to none's.
The peer architectures' rows (a depth mix over the none router: DenseFormer, Hyper-Connections)
have no target: they are measured, as the paper's Table 17 reports them (verdict ``peer``).
A failed step-time row is ``kernel-bound`` when the routing alone (outside the model) already
costs more than the target, ``bandwidth-bound`` when its memory traffic at the measured bandwidth
does.
"""
from __future__ import annotations

TARGETS = {"decode": {"full": 0.90, "first-4": 0.95}, "mem_full_64": 1.03, "vs_peer": 0.5}


def step_target(row: dict) -> float | None:
    """The step-time overhead target (percent) of a row; None for the baseline and the peers."""
    if row["impl"] == "concat" or row["router"] == "none" or _is_depth_mix(row):
        return None
    return 1.5 * row["flop_overhead_pct"] + 1.0


def _is_depth_mix(row: dict) -> bool:
    return row.get("depth_mix", "none") != "none"


def _where(r: dict) -> str:
    """``L64-MHA``, or ``L64-MHA compiled (default)`` for a compiled row."""
    mode = r.get("compile", "eager")
    return r["shape"] if mode == "eager" else f"{r['shape']} compiled ({mode})"


def _verdict(r: dict, t: float) -> str:
    if r["overhead_pct"] <= t:
        return "pass"
    if r.get("alone_pct") is not None and r["alone_pct"] > t:
        return "fail: kernel-bound"
    if r.get("bw_floor_pct") is not None and r["bw_floor_pct"] > t:
        return "fail: bandwidth-bound"
    return "fail"


def _step_checks(rows: list[dict]) -> list[dict]:
    """Annotate every row with ``target_pct`` and ``verdict``; one check per routed row."""
    out = []
    for r in rows:
        t = r["target_pct"] = step_target(r)
        if t is None:
            r["verdict"] = "peer" if r["impl"] == "concat" or _is_depth_mix(r) else "baseline"
            continue
        r["verdict"] = _verdict(r, t)
        out.append({"check": f"step time {r['router']} @ {_where(r)}", "value": r["overhead_pct"], "target": t,
                    "ok": r["overhead_pct"] <= t, "note": r["verdict"]})
    return out


def _deep_checks(rows: list[dict]) -> list[dict]:
    """Full routing at depth: against the naive peer (>= 64 layers) and its peak memory (64)."""
    out = []
    for r in rows:
        if r["router"] != "full" or r["impl"] != "buffer":
            continue
        if r["n_layers"] >= 64:
            peer = next((p for p in rows if p["shape"] == r["shape"] and p["impl"] == "concat"
                         and p.get("compile") == r.get("compile")), None)
            if peer is not None:
                lim = TARGETS["vs_peer"] * peer["overhead_pct"]
                out.append({"check": f"full vs naive concat @ {_where(r)}", "value": r["overhead_pct"],
                            "target": lim, "ok": r["overhead_pct"] <= lim,
                            "note": f"naive overhead {peer['overhead_pct']:.1f}%"})
        if r["n_layers"] == 64 and "mem_ratio" in r:
            lim = TARGETS["mem_full_64"]
            out.append({"check": f"peak memory full @ {_where(r)}", "value": r["mem_ratio"], "target": lim,
                        "ok": r["mem_ratio"] <= lim, "note": f"{r['peak_mb']:.0f} MB"})
    return out


def _decode_checks(dec: list[dict]) -> list[dict]:
    out = []
    for d in dec:
        base = next(b for b in dec if b["batch"] == d["batch"] and b["router"] == "none")
        lim = TARGETS["decode"].get(d["router"])
        if lim is not None:
            out.append({"check": f"decode {d['router']} batch {d['batch']}", "value": d["ratio"], "target": lim,
                        "ok": d["ratio"] >= lim, "note": f"{d['tok_s']:.1f} tok/s"})
        if d["router"] != "none":
            out.append({"check": f"KV-cache bytes {d['router']} batch {d['batch']}", "value": d["kv_bytes"],
                        "target": base["kv_bytes"], "ok": d["kv_bytes"] == base["kv_bytes"], "note": ""})
    return out


def checks(rows: list[dict], dec: list[dict]) -> list[dict]:
    """Annotate rows with target and verdict; return the checks against the targets above."""
    return _step_checks(rows) + _deep_checks(rows) + _decode_checks(dec)
