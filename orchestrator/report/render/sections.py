"""The markdown of a sweep report, section by section, from ``ReportData`` (built by
``orchestrator.report.build``). Fixed order and formatting, no timestamps: the same runs give
the same bytes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.core.fmt import cell_text, norm_value, num, order_key, same_value
from orchestrator.core.keys import FACTORS
from orchestrator.core.status import TrialStatus
from orchestrator.decide import signs
from orchestrator.decide.families import FAMILY_NOTE
from orchestrator.decide.intervals import HULL
from orchestrator.decide.sequential import METHOD as CS
from orchestrator.report import cosched, efficiency
from orchestrator.report.compare import tuning, verdicts
from orchestrator.report.compare.results import Comparison, PairedAnalysis
from orchestrator.report.multiplier import render as mult
from orchestrator.report.paper import fidelity
from orchestrator.report.paper.refs import PaperRef
from orchestrator.report.render import tables
from orchestrator.report.render.comparisons import comparison_markdown, paired_markdown, verdict_lines
from orchestrator.report.render.sequential import NOT_VALID as STOPPED
from orchestrator.report.runs import SweepRuns
from orchestrator.report.settings import SweepFile
from orchestrator.report.stats import power
from orchestrator.report.wallclock import render as wall


@dataclass
class ReportData:
    """Everything the markdown is written from."""

    data: SweepRuns
    sweep_file: SweepFile
    df: pd.DataFrame  # every trial, with a ``_cell`` label
    sdf: pd.DataFrame  # the trials the statistics use (after tuning; else df)
    comp: Comparison
    paired: PairedAnalysis
    by_depth: dict[Any, tuple[Comparison, PairedAnalysis]]
    rows: list[dict[str, Any]]  # summary.csv
    labels: list[str]  # the cells in report order
    metric: str
    axis: str
    mode: str
    plots: list[tuple[str, str]]
    plot_notes: list[str]
    libraries: dict[str, str]
    ref: PaperRef | None = None
    tuned: tuning.Tuning | None = None
    notes: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # sections built elsewhere (iso-FLOP, scaling)
    search: list[str] = field(default_factory=list)  # a search sweep's "Search" section
    families: Any = None  # ``decisions.Families``: the report's two families and the kind of interval
    margin: Any = None  # the equivalence margin of the metric (``orchestrator.decide.verdict.Margin``) or None
    sequential: list[str] = field(default_factory=list)  # the "Sequential seeds" section
    evidence: str = "screening"  # "screening" (one sweep) or "pooled" (``lime report --pool``)
    iso: dict[str, tuple[float, float]] = field(default_factory=dict)  # variant -> (metric, diff) at equal FLOPs
    unstable: list[str] = field(default_factory=list)  # the "Unstable trials" section (orchestrator.report.unstable)
    multipliers: Any = None  # ``orchestrator.report.multiplier.Multipliers``: the compute multipliers, or None
    co_scheduled: Any = None  # ``orchestrator.report.cosched.CoScheduled``: trials that ran beside others, or None
    wallclock: Any = None  # ``orchestrator.report.wallclock.WallClock``: the wall-clock speedups, or None


def markdown(r: ReportData) -> str:
    parts = (header, search_section, results, verdict_section, unstable_section, sequential_section, statistics,
             tuning_section, paper_section, trials, results_by_depth, extra_sections, plots, analysis, compute,
             reproducibility)
    return "\n".join(line for part in parts for line in part(r)) + "\n"


def unstable_section(r: ReportData) -> list[str]:
    return r.unstable


def search_section(r: ReportData) -> list[str]:
    return r.search


def header(r: ReportData) -> list[str]:
    data, df = r.data, r.df
    fin_n = int((df["status"] == TrialStatus.FINISHED).sum())
    base = "none" if r.comp.baseline is None else f"`{cell_text(r.comp.baseline)}`"
    parent = f"`{data.parent_run_id}`" if data.parent_run_id else "(none found)"
    lines = [f"# Sweep report: {data.name}", "",
             f"- MLflow: experiment(s) {', '.join(f'`{e}`' for e in data.experiment_ids)}, parent run {parent}",
             f"- Trials: {len(df)} ({fin_n} finished), from {len(df) + len(data.duplicates)} MLflow trial runs",
             f"- Metric `{r.metric}` ({verdicts.direction_words(r.mode)}) compared across `{r.axis}`, baseline "
             f"{base}; samples are seeds; design: {r.paired.design}; alpha {r.comp.alpha:g}"]
    if r.comp.baseline is not None:
        lines.append(f"- Baseline {base}: {baseline_setup(r.sdf, r.axis, r.comp.baseline, r.tuned)}")
    return lines + measurement(r)


def measurement(r: ReportData) -> list[str]:
    """The validation set's own noise beside the seeds' (issue 34): its standard error over windows,
    logged by every trial as ``final/val_loss_se``, against the baseline's seed-to-seed sd (within the
    cells of other varying factors: a depth ladder's depths are not seed noise)."""
    se_col = r.metric + "_se"
    if se_col not in r.sdf.columns or r.comp.baseline is None:
        return []
    fin = r.sdf[r.sdf["status"] == TrialStatus.FINISHED]
    se = pd.to_numeric(fin[se_col], errors="coerce").dropna()
    if se.empty:
        return []
    part = fin[fin[r.axis].map(lambda v: same_value(v, r.comp.baseline))]
    tokens = " / ".join(str(v) for v in _values(fin, "params.data.val_tokens"))
    size = f" of {tokens} tokens (`data.val_tokens`)" if tokens else ""
    sd = seed_sd(part, r.metric, [c for c in FACTORS if c != r.axis and len(_values(part, c)) > 1])
    sd = f"; the baseline's seed-to-seed sd {num(sd, 3)}" if sd == sd else ""
    return [f"- Measurement: one validation set{size} for every trial; its standard error over windows "
            f"(`{se_col}`) is {num(se.median(), 3)} (median over trials){sd}. The set is the same for every "
            "trial, so its error shifts every variant alike; a paired difference sees only the part in which "
            "two models differ window by window (docs/CONFIG.md measures it)"]


