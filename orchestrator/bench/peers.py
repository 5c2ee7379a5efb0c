"""``lime bench --peers``: the other implementations (``peer_models``) beside this project's, timed in the
bench's paired, interleaved rounds in the same process.

Per shape, three groups of cases, each a model with its own AdamW on the same batch; every round runs
each group as the bench runs a shape (``timing.paired_times``: every variant between two steps of the
group's baseline, the order rotating each round), the groups one after the other:
  - this project: ``none``, and beside it the project's rows the peers are compared with (the
    ``counterpart`` of each peer variant) and the two libraries' baselines, so ``vs ours`` (a library's
    baseline over ``none``) is paired like everything else;
  - x-transformers: its plain decoder, and beside it each of its variants;
  - hyper-connections: the ``none`` decoder with the package's plain ``Residual``, beside it the
    package's HC and mHC.
A row's ratio is the median over rounds of its step over the mean of its own baseline's neighbouring
steps, with the sign-test 95% interval (``timing.median_ci``); ``overhead %`` = ratio - 1. Memory: the
bytes one training forward keeps for backward (``lime_arch.saved``, the trainer's counter: autograd's
saved storages, each once, parameters left out, plus the routing's K/V buffers). FLOPs: every row's extra
forward FLOPs counted by ``torch.utils.flop_counter`` (matmul-class ops: the same counter for every
implementation, so the same mixing counts alike whichever library wrote it) as variant - baseline, over
the analytic baseline FLOPs (``lime_arch.accounting``); a project row whose mixing the counter cannot see
(elementwise only, or custom ops) takes its analytic overhead instead (``flops`` says which). ``per FLOP``
is time overhead per point of FLOP overhead (lower is better; blank below 0.05 FLOP points).

A variant the installed library cannot build or run at a shape (an option it lacks, an assertion of
its own) gets a row with the reason and no numbers.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

import torch
from torch.utils.flop_counter import FlopCounterMode

from lime_arch.accounting import flop_overhead, flops_per_token
from lime_arch.model import build_model
from lime_arch.saved import saved_activation_bytes
from orchestrator.bench import peer_models as pm
from orchestrator.bench.shapes import PEER_MAX_LAYERS, VOCAB, Shape
from orchestrator.bench.step import adamw, bench_cfg, clock, train_step
from orchestrator.bench.timing import median_ci, paired_times

OURS = "lime-sweeps"
BUILD_ERRORS = (AssertionError, TypeError, ValueError, RuntimeError, NotImplementedError)


def _label(library: str, name: str) -> str:
    return f"{library}: {name}"


class _Case:
    """One model, its optimizer, and what a forward keeps and computes."""

    def __init__(self, model, idx, device):
        self.model, self.idx, self.device = model, idx, device
        self.opt = adamw(model)
        self.params = sum(p.numel() for p in model.parameters())
        logits, self.saved = saved_activation_bytes(model, idx[:, :-1], exclude=model.parameters())
        del logits  # frees the graph (and the routing buffers) before the next case
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            model(idx[:, :-1])
        self.counted = fc.get_total_flops() / idx[:, :-1].numel()  # forward FLOPs per token, matmul-class ops

    def step(self) -> None:
        train_step(self.model, self.opt, self.idx, self.device, False)


def _ours(counterparts) -> list[str]:
    return list(dict.fromkeys(["none", *counterparts]))


def _build(shape: Shape, variants, device, seq: int, idx) -> tuple[dict, dict, dict]:
    """(cases by label, each label's own baseline label, reasons for the peer variants that did not build)."""
    cases, base, skipped = {}, {}, {}
    ours_none = _label(OURS, "none")
    for lab in _ours(v.counterpart for v in variants):
        torch.manual_seed(0)
        cases[_label(OURS, lab)] = _Case(build_model(bench_cfg(shape, lab, device, seq)).to(device), idx, device)
        base[_label(OURS, lab)] = ours_none
    for v in variants:
        lab = _label(v.library, v.name)
        lib_base = _label(v.library, (pm.XT_BASE if v.library == pm.XT else pm.HC_BASE).name)
        base[lab] = ours_none if lab == lib_base else lib_base
        built = base[lab] == ours_none or base[lab] in cases
        why = pm.unsupported(v) or (None if built else "its baseline did not build")
        if why is None:
            try:
                cases[lab] = _Case(pm.build(shape, v, VOCAB, seq, device), idx, device)
                cases[lab].step()  # a variant that cannot train at this shape says so here, not in the rounds
            except BUILD_ERRORS as e:
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no message'}"
        if why is not None:
            skipped[lab] = why
    return cases, base, skipped


def _groups(cases: dict, base: dict) -> list[tuple[str, list[str]]]:
    """(baseline, its variants) per group, this project's first (with the libraries' baselines in it)."""
    out: dict[str, list[str]] = defaultdict(list)
    for lab in cases:
        if base[lab] != lab and base[lab] in cases:
            out[base[lab]].append(lab)
    ours = _label(OURS, "none")
    return [(ours, out.pop(ours, []))] + list(out.items())


def interleaved(step, groups: list[tuple[str, list[str]]], rounds: int, clk) -> tuple[dict, dict]:
    """Each round, each group as ``paired_times`` runs a shape (one round, the variants' order rotated by
    the round number). Returns (step times per label, per-round ratios per label to its group's baseline)."""
    times, ratios = defaultdict(list), defaultdict(list)
    for r in range(rounds):
        for b, variants in groups:
            if not variants:
                continue
            k = r % len(variants)
            order = [b, *variants[k:], *variants[:k]]
            t, _, rs = paired_times(step, order, b, 1, clk)
            for lab in order:
                times[lab] += t[lab]
            for lab in variants:
                ratios[lab] += rs[lab]
    return times, ratios


def _row(shape: Shape, lab: str, cases: dict, base_lab: str, times, ratios, base_fl: float) -> dict:
    """One row: ``lab`` against its own baseline ``base_lab`` (``none`` for this project's rows and for the
    libraries' baselines, whose row is then the ratio of baselines)."""
    library, _, name = lab.partition(": ")
    ours_none, c = _label(OURS, "none"), cases[lab]
    # the library's baseline: this project's none, a library's own baseline row, or the row's baseline
    lib_base = ours_none if library == OURS else lab if base_lab == ours_none else base_lab
    own = ratios[lab] if lab != base_lab else [1.0]
    lo, hi = median_ci(own)
    ratio = statistics.median(own)
    flop_pct, source = 100 * (c.counted - cases[base_lab].counted) / base_fl, "counted"
    if library == OURS:
        seq = c.idx.shape[1] - 1
        analytic = 100 * flop_overhead(bench_cfg(shape, name, c.device, seq), seq)
        if flop_pct <= 0 < analytic:  # mixing the counter cannot see (elementwise, or custom ops): the formula's
            flop_pct, source = analytic, "analytic"
    overhead = 100 * (ratio - 1)
    variant = next((v for v in pm.VARIANTS if _label(v.library, v.name) == lab), None)
    return {"shape": shape.name, "library": library, "variant": name, "baseline": base_lab if lab != base_lab else "-",
            "counterpart": variant.counterpart if variant is not None else "-",
            "step_ms": 1e3 * statistics.median(times[lab]), "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi,
            "overhead_pct": overhead,
            "vs_ours": statistics.median(ratios[lib_base]) if lib_base != ours_none else 1.0,
            "saved_mb": c.saved / 2**20, "saved_ratio": c.saved / cases[base_lab].saved,
            "saved_vs_ours": cases[lib_base].saved / cases[ours_none].saved,
            "flop_overhead_pct": flop_pct, "flops": source, "counted_flops": c.counted,
            "per_flop": overhead / flop_pct if flop_pct >= 0.05 else None, "params": c.params, "reps": len(own),
            "note": ""}


def _skipped_row(shape: Shape, lab: str, why: str) -> dict:
    library, _, name = lab.partition(": ")
    variant = next(v for v in pm.VARIANTS if _label(v.library, v.name) == lab)
    return {"shape": shape.name, "library": library, "variant": name, "baseline": "-",
            "counterpart": variant.counterpart, "note": f"not comparable: {why}"}


def peer_shapes(shapes) -> list[Shape]:
    return [sh for sh in shapes if sh.n_layers <= PEER_MAX_LAYERS]


def run_peers(shapes, device, threads: int, batch: int, seq: int, rounds: dict[str, int], warmup: int = 2) -> dict:
    """The peers table at each of ``shapes`` with at most ``PEER_MAX_LAYERS`` layers, ``rounds[shape name]``
    interleaved rounds each. Returns ``{"rows": [...], "versions": {...}, "skipped": line}``: ``line`` (None
    when nothing is left out) the one line that says what is skipped and why (a library of the extra not
    installed: its rows; neither, or no such shape: the whole table)."""
    gone = pm.missing()
    line = None if not gone else (f"peers: {' and '.join(gone)} not installed (pip install '.[peers]'): "
                                  f"{'no peers table' if len(gone) == len(pm.LIBRARIES) else 'its rows skipped'}")
    variants = [v for v in pm.VARIANTS if v.library not in gone]
    todo = peer_shapes(shapes)
    if not todo:
        line = f"peers: no shape of this run has at most {PEER_MAX_LAYERS} layers: no peers table"
    if not variants or not todo:
        return {"rows": [], "versions": {}, "skipped": line}
    clk, _ = clock(device, threads)
    rows = []
    for sh in todo:
        idx = torch.randint(0, VOCAB, (batch, seq + 1), device=device)
        cases, base, skipped = _build(sh, variants, device, seq, idx)
        for _ in range(warmup):
            for c in cases.values():
                c.step()
        times, ratios = interleaved(lambda lab, cs=cases: cs[lab].step(), _groups(cases, base), rounds.get(sh.name, 1),
                                    clk)
        base_fl = flops_per_token(bench_cfg(sh, "none", device, seq), seq)["base"]
        rows += [_row(sh, lab, cases, base[lab], times, ratios, base_fl) for lab in cases]
        rows += [_skipped_row(sh, lab, why) for lab, why in skipped.items()]
        cases.clear()  # this shape's models and optimizer states, before the next shape's are built
    return {"rows": rows, "versions": {d: pm.version(d) for d in pm.LIBRARIES if d not in gone}, "skipped": line}
