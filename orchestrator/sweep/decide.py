"""``lime sweep run FILE --until-decided`` (or a ``decide:`` block): seeds in waves until every
comparison with the baseline is decided, with anytime-valid error control.

The file's ``grid.seed`` is the first wave. After each wave the finished trials are read from MLflow
(``orchestrator.decide.runs``) and every comparison gets its confidence sequence
(``orchestrator.decide.waves``); a decided one (better, worse, equivalent within the margin) gets no
more seeds, the undecided ones and the baseline get ``decide.wave`` more, until ``max_seeds``. Each
wave is a seed growth of the sweep (``orchestrator.sweep.extend``: another Ray experiment under the
same MLflow parent run, its trials run concurrently by Ray Tune) restricted to those values, so the
trial set is no longer a full cross product; trial ids stay the grid's.

What survives a killed driver: the waves' seeds and values on the parent run (``sweep.seeds.extend-<k>``
and ``sweep.values.extend-<k>``, ``orchestrator.sweep.history``; cached in ``lime_sweep.json``: an
interrupted wave resumes first), and each look's decisions (``sweep.decide.wave-<k>``, with the
settings ``sweep.decide.*`` and the absolute margin ``sweep.decide.margin_abs``; a % margin is fixed
from the baseline's mean at the first look). The decisions are a function of the finished trials,
so the resumed loop reaches the same ones and continues where it was.

With ``decide.budget`` (or ``--budget``) each look also prices the undecided comparisons
(``orchestrator.decide.budget``) from the trials' measured wall times (``trial/wall_s``) and the
resources each holds; the budget is recorded as ``sweep.decide.budget``, and each look's record
carries what was spent and the comparisons it ended "inconclusive at budget" with their projections
(those stay ended when a killed driver resumes).
"""
from __future__ import annotations

import json
import math
from typing import Any

from lime_arch import ConfigError
from orchestrator.core import record
from orchestrator.core.tracking import client
from orchestrator.decide import budget as budgets
from orchestrator.decide import costs, reach
from orchestrator.decide.runs import seed_values, seed_walls
from orchestrator.decide.verdict import AT_BUDGET, margin_for, parse_margins
from orchestrator.decide.waves import Design, Wave, differences, run_waves
from orchestrator.sweep.blocks import with_options  # noqa: F401 - the flags' check lives torch-free
from orchestrator.sweep.checks import key_of
from orchestrator.sweep.driver import run_sweep
from orchestrator.sweep.mlflow_runs import budget_text
from orchestrator.sweep.schema import SweepSpec
from orchestrator.sweep.spec import estimate


def _compared(spec: SweepSpec) -> tuple[str, str, list, Any]:
    """(the compared grid axis, the seed axis, the axis' values, the baseline) as the file writes them."""
    axis = next(a for a in spec.grid if a == spec.report.axis or key_of(a) == key_of(spec.report.axis))
    return axis, spec.seed_axis(), list(spec.grid[axis]), spec.report.baseline


def _settings(cl, parent: str, spec: SweepSpec) -> dict[str, str]:
    """Record the design's settings on the parent when it lacks them (a sweep that ran with fixed seeds
    and now runs until decided); a parent's params cannot change, so a different value is refused."""
    from mlflow.entities import Param

    have = cl.get_run(parent).data.params
    margin = spec.decide.margin if spec.decide.margin is not None else spec.report.margin
    want = record.DecideRecord(max_seeds=spec.decide.max_seeds, wave=spec.decide.wave,
                               budget=budget_text(spec.decide)).to_params()
    if margin is not None:
        want[record.REPORT + "margin"] = margin
    clash = [f"{k} is {have[k]!r}, not {v!r}" for k, v in want.items() if k in have and have[k] != v]
    if clash:
        raise ConfigError(f"{spec.path or spec.name}: the sweep's parent run {parent} was recorded with other "
                          f"settings ({'; '.join(clash)}); a run's params cannot change: use them, or start the "
                          "sweep over (delete its Ray folder and MLflow experiment)")
    new = [Param(k, v) for k, v in want.items() if k not in have]
    if new:
        cl.log_batch(parent, params=new)
    return {**have, **want}


def _margin_abs(cl, parent: str, params: dict[str, str], spec: SweepSpec, baseline_values: dict) -> float | None:
    """The margin in metric units the waves use: recorded, else from the setting (a % of the
    baseline's mean over the seeds it finished so far), then recorded."""
    if record.DECIDE_MARGIN in params:
        v = record.cast_param(params[record.DECIDE_MARGIN])
        return None if v is None else float(v)
    m = margin_for(parse_margins(params.get(record.REPORT + "margin")), spec.report.metric, spec.report.metric)
    base = [x for x in baseline_values.values() if math.isfinite(x)]
    value = None if m is None else m.absolute(sum(base) / len(base) if base else math.nan)
    cl.log_param(parent, record.DECIDE_MARGIN, str(value))
    return value