def seed_sd(part: pd.DataFrame, metric: str, cells: list[str]) -> float:
    """The sd across seeds within the cells that other varying factors (depth, lr) make, pooled
    (root of the mean within-cell variance, weighted by degrees of freedom); NaN with no two seeds."""
    groups = part.groupby([part[c].map(lambda v: str(norm_value(v))) for c in cells]) if cells else [((), part)]
    ss, df = 0.0, 0
    for _, g in groups:
        x = pd.to_numeric(g[metric], errors="coerce").dropna()
        if len(x) > 1:
            ss, df = ss + float(((x - x.mean()) ** 2).sum()), df + len(x) - 1
    return (ss / df) ** 0.5 if df else float("nan")


def _values(part: pd.DataFrame, col: str) -> list[Any]:
    if col not in part.columns:
        return []
    return sorted({norm_value(v) for v in part[col] if norm_value(v) is not None}, key=order_key)


def baseline_setup(df: pd.DataFrame, axis: str, baseline: Any, tuned: tuning.Tuning | None) -> str:
    """Which init and lr the baseline's trials used (``init_std`` "auto" resolved)."""
    part = df[df[axis].map(lambda v: same_value(v, baseline))]
    inits = []
    for init in _values(part, "params.resolved.model.init_std") or _values(part, "params.model.init_std"):
        if str(init) == "auto":
            widths = _values(part, "params.resolved.model.d_model")
            inits += [f"auto = 1/sqrt(d_model) = {num(w ** -0.5, 4)} (d_model {w})" for w in widths] or ["auto"]
        else:
            inits.append(num(init, 4))
    lrs = [num(v, 4) for v in _values(part, "params.optim.lr")]
    lr = " / ".join(lrs) or "(not logged)"
    if tuned is not None and tuned.axis == "lr":
        lr += " (the best of the tuning axis, see Tuning)"
    return f"init_std {' / '.join(inits) or '(not logged)'}; lr {lr}"


def results(r: ReportData) -> list[str]:
    lines = ["", "## Results", ""]
    rows = [row for row in r.rows if row["scope"] == "all"]
    if len(rows) >= 3:  # a field of variants: ranked first, by the metric and by it at equal compute
        column = mult.ranking(r.multipliers) if r.multipliers is not None and r.multipliers.rows else None
        speed = wall.ranking(r.wallclock) if r.wallclock is not None else None
        ranked = tables.ranking_table(rows, r.iso, r.mode, r.metric, column, _co(r), speed)
        lines += ["### Ranking", "", *ranked, "", "### All numbers", ""]
    lines += tables.paper_table(rows, r.comp.confidence, _seq(r), _co(r))
    pooled = " This table pools all depths; see \"Results by depth\"." if r.by_depth else ""
    tuned = f" Each variant at its chosen `{r.tuned.axis}` (see Tuning)." if r.tuned else ""
    return lines + ["", "Mean, std and Student's t CI of the mean are over finished seeds. Step time is the "
                    f"median `perf/step_time_ms` of a run, peak memory {memory_text(r.sdf)}, params "
                    "`model/params`; each is averaged over the finished seeds of a variant. Changes are "
                    "relative to the baseline's mean." + pooled + tuned] + ([
                        "", cosched.text(r.co_scheduled)] if r.co_scheduled is not None else [])


