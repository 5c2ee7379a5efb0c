"""The seed planner: what a sweep design can show before it runs (``lime plan``, and the same
reachability block in ``lime sweep run --dry-run``). Torch-free; it takes plain numbers.

For the file's seeds per arm and number of comparisons with the baseline it says from how many
seeds the verdict's interval at the family's Bonferroni level can be finite (and the confidence
sequence of ``--until-decided``), the smallest p of the supporting tests, and warns, one line each,
when a design cannot decide anything. Given each comparison's spread (the sd of its per-seed
differences variant - baseline) and an effect, it gives per comparison the seeds a fixed design needs
(the verdict rule's power by seeded simulation, ``orchestrator.report.stats.verdict_power``) and the
mean seeds the sequential design uses.

The spread comes from the sweep's own data by default (its finished MLflow runs, else its committed
``results/<name>/summary.csv``), from ``--pilot SWEEP`` (a pilot or a named earlier sweep), or
``--sigma``; an estimated sd is replaced by its one-sided 90% upper confidence bound (chi-square),
since planning with the point estimate under-sizes about half the time. Without any data the plan is
in units of the sd, and it says so.

Default effects: the paper's change for each variant where the sweep mirrors a paper table
(``orchestrator.report.paper.refs``, converted to the sweep's metric), else 1% of the metric's level
(this sweep's baseline mean; the paper's baseline value only when the sweep has no data, and the
output says that it is the paper's).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats as sps

from lime_arch.errors import ConfigError
from orchestrator.core import tracking
from orchestrator.core.fmt import cell_text, num, same_value
from orchestrator.decide.signs import min_seeds
from orchestrator.report.compare import across_seeds, by_seed, verdicts
from orchestrator.report.paper.refs import PaperRef, paper_effects
from orchestrator.report.runs import add_key_columns, collect_runs, find_runs
from orchestrator.report.settings import choose, from_parent_run
from orchestrator.report.stats import power, verdict_power
from orchestrator.report.stats.paired import friedman_min_p, kruskal_min_p, mann_whitney_min_p
from orchestrator.report.stats.verdict_power import sequential_seeds, verdict_seeds

DEFAULT_RELATIVE = 0.01
SD_CONFIDENCE = 0.9  # the one-sided upper confidence bound of a spread that plans use


def sd_upper(sd: float, n: int, confidence: float = SD_CONFIDENCE) -> float:
    """The one-sided upper confidence bound of a normal sd estimated from n values (chi-square):
    planning with the point estimate under-sizes half the time."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return sd * math.sqrt((n - 1) / sps.chi2.ppf(1.0 - confidence, n - 1))


def relative_effect(ref: PaperRef | None, metric: str, variant: Any) -> tuple[float, str]:
    """The planner's default effect of one comparison: the paper's change where the sweep mirrors a
    paper table, else 1% of the level."""
    if ref is not None:
        _, changes = paper_effects(ref, metric)
        row = ref.match(variant)
        if row is not None and row.label in changes:
            return changes[row.label], f"the paper's change ({ref.title})"
    return DEFAULT_RELATIVE, "1% of the baseline's mean"


@dataclass(frozen=True)
class Need:
    """One comparison's spread and the planner's effect, in the units the power simulations take."""

    variant: Any
    dz: float  # |effect| / the sd's upper bound
    why: str  # where the effect comes from


@dataclass(frozen=True)
class FixedDesign:
    seeds: int  # per arm; the planner's cap when ``capped``
    capped: bool  # more than ``verdict_power.MAX_SEEDS`` seeds would be needed: ``seeds`` is the cap
    why: str
    hardest: Need  # the comparison that needs the most seeds

    def seeds_text(self) -> str:
        return (f"more than {self.seeds} (the planner's cap; counted as {self.seeds})" if self.capped
                else str(self.seeds))


def needs(pa, ref: PaperRef | None) -> list[Need]:
    """Each comparison of ``pa`` with a finite sd: its d_z for the planner's default effect, with the
    upper confidence bound of its sd."""
    out = []
    for r in pa.rows:
        up = sd_upper(r.diff_sd, r.n)
        if not math.isfinite(up) or not math.isfinite(r.base_mean):
            continue
        rel, why = relative_effect(ref, pa.metric, r.variant)
        out.append(Need(r.variant, abs(rel * r.base_mean) / up if up > 0 else math.inf, why))
    return out