def run_until_decided(spec: SweepSpec, *, address: str | None = None, results: str | None = None,
                      num_cpus: int | None = None, connect_timeout: float | None = None,
                      status_every: float = 15.0) -> dict:
    """Run the first wave (or resume an interrupted one), then wave after wave until decided; returns
    the last wave's sweep summary with ``waves`` (the decisions of each look)."""
    def sweep(**kw) -> dict:
        return run_sweep(spec, address=address, results=results, num_cpus=num_cpus, status_every=status_every,
                         connect_timeout=connect_timeout, **kw)

    summary = sweep()
    if summary["unfinished"]:  # a look reads whole waves only: an interrupted launch ends the loop
        return _interrupted(spec, summary, [])
    launch = summary["launch"]  # the first wave's (or the interrupted one's), with its parent run
    cl = client(launch.uri)
    parent, exp_id = launch.parent, launch.exp_id
    params = _settings(cl, parent, spec)
    axis, seed_axis, values, baseline = _compared(spec)

    def fetch():
        return seed_values(cl, exp_id, parent, axis, seed_axis, spec.report.metric, values)

    finished, _ = fetch()
    design = Design(baseline=baseline, variants=tuple(v for v in values if v != baseline), mode=spec.report.mode,
                    alpha=spec.report.alpha, margin=_margin_abs(cl, parent, params, spec, finished.get(baseline, {})),
                    max_seeds=spec.decide.max_seeds, wave=spec.decide.wave,
                    budget=costs.Budget.of(spec.decide.budget))
    meter = _meter(spec, cl, exp_id, parent, axis, seed_axis, values) if design.budget is not None else None

    def keep(wave: Wave) -> None:
        key = f"{record.DECIDE_WAVE}{wave.index}"
        if key not in cl.get_run(parent).data.params:
            cl.log_param(parent, key, json.dumps(wave.record(), sort_keys=True, separators=(",", ":")))
        print(f"sweep {spec.name}: look {wave.index}: " + ", ".join(
            f"{d.variant} {d.verdict.word} ({len(d.seeds)} seeds)" for d in wave.decisions)
            + (f"; next wave: seeds {wave.next_seeds} for {', '.join(map(str, wave.next_variants))}"
               if not wave.done else f"; done: {wave.why}"), flush=True)
        if wave.index == 1:  # said once, at the first look (a resumed driver said it before)
            open_ = {d.variant: differences(finished, d.variant, baseline)[1] for d in wave.decisions
                     if not d.decided}
            for line in reach.out_of_reach(open_, design.margin, design.family.level, design.max_seeds):
                print(f"sweep {spec.name}: look 1: {line}", flush=True)
        for line in _budget_lines(design, wave):
            print(f"sweep {spec.name}: look {wave.index}: {line}", flush=True)

    looks: list[Wave] = []

    def grow(variants: list, seeds: list) -> None:
        nonlocal summary
        summary = sweep(add_seeds=len(seeds), only=variants)
        if summary["unfinished"]:
            raise _Interrupted

    def kept(wave: Wave) -> None:
        looks.append(wave)
        keep(wave)

    try:
        waves = run_waves(fetch, grow, design, kept, first_index=1 + len(launch.extensions), meter=meter,
                          stopped=_stopped(params, values) if design.budget is not None else None)
    except _Interrupted:
        return _interrupted(spec, summary, looks)
    return {**summary, "waves": waves}


class _Interrupted(Exception):
    """A wave's launch ended with trials unfinished (Ctrl-C, Ray stopped the experiment)."""


def _interrupted(spec: SweepSpec, summary: dict, looks: list) -> dict:
    """No look at a wave in part: its decisions (and the next wave's seeds, the budget's spending) would
    read the trials that happened to finish, and a resumed driver would trust them. The rerun resumes
    the wave, then looks."""
    print(f"sweep {spec.name}: no look: the wave ended with {summary['unfinished']} trial(s) unfinished; run "
          "the same command again to finish the wave, then look", flush=True)
    return {**summary, "waves": looks}


def _meter(spec: SweepSpec, cl, exp_id: str, parent: str, axis: str, seed_axis: str, values: list):
    """``launched -> costs.Ledger``: the measured wall times of the sweep's trials, the cores and GPUs
    each holds, and each compared value's planned training FLOPs (the dry run's estimate: the hours
    of a value none of whose trials has a measured time yet, ``costs.measure``)."""
    res = spec.resources
    first = spec.grid[seed_axis][0]
    flops = {v: float(estimate(spec.config_of({axis: v, seed_axis: first}))["train_flops"]) for v in values}

    def meter(launched: dict) -> costs.Ledger:
        walls = seed_walls(cl, exp_id, parent, axis, seed_axis, values)
        return costs.measure(launched, walls, res.cpu * res.workers, res.gpu * res.workers, flops)
    return meter


def _stopped(params: dict[str, str], values: list) -> dict:
    """The comparisons an earlier look ended inconclusive at budget (a resumed driver keeps them ended)."""
    by_text, out = {str(v): v for v in values}, {}
    for text in record.decide_waves(params).values():
        try:
            ended = json.loads(text).get("ended") or {}
        except (ValueError, AttributeError):
            continue
        out.update({by_text[k]: budgets.Projection.from_record(p) for k, p in ended.items() if k in by_text})
    return out


def _budget_lines(design: Design, wave: Wave) -> list[str]:
    """What a look says about the budget: what was spent, what the next wave costs, and each comparison
    that ended inconclusive at budget with its projection."""
    if design.budget is None or wave.spent is None:
        return []
    units = tuple(dict.fromkeys(("trials", "core_hours", *design.budget.units)))
    head = f"budget {design.budget.text()}: spent {wave.spent.text(units)}"
    if wave.next_cost is not None:
        head += f"; the next wave costs {wave.next_cost.text(units)}"
    return ([head] + [f"{v}: {p.text(units, design.budget.units)}" for v, p in wave.projected.items()
                      if v not in wave.ended] + [f"{v}: {AT_BUDGET}: {p.text(units, design.budget.units)}"
                                                 for v, p in wave.ended.items()])