def _co(r: ReportData) -> bool:
    return r.co_scheduled is not None and r.co_scheduled.any


def memory_text(df) -> str:
    """Which metric the memory column is: the model's training memory where runs logged it."""
    used = set(df["mem_metric"].dropna()) if "mem_metric" in df.columns else set()
    train = ("the max `perf/train_mem_mb` (the model's training memory: what the forward saves for "
             "backward plus parameters, gradients and optimizer state)")
    if used == {"perf/train_mem_mb"}:
        return train
    if "perf/train_mem_mb" in used:
        return train + ", or the max `perf/peak_mem_mb` (the process's peak) for runs without it"
    return ("the max `perf/peak_mem_mb` (the process's peak RSS on CPU, the allocator's peak on CUDA: these "
            "runs have no `perf/train_mem_mb`)")


def verdict_section(r: ReportData) -> list[str]:
    return (["", "## Verdicts", "", *decision_rules(r), "", *verdict_lines(r.paired)]
            + (mult.lines(r.multipliers, r.metric) if r.multipliers is not None else [])
            + (wall.lines(r.wallclock) if r.wallclock is not None else []))


def decision_rules(r: ReportData) -> list[str]:
    """How the verdicts were reached: the interval, the families, the margin, screening or pooled."""
    fam = r.families
    if fam is None or not r.paired.paired:
        return []
    kind = (f"the anytime-valid {signs.SEQUENTIAL} (the seeds were added in waves until decided, so a fixed-n "
            "interval would not hold)" if fam.sequential else f"the exact {signs.FIXED} interval (order statistics, "
            "the inverted sign test)")
    mean = (f"the anytime-valid {CS}" if fam.sequential else
            f"the hull of Student's t interval and the inverted exact sign-flip test ({HULL})")
    margin = (f"Equivalence margin: +-{r.margin.text()}" + (" of the baseline's mean" if r.margin.relative else "")
              + (" (fixed from `report.margin` at the first look of the sequential design, as its waves used it)"
                 if fam.sequential and not r.margin.relative else " (`report.margin`)")
              + "; a verdict \"equivalent within margin\" is an interval inside it."
              if r.margin is not None else "No equivalence margin (`report.margin`) is set, so no verdict says two "
              "variants match: an interval that holds 0 is \"not decided\", not \"no difference\".")
    evidence = ("Screening: every verdict comes from this one sweep; confirm a chosen variant on fresh seeds, or "
                "pool pre-registered comparisons of several sweeps with one correction (`lime report --pool`)."
                if r.evidence == "screening" else "Pooled: the comparisons of the sweeps named in the header, one "
                "family over all of them.")
    return [f"- Each verdict is read off its printed interval of the MEDIAN per-seed difference: {kind}; it holds "
            "for any distribution of the differences, skewed or with an outlying seed (docs/STATISTICS.md).",
            f"- Beside it, the interval of the mean difference ({mean}) does not decide; a flag marks a comparison "
            "whose differences hold an outlier (robust z > 4, seeds named) or strong skew (|G1| > 2 se), where "
            "mean and median can disagree.",
            "- Not tested: differences of zero variance (out of the family). A fixed-seed comparison whose seeds "
            "cannot reach its family's level is left out of the family (Tarone) and says the seeds it needs; "
            "Holm p-values are over each whole family.",
            f"- Families ({FAMILY_NOTE}): {fam.baseline.text()}"
            + (f"; {fam.pairs.text()}" if fam.pairs.size else "") + ".",
            f"- {margin}", f"- {evidence}"]


def sequential_section(r: ReportData) -> list[str]:
    return r.sequential


def _seq(r: ReportData) -> bool:
    return bool(getattr(r.families, "sequential", False))


def _stopped(r: ReportData) -> tuple[list[str], str]:
    """After sequential stopping: the warning over every fixed-n table, and the headings' tag."""
    if not _seq(r):
        return [], ""
    return ([f"**{STOPPED.capitalize()}.** The seeds were added in waves until each comparison was decided, so the "
             "p-values, Holm values, Friedman, Wilcoxon, Mann-Whitney and Kruskal-Wallis tests, MDEs and Student's "
             "t intervals of the means below assume a number of seeds fixed in advance that this sweep did not have: "
             "they are kept for reference only. The verdicts are the confidence sequences (see Sequential seeds).",
             ""], f" ({STOPPED})")


