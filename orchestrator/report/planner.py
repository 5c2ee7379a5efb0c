"""The seed planner: what a sweep design can show before it runs (``lime plan``, and the same
reachability block in ``lime sweep run --dry-run``). Torch-free; it takes plain numbers.

For the file's seeds per arm and number of comparisons with the baseline it gives the smallest
p each of the report's tests can reach (raw and after Holm) and warns, one line each, when a
design cannot reach significance. Given a spread (``sigma``: the standard deviation of the
per-seed paired differences variant - baseline, in the metric's units; or read from a pilot
sweep's finished runs) and an effect (relative, as a fraction of the metric's level, or
absolute), it gives the seeds per arm for the wanted power, by seeded simulation of the very
tests the report runs, with Holm over the comparisons (``orchestrator.report.stats.power``).

Default effects: the paper's change for each variant where the sweep mirrors a paper table
(``orchestrator.report.paper.refs``, converted to the sweep's metric), else 1% of the metric's level
(the pilot's baseline mean, else the paper's baseline value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.core import tracking
from orchestrator.core.fmt import cell_text, num, same_value
from orchestrator.report.compare import across_seeds, by_seed, verdicts
from orchestrator.report.paper.refs import PaperRef, paper_effects
from orchestrator.report.runs import add_key_columns, collect_runs, find_runs
from orchestrator.report.settings import choose, from_parent_run
from orchestrator.report.stats import power
from orchestrator.report.stats.paired import friedman_min_p, kruskal_min_p, mann_whitney_min_p

DEFAULT_RELATIVE = 0.01


@dataclass(frozen=True)
class Design:
    """A sweep's comparison in numbers: what the planner needs and nothing else."""

    name: str
    metric: str
    axis: str
    baseline: Any
    variants: tuple  # every value of the axis, the baseline included
    seeds: int  # seeds per arm
    alpha: float = 0.05
    mode: str | None = None
    paper: PaperRef | None = None

    @property
    def comparisons(self) -> int:
        return max(1, len(self.variants) - 1)

    @property
    def direction(self) -> str:
        return verdicts.metric_mode(self.metric, self.mode)


def _yes(p: float, alpha: float) -> str:
    return "yes" if p < alpha else "NO"


def reachability(d: Design) -> list[str]:
    """The smallest reachable p of each test at the design's seeds, with warnings (fast)."""
    n, m, k, a = d.seeds, d.comparisons, len(d.variants), d.alpha
    paired = 2.0 / 2**n if n else 1.0
    mwu = mann_whitney_min_p(n, n)
    lines = [f"plan: {k} values of {d.axis} x {n} seed(s), baseline {cell_text(d.baseline)}, {m} comparison(s) "
             f"with the baseline (Holm), alpha {a:g}, {d.metric} ({verdicts.direction_words(d.direction)})",
             f"  {'smallest reachable p at ' + str(n) + ' seeds per arm':<41} {'raw':<10} {'Holm x' + str(m):<10} "
             "below alpha"]
    rows = [("paired permutation (the verdicts)", paired, min(1.0, m * paired)),
            ("Wilcoxon signed-rank (paired)", paired, min(1.0, m * paired)),
            ("Mann-Whitney (unpaired)", mwu, min(1.0, m * mwu))]
    if k >= 3:
        rows += [(f"Friedman (paired omnibus, {k} variants)", friedman_min_p(n, k, 9999), None),
                 (f"Kruskal-Wallis (omnibus, {k} variants)",
                  kruskal_min_p(n, k, 9999) if n < 5 else kruskal_min_p(n, k), None)]
    for label, raw, holm in rows:
        shown = "-" if holm is None else num(holm, 3)
        lines.append(f"  {label:<41} {num(raw, 3):<10} {shown:<10} {_yes(raw if holm is None else holm, a)}")
    if m * paired >= a:
        need = verdicts.min_seeds_to_decide(m, a)
        lines.append(f"WARNING: no verdict can be 'better' or 'worse' at {n} seeds: the smallest Holm-adjusted "
                     f"paired p is {num(min(1.0, m * paired), 3)} >= {a:g}; {m} comparison(s) need at least "
                     f"{need} seeds per arm")
    if m * mwu >= a:
        lines.append(f"WARNING: the unpaired Mann-Whitney tests cannot reach p < {a:g} after Holm at {n} seeds")
    if k >= 3 and friedman_min_p(n, k, 9999) >= a:
        lines.append(f"WARNING: Friedman cannot reach p < {a:g} with {n} seeds and {k} variants")
    return lines


def plan_block(name: str, metric: str, axis: str, baseline: Any, variants: list, seeds: int,
               alpha: float = 0.05, mode: str | None = None, paper: PaperRef | None = None) -> str:
    """The reachability block of a loaded sweep's numbers (the dry run prints it)."""
    return "\n".join(reachability(Design(name, metric, axis, baseline, tuple(variants), seeds, alpha, mode, paper)))


@dataclass(frozen=True)
class Effect:
    label: str  # which comparison(s)
    relative: float | None  # fraction of the level (signed)
    absolute: float | None  # metric units (signed)
    source: str


