"""``throughput.json`` beside a report: the measurement ``lime report --throughput`` made, read again by
later reports of the same sweep.

The file holds the format, the sweep, when and where it was measured (the machine, the commit, the
load average before and after, the threads, the clock, the rounds), every measured shape by its
hash (``shapes``) and per pair of shapes the step-time ratios of its rounds (variant / the mean of
the two baseline steps around it, as ``lime bench`` pairs them) and the median step times. A report
uses it only when every comparison that needs a measurement finds its two hashes in it, and the
sweep is the same: a file measured for other models or shapes (the sweep grew a variant, a config
changed) is **stale** and refused with one line, never partly used.
"""
from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

FILE = "throughput.json"
FORMAT = "lime-throughput/1"
MEASURED_KEYS = ("machine", "commit", "load_before", "load_after", "threads", "clock", "rounds", "warmup", "seconds")


def save(path: Path, sweep: str, shapes: dict[str, dict], measured: dict[str, Any]) -> None:
    """Write the measurement (``orchestrator.bench.throughput.measure``'s answer) with its shapes."""
    used = {h for p in measured["pairs"] for h in (p["baseline"], p["variant"])}
    doc = {"format": FORMAT, "sweep": sweep,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **{k: measured.get(k) for k in MEASURED_KEYS},
           "shapes": {h: shapes[h] for h in sorted(used)}, "pairs": measured["pairs"]}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _ratios(p: Any) -> list[float] | None:
    r = p.get("ratios") if isinstance(p, dict) else None
    if not isinstance(r, list) or not r:
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in r):
        return None
    return [float(x) for x in r]


def load(path: Path, sweep: str, pairs: list[tuple[str, str]]) -> tuple[dict, dict, str]:
    """(pair -> its entry, the file's measurement record, why it is not used: "" when it is).
    A missing file gives ({}, {}, "") : not measured."""
    if not path.is_file():
        return {}, {}, ""
    again = f"`lime report {sweep} --throughput` measures again"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {}, {}, f"{FILE} cannot be read ({type(e).__name__}); {again}"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        return {}, {}, f"{FILE} is not a measurement this code reads (format {got!r}, expected {FORMAT!r}); {again}"
    if doc.get("sweep") != sweep:
        return {}, {}, f"{FILE} is stale: it was measured for sweep {doc.get('sweep')!r}, not {sweep!r}; {again}"
    entries = {}
    for p in doc.get("pairs") or []:
        if isinstance(p, dict) and _ratios(p) is not None:
            entries[(p.get("baseline"), p.get("variant"))] = {**p, "ratios": _ratios(p)}
    missing = [p for p in pairs if p not in entries]
    if missing:
        b, v = missing[0]
        return {}, {}, (f"{FILE} is stale: {len(missing)} of the {len(pairs)} pairs of models this report compares "
                        f"are not in it at their model/shape hash (e.g. baseline {b} and variant {v}): the sweep's "
                        f"models or shapes changed since it was measured ({doc.get('created', '?')}); {again}")
    return entries, {k: doc.get(k) for k in ("created", *MEASURED_KEYS)}, ""
