"""The paper's results that shipped sweeps mirror, as data: what a report's "paper vs this run"
section and ``lime plan``'s default effect sizes compare against.

Source: Gerasimov et al., "You Do Not Fully Utilize Transformer's Representation Capacity"
(LIMe, arXiv 2502.09245): Tables 1, 6, 12, 14, 15, 16-17, Figure 6, the router learning-rate
sweep, and the synthetic tasks (AET at 6 operands, ProsQA). Each ``PaperRef`` holds the paper's
rows (a label, the axis values that stand for it in a sweep, its value), the kind of number
(perplexity, loss, accuracy or benchmark score, which fixes the better direction) and, where the
paper measured it, the cost vs the baseline (params, step time, memory in %). The first row is
the baseline. ``claim`` marks results that are not a table: ``"depth"`` (Figure 6) and
``"no-effect"`` (the router-LR sweep).

A sweep names its reference with ``report.paper`` (parent param ``sweep.report.paper``); without
it the shipped sweep names map to theirs (``SWEEP_REFS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.core.fmt import norm_value

LOWER_BETTER = ("ppl", "loss")


@dataclass(frozen=True)
class PaperRow:
    label: str
    aliases: tuple[str, ...]  # axis values (lower case) that stand for this row in a sweep
    value: float | None = None
    cost: dict[str, float] = field(default_factory=dict)  # step_time / peak_mem / params: % vs baseline


@dataclass(frozen=True)
class PaperRef:
    key: str
    title: str  # "Table 12"
    setting: str  # scale and data of the paper's runs
    kind: str  # "ppl", "loss", "accuracy" (%), "score" (%)
    rows: tuple[PaperRow, ...] = ()
    claim: str = "table"  # "table", "depth" or "no-effect"
    statement: str = ""  # the finding in words

    @property
    def lower_is_better(self) -> bool:
        return self.kind in LOWER_BETTER

    def match(self, value: Any) -> PaperRow | None:
        """The paper row an axis value stands for, or None."""
        v = str(norm_value(value)).lower()
        return next((r for r in self.rows if v in r.aliases), None)


def _pct(x: float, base: float) -> float:
    return 100.0 * (x - base) / base


LLAMA = ("none", "llama", "baseline")
FULL = ("full", "lime", "lime-full")
DF, HC, RES = ("denseformer", "dwa"), ("hc", "hyper-connections", "hyperconnections"), ("resformer", "value-residual")
_T15_MS = {"none": 70.21, "full": 80.85, "dilated-8": 71.59, "dilated-16": 71.57, "first-7": 71.79, "first-15": 72.69}
_T15_MB = {"none": 2054.26, "full": 2062.38, "dilated-8": 2055.38, "dilated-16": 2054.88, "first-7": 2054.85,
           "first-15": 2055.76}


def _t15(name: str, aliases: tuple[str, ...], ppl: float) -> PaperRow:
    return PaperRow(name, aliases, ppl, {"step_time": _pct(_T15_MS[name], _T15_MS["none"]),
                                         "peak_mem": _pct(_T15_MB[name], _T15_MB["none"])})


REFS: dict[str, PaperRef] = {r.key: r for r in (
    PaperRef("table1", "Table 1 (with Tables 16-17 for the cost)",
             "1B parameters, GQA, FineWeb-Edu ~42B tokens; LM Eval Harness 3-shot, average of 7 tasks", "score", (
                 PaperRow("LLaMA", LLAMA, 50.29),
                 PaperRow("DenseFormer", DF, 50.62, {"params": 0.00, "step_time": 14.08, "peak_mem": 4.85}),
                 PaperRow("Hyper-Connections", HC, 52.22, {"params": 0.03, "step_time": 23.16, "peak_mem": 0.03}),
                 PaperRow("LIMe", FULL, 54.21, {"params": 0.00, "step_time": 1.16, "peak_mem": 0.00})),
             statement="LIMe > Hyper-Connections > DenseFormer >= LLaMA; LIMe adds ~1% step time (GQA)"),
    PaperRef("table6", "Table 6", "matched 360M (SmolLM2 architecture), 200B tokens; LightEval mean", "score", (
        PaperRow("baseline", LLAMA, 44.19), PaperRow("Hyper-Connections", HC, 44.56),
        PaperRow("ResFormer", RES, 44.42), PaperRow("LIMe first-4", ("first-4", "lime-first-4"), 44.72),
        PaperRow("LIMe full", FULL, 45.09))),
    PaperRef("table12", "Table 12", "150M parameters, FineWeb-Edu; validation perplexity", "ppl", (
        PaperRow("LLaMA", LLAMA, 16.4611), PaperRow("average", ("average",), 16.4611),
        PaperRow("last-2", ("last-2",), 16.2810), PaperRow("last-4", ("last-4",), 16.1675),
        PaperRow("last-6", ("last-6",), 16.1351), PaperRow("first-2", ("first-2",), 15.9746),
        PaperRow("first-4", ("first-4", "lime-first-4"), 15.9586), PaperRow("first-6", ("first-6",), 15.9906),
        PaperRow("full", FULL, 15.9267))),
    PaperRef("table14", "Table 14", "150M parameters, FineWeb-Edu; validation loss", "loss", (
        PaperRow("LLaMA", LLAMA, 2.80043), PaperRow("full", FULL, 2.76889),
        PaperRow("no-head-mix", ("no-head-mix",), 2.83235), PaperRow("per-dim", ("per-dim",), 2.77911)),
             statement="no-head-mix is worse than the baseline"),
    PaperRef("table15", "Table 15", "128 layers (hidden 256, FFN 1024, 8 heads), FineWeb-Edu; perplexity", "ppl", (
        _t15("none", LLAMA, 23.73), _t15("full", FULL, 20.72), _t15("dilated-8", ("dilated-8",), 21.61),
        _t15("dilated-16", ("dilated-16",), 21.84), _t15("first-7", ("first-7",), 20.55),
        _t15("first-15", ("first-15",), 20.50))),
    PaperRef("fig6", "Figure 6", "32, 64 and 128 layers (hidden 256, FFN 1024, 8 heads, 5,000 steps); loss",
             "loss", (PaperRow("LLaMA", LLAMA), PaperRow("LIMe", FULL)), claim="depth",
             statement="LIMe wins at every depth, its advantage grows with depth, and 64-layer LIMe beats "
                       "128-layer LLaMA"),
    PaperRef("router-lr", "the router learning-rate sweep",
             "135M parameters, 4B tokens, 5 seeds, router LR multipliers 1-4; loss", "loss", claim="no-effect",
             statement="no significant effect of the router LR multiplier (Kruskal-Wallis p = 0.06564)"),
    PaperRef("aet", "the arithmetic-expression task (AET)", "4-layer models, 6-operand expressions; accuracy (%)",
             "accuracy", (PaperRow("LLaMA", LLAMA, 41.3), PaperRow("LIMe", FULL, 71.6))),
    PaperRef("prosqa", "ProsQA", "150M models, ~18k training sequences, 10 epochs; accuracy (%)", "accuracy", (
        PaperRow("LLaMA", LLAMA, 69.4), PaperRow("ResFormer", RES, 73.0),
        PaperRow("Hyper-Connections", HC, 76.4), PaperRow("LIMe", FULL, 77.8))),
)}

# Shipped sweep -> reference. `default` compares none, full and first-4: Table 12 is the table
# with all three at 150M (Table 14 has no first-4; its none -> full step, 2.800 -> 2.769, is the
# same ~1.1% in loss as Table 12's).
SWEEP_REFS = {
    "router-ablation-150m": "table12", "router-structure-150m": "table14", "deep-routing-128": "table15",
    "depth-scaling": "fig6", "router-lr": "router-lr", "aet": "aet", "prosqa-150m": "prosqa",
    "prosqa": "prosqa", "default": "table12", "peers": "table1", "paper-main-1b": "table1",
    "peers-360m": "table6",
}


def reference_for(sweep: str, paper: str | None = None) -> PaperRef | None:
    """The sweep's reference: ``report.paper`` when given (ConfigError for an unknown name; "none"
    for no reference), else from the sweep's name (a ``-cpu`` miniature maps as its twin)."""
    if paper is not None:
        if str(paper).lower() == "none":
            return None
        if paper not in REFS:
            raise ConfigError(f"report.paper: unknown paper reference {paper!r}; known: {', '.join(REFS)}, none")
        return REFS[paper]
    key = SWEEP_REFS.get(sweep) or SWEEP_REFS.get(sweep.removesuffix("-cpu"))
    return REFS[key] if key else None