def effects(d: Design, level: float | None, effect: float | None, delta: float | None) -> list[Effect]:
    """The effects to plan for: the user's, else the paper's per variant, else 1% of the level."""
    if delta is not None:
        return [Effect("every comparison", delta / level if level else None, delta, "--delta")]
    if effect is not None:
        return [Effect("every comparison", effect, effect * level if level else None, "--effect")]
    out = []
    if d.paper is not None:
        base, changes = paper_effects(d.paper, d.metric)
        level = level if level is not None else base
        for v in d.variants:
            row = d.paper.match(v)
            if same_value(v, d.baseline) or row is None or row.label not in changes:
                continue
            rel = changes[row.label]
            out.append(Effect(cell_text(v), rel, rel * level if level else None, f"paper: {d.paper.title}"))
    if not out:
        out = [Effect("every comparison", DEFAULT_RELATIVE, DEFAULT_RELATIVE * level if level else None,
                      "default: 1% of the level")]
    return out


def plan_text(d: Design, sigma: float | None = None, level: float | None = None, effect: float | None = None,
              delta: float | None = None, target: float = 0.8, spread_note: str = "",
              sims: int = power.SIMS, seed: int = 0) -> str:
    """The whole plan: reachability, the effects, and the seeds per arm each needs."""
    lines = reachability(d)
    m, a = d.comparisons, d.alpha
    if level is None and d.paper is not None:
        level = paper_effects(d.paper, d.metric)[0]
        spread_note = spread_note or (f"the paper's baseline, {d.paper.title}; --pilot gives this sweep's own"
                                      if level is not None else "")
    lines.append(f"level of {d.metric}: " + (f"{num(level, 4)}" if level is not None else "unknown")
                 + (f" ({spread_note})" if spread_note else ""))
    if sigma is None:
        lines.append("spread: not given. --sigma S (the sd of the per-seed paired differences variant - "
                     "baseline, in metric units) or --pilot SWEEP sizes the design; in units of that sd:")
        for dz in (0.5, 1.0, 2.0):
            n = power.seeds_needed(m, a, dz, target, sims=sims, seed=seed)
            lines.append(f"  d_z = {dz:g} (a mean difference of {dz:g} sd): "
                         + (f"{n} seeds per arm" if n else f"more than {power.MAX_SEEDS}"))
        return "\n".join(lines)
    lines.append(f"spread: sd of the per-seed paired differences = {num(sigma, 4)}; power {target:g}, "
                 f"{sims} simulated sweeps (seed {seed}), Holm over {m}, the other comparisons without effect")
    lines.append(f"  {'comparison':<22} {'effect':<22} {'d_z':<7} seeds (permutation)  seeds (Wilcoxon)  source")
    short = []
    for e in effects(d, level, effect, delta):
        if e.absolute is None:
            lines.append(f"  {e.label:<22} {_pct(e.relative):<22} unknown: the level of {d.metric} is unknown; "
                         "give --delta or --pilot")
            continue
        dz = abs(e.absolute) / sigma if sigma > 0 else math.inf
        n_perm = power.seeds_needed(m, a, dz, target, "permutation", sims, seed)
        n_wil = power.seeds_needed(m, a, dz, target, "wilcoxon", sims, seed)
        eff = f"{_pct(e.relative)} ({num(e.absolute, 3)})"
        lines.append(f"  {e.label:<22} {eff:<22} {num(dz, 3):<7} {_seeds(n_perm):<20} {_seeds(n_wil):<17} {e.source}")
        if n_perm is None or n_perm > d.seeds:
            short.append((e.label, power.power(d.seeds, m, a, dz, "permutation", sims, seed)))
    if short:
        lines.append(f"WARNING: {d.seeds} seeds per arm are too few for {len(short)} of these effects (power "
                     + ", ".join(f"{label} {p:.2f}" for label, p in short) + f"; wanted {target:g})")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:+.2f}%"


def _seeds(n: int | None) -> str:
    return str(n) if n is not None else f"> {power.MAX_SEEDS} (or no effect)"


def pilot(name: str, metric: str) -> tuple[float, float, str]:
    """(sd of the per-seed paired differences, the baseline's mean, a note) from the finished
    runs of a pilot sweep in MLflow, compared as its own report would (its parent run's axis
    and baseline). The sd pools the comparisons: the root mean square of their sds."""
    cl = tracking.client()
    found = find_runs(name, cl)
    settings, _ = from_parent_run(cl, found.parent, name)
    choice = choose(settings, metric=metric)
    data = collect_runs(found, metric, cl)
    add_key_columns(data.frame, [choice.axis] + choice.grid_cols)
    df = data.frame
    if metric not in df.columns:
        raise ConfigError(f"plan: --pilot {name}: no run logs {metric!r}")
    comp = across_seeds.compare(df, metric=metric, axis=choice.axis, baseline=choice.baseline)
    pa = by_seed.analyze(df, comp, ["seed"] + [c for c in choice.grid_cols if c != choice.axis])
    sds = [r.diff_sd for r in pa.rows if r.n >= 2 and math.isfinite(r.diff_sd)]
    if not pa.paired or not sds:
        raise ConfigError(f"plan: --pilot {name}: no variant shares 2 or more finished seeds with the baseline "
                          f"{choice.axis}={cell_text(choice.baseline)} ({pa.why.rstrip('.')})")
    sigma = math.sqrt(sum(s * s for s in sds) / len(sds))
    level = comp.group(comp.baseline).mean
    per = ", ".join(f"{cell_text(r.variant)} {num(r.diff_sd, 3)} (n={r.n})" for r in pa.rows if r.n >= 2)
    return sigma, level, (f"pilot {name}: the mean of {choice.axis}={cell_text(comp.baseline)}; "
                          f"sd per comparison {per}")
