"""The peers table of ``lime bench --peers``: its section of ``bench.md`` and ``peers.csv`` (torch-free)."""
from __future__ import annotations

import csv
from pathlib import Path

PEER_FIELDS = ["shape", "library", "variant", "baseline", "counterpart", "step_ms", "ratio", "ratio_lo", "ratio_hi",
               "overhead_pct", "vs_ours", "saved_mb", "saved_ratio", "saved_vs_ours", "flop_overhead_pct", "flops",
               "counted_flops", "per_flop", "params", "reps", "note"]


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def write_peers_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=PEER_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def _ours(rows: list[dict], shape: str, label: str) -> dict | None:
    """This project's row ``label`` at ``shape`` (a peer's counterpart)."""
    return next((r for r in rows if r["shape"] == shape and r["library"] == "lime-sweeps" and r["variant"] == label
                 and r.get("ratio") is not None), None)


def peers_markdown(peers: dict) -> list[str]:
    """The section: the skip line if any, then one row per implementation and shape."""
    L = ["## Peers (`lime bench --peers`)", ""]
    if peers.get("skipped"):
        L += [peers["skipped"], ""]
    rows = peers.get("rows") or []
    if not rows:
        return L
    versions = ", ".join(f"{k} {v}" for k, v in peers.get("versions", {}).items())
    L += [f"The implementations a user would pick instead ({versions}), timed in this process in the bench's "
          "paired, interleaved rounds, each against its own baseline: x-transformers' rows against its plain "
          "decoder at the same shape, the hyper-connections package's against this project's `none` decoder "
          "with the package's plain `Residual`, this project's against `none`. A library's `baseline` row is "
          "timed against `none`: its `ratio` is the ratio of baselines (`vs ours`, time; `saved vs ours`, "
          "memory). `overhead %` = ratio - 1 (median of per-round ratios, sign-test 95% CI); `saved MB` what one "
          "training forward keeps for backward (`lime_arch.saved`), `saved ratio` over the row's baseline; "
          "`FLOP %` the extra forward FLOPs (variant - baseline, counted by torch's FLOP counter for every "
          "row; analytic where a project row's mixing is invisible to it) over the analytic baseline's; "
          "`per FLOP` = overhead % / FLOP % (lower is "
          "better); `ours` the counterpart's overhead % and per FLOP from this project's rows above it.", "",
          "| shape | library | variant | baseline | step ms | ratio | 95% CI | overhead % | vs ours | saved MB | "
          "saved ratio | saved vs ours | FLOP % | per FLOP | counterpart | ours: overhead % | ours: per FLOP | "
          "rounds | note |",
          "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        if r.get("ratio") is None:
            L.append(f"| {r['shape']} | {r['library']} | {r['variant']} | - | - | - | - | - | - | - | - | - | - | - | "
                     f"{r.get('counterpart', '-')} | - | - | - | {r['note']} |")
            continue
        ours = _ours(rows, r["shape"], r["counterpart"]) if r["library"] != "lime-sweeps" else None
        L.append(f"| {r['shape']} | {r['library']} | {r['variant']} | {r['baseline']} | {r['step_ms']:.1f} | "
                 f"{r['ratio']:.3f} | {r['ratio_lo']:.3f}-{r['ratio_hi']:.3f} | {r['overhead_pct']:+.1f} | "
                 f"{r['vs_ours']:.3f} | {r['saved_mb']:.1f} | {r['saved_ratio']:.3f} | {r['saved_vs_ours']:.3f} | "
                 f"{r['flop_overhead_pct']:.2f} ({r['flops']}) | {_f(r.get('per_flop'), '{:.2f}')} | "
                 f"{r['counterpart']} | {_f(None if ours is None else ours['overhead_pct'], '{:+.1f}')} | "
                 f"{_f(None if ours is None else ours.get('per_flop'), '{:.2f}')} | {r['reps']} | {r['note'] or ''} |")
    return L + [""]