def metric_kind(metric: str) -> str | None:
    m = metric.lower()
    if "ppl" in m or "perplexity" in m:
        return "ppl"
    if "loss" in m:
        return "loss"
    if "acc" in m or "exact" in m:
        return "accuracy"
    return "score" if "score" in m else None


def in_metric(value: float, kind: str, metric: str) -> float | None:
    """A paper value in the sweep metric's units (perplexity <-> loss by log/exp, % -> fraction),
    or None when the two measure different things."""
    target = metric_kind(metric)
    if target == kind and kind in LOWER_BETTER:
        return value
    if (kind, target) == ("ppl", "loss"):
        return math.log(value)
    if (kind, target) == ("loss", "ppl"):
        return math.exp(value)
    if kind in ("accuracy", "score") and target == kind:
        return value / 100.0
    return None


def paper_effects(ref: PaperRef, metric: str) -> tuple[float | None, dict[str, float]]:
    """The paper's baseline level and each row's relative change vs the baseline, both in the
    sweep metric's units (empty when the paper's numbers do not convert to that metric)."""
    rows = [r for r in ref.rows if r.value is not None]
    if not rows:
        return None, {}
    base = in_metric(rows[0].value, ref.kind, metric)
    if base is None or base == 0:
        return None, {}
    return base, {r.label: (in_metric(r.value, ref.kind, metric) - base) / abs(base) for r in rows[1:]}