def fixed_design(pa, level: float, ref: PaperRef | None, target: float = verdict_power.TARGET) -> FixedDesign | None:
    """The seeds per arm a fixed-seed design needs so that every comparison of ``pa`` is decided with
    ``target`` power at ``level`` for the planner's default effect, with this sweep's sd (its upper
    bound). Above ``verdict_power.MAX_SEEDS`` seeds the search stops and the design says it is capped."""
    found = []
    for nd in needs(pa, ref):
        n = verdict_seeds(level, nd.dz, target)
        found.append((n if n is not None else verdict_power.MAX_SEEDS, n is None, nd))
    if not found:
        return None
    seeds, capped, hard = max(found, key=lambda x: (x[0], x[1]))
    return FixedDesign(seeds, capped, f"the verdict rule's seeds for {hard.why}, with {target:.0%} power and the "
                       f"{SD_CONFIDENCE:.0%} upper bound of each comparison's sd", hard)


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
    """Whether the design's seeds can give a verdict (the interval at the family's level is finite)
    and the smallest reachable p of the supporting tests, with warnings (fast)."""
    n, m, k, a = d.seeds, d.comparisons, len(d.variants), d.alpha
    level = 1.0 - a / m
    # the verdict rule's own intervals (orchestrator.decide.rule): the median's sign interval at a fixed
    # n, its sign sequence when seeds are added until decided (the mean's are printed, not deciding)
    need, need_seq = min_seeds(level), min_seeds(level, sequential=True)
    paired = 2.0 / 2**n if n else 1.0
    mwu = mann_whitney_min_p(n, n)
    lines = [f"plan: {k} values of {d.axis} x {n} seed(s), baseline {cell_text(d.baseline)}, {m} comparison(s) "
             f"with the baseline (Bonferroni: each interval at {100 * level:.4g}%), alpha {a:g}, {d.metric} "
             f"({verdicts.direction_words(d.direction)})",
             f"  verdict interval (the median's sign interval) at {100 * level:.4g}%: finite from {need} seeds "
             "per arm: " + ("yes" if n >= need else "NO") + f" at {n}",
             f"  until decided (the median's sign sequence at {100 * level:.4g}%): finite from {need_seq} seeds per "
             "arm: " + ("yes" if n >= need_seq else "NO") + f" at {n}"
             + ("" if n >= need_seq else " (a first look at this many seeds cannot decide)"),
             f"  {'smallest reachable p at ' + str(n) + ' seeds per arm':<41} {'raw':<10} {'Holm x' + str(m):<10} "
             "below alpha"]
    rows = [("paired permutation (supporting)", paired, min(1.0, m * paired)),
            ("Wilcoxon signed-rank (paired)", paired, min(1.0, m * paired)),
            ("Mann-Whitney (unpaired)", mwu, min(1.0, m * mwu))]
    if k >= 3:
        rows += [(f"Friedman (paired omnibus, {k} variants)", friedman_min_p(n, k, 9999), None),
                 (f"Kruskal-Wallis (omnibus, {k} variants)",
                  kruskal_min_p(n, k, 9999) if n < 5 else kruskal_min_p(n, k), None)]
    for label, raw, holm in rows:
        shown = "-" if holm is None else num(holm, 3)
        lines.append(f"  {label:<41} {num(raw, 3):<10} {shown:<10} {_yes(raw if holm is None else holm, a)}")
    if n < need:
        lines.append(f"WARNING: no verdict can be 'better', 'worse' or 'equivalent' at {n} seeds: below {need} seeds "
                     f"per arm every interval at {100 * level:.4g}% ({m} comparison(s)) is the whole line")
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


@dataclass(frozen=True)
class Spread:
    """The sd of the per-seed paired differences each comparison has shown, and where it came from."""

    per: dict  # comparison label -> (sd, seeds it rests on; None: given, not estimated)
    level: float | None  # the baseline's mean in the same data
    source: str

    def of(self, label: str) -> tuple[float, int | None]:
        """A comparison's own sd, else the root mean square of the others' (pooled)."""
        if label in self.per:
            return self.per[label]
        known = [(s, n) for s, n in self.per.values() if math.isfinite(s)]
        if not known:
            return math.nan, None
        ns = [n for _, n in known if n]
        return math.sqrt(sum(s * s for s, _ in known) / len(known)), (min(ns) if ns else None)