def statistics(r: ReportData) -> list[str]:
    warn, tag = _stopped(r)
    return ["", "## Statistics", "", *warn, f"### Paired analysis (seeds as blocks){tag}", "",
            paired_markdown(r.paired).rstrip(), "", f"### Unpaired analysis (seeds as independent samples){tag}", "",
            comparison_markdown(r.comp).rstrip()]


def tuning_section(r: ReportData) -> list[str]:
    return tuning.lines(r.tuned, r.metric, r.axis, r.mode) if r.tuned else []


def paper_section(r: ReportData) -> list[str]:
    if r.ref is None:
        return []
    scope = [row for row in r.rows if row["scope"] == "all"]
    return fidelity.section(r.ref, r.comp, r.paired, scope, r.by_depth, r.mode)


def trials(r: ReportData) -> list[str]:
    lines = ["", "## Failed, diverged and incomplete trials", ""]
    bad = tables.left_out(r.df, r.metric, r.axis)
    lines += tables.left_out_table(bad, r.axis) if bad else ["None: every trial finished with a finite metric."]
    if r.data.duplicates:
        lines += ["", "Duplicate MLflow runs of one trial (the most complete run is kept: finished, "
                  "then with the metric, then the latest end/start time):", ""]
        lines += tables.duplicates_table(r.data.duplicates)
    notes = r.data.notes + r.sweep_file.notes + r.notes
    return lines + ([""] + [f"- {n}" for n in notes] if notes else [])


def results_by_depth(r: ReportData) -> list[str]:
    if not r.by_depth:
        return []
    warn, tag = _stopped(r)
    lines = ["", "## Results by depth", "", *warn]
    for d, (c, pa) in r.by_depth.items():
        scope = f"n_layers={cell_text(d)}"
        lines += [f"### n_layers = {cell_text(d)}", ""]
        lines += tables.paper_table([row for row in r.rows if row["scope"] == scope], c.confidence,
                                    _seq(r), _co(r))
        lines += ["", "Verdicts:", "", *verdict_lines(pa), "", f"Paired analysis{tag}:", "",
                  paired_markdown(pa).rstrip(), "", f"Unpaired analysis{tag}:", "", comparison_markdown(c).rstrip(), ""]
    return lines


def extra_sections(r: ReportData) -> list[str]:
    return r.extra


def plots(r: ReportData) -> list[str]:
    lines = ["", "## Plots", ""]
    for caption, fname in r.plots:
        lines += [f"{caption}:", "", f"![{caption}]({fname})", ""]
    return lines + [f"- {n}" for n in r.plot_notes]


def analysis(r: ReportData) -> list[str]:
    ana = tables.analysis_table(r.df, r.labels)
    if not ana:
        return []
    return ["", "## Representation analysis", "",
            "Mean ± std over finished seeds of the `analysis/...` metrics (the representation "
            "analysis a trial runs at its end with `train.analyze`).", ""] + ana


def compute(r: ReportData) -> list[str]:
    return (["", "## Compute", ""] + tables.compute_table(r.df, r.labels)
            + ["", "All trials count, failed and diverged included (steps actually reached). Tokens = "
               "steps x batch x seq_len x grad_accum; wall time = run end - run start in MLflow."]
            + efficiency.lines(r.df, r.data.parent_metrics)
            + (["", cosched.text(r.co_scheduled)] if _co(r) else []))


def reproducibility(r: ReportData) -> list[str]:
    df, sf = r.df, r.sweep_file
    shas = sorted({str(s) for s in df["git_sha"] if s is not None})
    seeds = sorted({norm_value(s) for s in df["seed"] if norm_value(s) is not None}, key=order_key)
    lines = ["", "## Reproducibility", "",
             f"- Git commit(s): {', '.join(f'`{s}`' for s in shas) if shas else '(not logged)'}",
             f"- Seeds: {', '.join(str(s) for s in seeds) if seeds else '(none)'}",
             f"- Statistics seed: {r.comp.seed}; permutation resamples: {r.comp.n_resamples}; "
             f"power simulations: seed 0, {power.SIMS} simulated sweeps per value",
             "- Libraries: " + ", ".join(f"{k} {v}" for k, v in r.libraries.items()),
             "", f"Sweep file ({sf.source}):", ""]
    if sf.text is None:
        return lines + ["(not found: no YAML artifact on the parent run)"]
    return lines + ["```yaml", sf.text.rstrip("\n"), "```"]