def plan_text(d: Design, spread: Spread | None = None, level: float | None = None, effect: float | None = None,
              delta: float | None = None, target: float = 0.8, sims: int = power.SIMS, seed: int = 0) -> str:
    """The whole plan: reachability, then per comparison the seeds a fixed design needs (the verdict
    rule at the family's level, from the upper confidence bound of the sd) and the mean seeds the
    sequential design uses (``lime sweep run --until-decided``, waves of 2 from the file's seeds)."""
    lines = reachability(d)
    m, a = d.comparisons, d.alpha
    lvl = 1.0 - a / m
    level = level if level is not None else (spread.level if spread is not None else None)
    note = spread.source if spread is not None and spread.level is not None else ""
    if level is None and d.paper is not None:
        level = paper_effects(d.paper, d.metric)[0]
        note = (f"NOT this sweep's: the paper's baseline, {d.paper.title}; this sweep's own data (--pilot, its "
                "MLflow runs or results/<name>/summary.csv) replaces it" if level is not None else "")
    lines.append(f"level of {d.metric}: " + (f"{num(level, 4)}" if level is not None else "unknown")
                 + (f" ({note})" if note else ""))
    if spread is None:
        lines.append("spread: this sweep has no data yet (no finished runs in MLflow, no results/<name>/summary.csv); "
                     "--pilot SWEEP or --sigma S sizes the design; in units of the sd of the per-seed differences:")
        for dz in (0.5, 1.0, 2.0):
            n = verdict_seeds(lvl, dz, target, sims, seed)
            lines.append(f"  d_z = {dz:g} (a mean difference of {dz:g} sd): "
                         + (f"{n} seeds per arm" if n else f"more than {verdict_power.MAX_SEEDS}"))
        return "\n".join(lines)
    lines.append(f"spread: {spread.source}; planned with the {SD_CONFIDENCE:.0%} upper confidence bound of each sd "
                 f"(chi-square), power {target:g}, {sims} simulated sweeps (seed {seed})")
    lines.append(f"  {'comparison':<16} {'sd (seeds)':<16} {'sd upper':<9} {'effect':<20} {'d_z':<6} "
                 f"{'seeds (fixed)':<14} {'mean seeds (until decided)':<27} source")
    short = []
    labels = [cell_text(v) for v in d.variants if not same_value(v, d.baseline)]
    for e in effects(d, level, effect, delta):
        for label in (labels if e.label == "every comparison" else [e.label]):
            if e.absolute is None:
                lines.append(f"  {label:<16} {_pct(e.relative):<20} unknown: the level of {d.metric} is unknown; "
                             "give --delta or --pilot")
                continue
            sd, n = spread.of(label)
            up = sd if n is None else sd_upper(sd, n)
            dz = abs(e.absolute) / up if up > 0 else math.inf
            fixed = verdict_seeds(lvl, dz, target, sims, seed) if math.isfinite(up) else None
            seq = sequential_seeds(lvl, dz, max(2, d.seeds), 2, 100, sims, seed) if math.isfinite(dz) else None
            seq_text = "-" if seq is None else f"{seq[0]:.1f} (power {seq[1]:.2f}, cap 100)"
            lines.append(f"  {label:<16} {num(sd, 3) + (f' ({n})' if n else ' (given)'):<16} {num(up, 3):<9} "
                         f"{_pct(e.relative) + f' ({num(e.absolute, 3)})':<20} {num(dz, 3):<6} {_seeds(fixed):<14} "
                         f"{seq_text:<27} {e.source}")
            if fixed is None or fixed > d.seeds:
                short.append((label, verdict_power.verdict_power(d.seeds, lvl, dz, sims, seed)))
    if short:
        lines.append(f"WARNING: {d.seeds} seeds per arm are too few for {len(short)} of these comparisons (power "
                     + ", ".join(f"{label} {p:.2f}" for label, p in short) + f"; wanted {target:g})")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:+.2f}%"


def _seeds(n: int | None) -> str:
    return str(n) if n is not None else f"> {power.MAX_SEEDS} (or no effect)"


def pilot(name: str, metric: str) -> Spread:
    """The spread of each comparison from the finished runs of a sweep in MLflow (a pilot, an earlier
    sweep, or this sweep's own seeds), compared as its own report would (its parent run's axis and
    baseline)."""
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
    per = {cell_text(r.variant): (r.diff_sd, r.n) for r in pa.rows if r.n >= 2 and math.isfinite(r.diff_sd)}
    if not pa.paired or not per:
        raise ConfigError(f"plan: --pilot {name}: no variant shares 2 or more finished seeds with the baseline "
                          f"{choice.axis}={cell_text(choice.baseline)} ({pa.why.rstrip('.')})")
    return Spread(per, comp.group(comp.baseline).mean, f"the finished runs of sweep {name} in MLflow")


def committed(path: Path) -> Spread | None:
    """The spread of each comparison from a committed report's summary.csv (its scope "all" rows)."""
    if not path.is_file():
        return None
    rows = [r for r in csv.DictReader(open(path)) if r.get("scope") == "all"]
    per = {}
    for r in rows:
        try:
            sd, n = float(r.get("diff_sd") or "nan"), int(float(r.get("n_pairs") or "nan"))
        except ValueError:
            continue
        if math.isfinite(sd) and n >= 2:
            per[str(r["variant"])] = (sd, n)
    base = [float(r["mean"]) for r in rows if r.get("baseline") == "True" and r.get("mean")]
    return Spread(per, base[0] if base else None, f"the committed report {path}") if per else None
