"""What a report compares, and the sweep file it shows, from the sweep's parent MLflow run.

``lime sweep run`` records on the parent run the report settings of the sweep file as params and
its axes as written (``orchestrator.core.record``: ``SweepRecord.to_params``; a report reads them
back with ``ReportSettings.from_params``), and the file itself as an artifact under ``sweep/``. A report
takes its settings from those params and shows the file verbatim; it never parses the file (that
is the sweep layer's job: ``lime report path/to/file.yaml`` loads the file in the CLI and hands
the report explicit ``ReportSettings``). A sweep without a parent run, or whose parent lacks the
params, is reported with the defaults, and the report says so.

Which of metric, axis and baseline the file states matters only for the baseline: a stated
baseline that no run has is an error, a default one falls back to the first value with a note.
The parent run says which ones the file states in ``sweep.report.explicit`` when it has that
param; without it, the logged baseline is treated as not stated.

Optional params (a sweep launched before they existed has none, and gets the defaults):
``sweep.report.alpha`` (the significance level of the verdicts, default 0.05),
``sweep.report.mode`` (``min``/``max``: which direction is better; default from the metric's
name), ``sweep.report.margin`` (the equivalence margin: without it no verdict says two variants
match), ``sweep.report.paper`` (the paper result the sweep mirrors, ``orchestrator.report.paper.refs``;
default from the sweep's name) and ``sweep.report.tune`` (an axis, usually ``lr``, along which
each variant is compared at its own best value) and ``sweep.report.final_evals`` (the final metric
as the mean of each trial's last k evaluations, ``orchestrator.report.curves``; absent: 1, the last).

A search sweep (the parent has ``sweep.search.*`` params) compares its sampled configurations
(``orchestrator.report.search``) unless the file states ``report.axis`` or ``--axis`` is given:
the axis is then ``configuration``, the searched keys are folded into it (``Choice.folded``) and
the baseline is the best configuration, found from the runs.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core import record
from orchestrator.core.keys import canonical, dotted
from orchestrator.core.record import ReportSettings
from orchestrator.core.tracking import quiet_downloads
from orchestrator.decide.verdict import margin_for, parse_margins
from orchestrator.report.search import CONFIG


@dataclass(frozen=True)
class Choice:
    """What one report compares: the settings with the command line's overrides applied."""

    metric: str
    axis: str  # canonical (alias when there is one)
    baseline: Any
    explicit_baseline: bool  # a baseline no run has is an error, not a fallback
    baseline_origin: str  # "default" or "sweep's": how a fallback note names it
    grid_cols: list[str]  # the sweep's axes besides seed, canonical
    alpha: float = 0.05
    mode: str | None = None  # "min", "max" or None (from the metric's name)
    paper: str | None = None  # a paper reference name, or None (from the sweep's name)
    tune: str | None = None  # canonical axis tuned per variant, or None
    folded: tuple[str, ...] = ()  # searched keys that are part of the compared configuration
    margin: Any = None  # the margin for this report's metric (``orchestrator.decide.verdict.Margin``) or None
    decide: Any = None  # the sweep's sequential design (``record.DecideRecord``) or None: fixed seeds
    margins: dict = field(default_factory=dict)  # every margin the settings give, by metric (None: the report's)
    final_evals: int = 1  # the final metric: the mean of the last this many evaluations (``report.curves``)


DEFAULTS = ReportSettings()
REPORT_DEFAULTS = {"metric": DEFAULTS.metric, "axis": DEFAULTS.axis, "baseline": DEFAULTS.baseline}


def choose(settings: ReportSettings, metric: str | None = None, axis: str | None = None,
           baseline: Any = None) -> Choice:
    """Apply the command line's ``--metric/--axis/--baseline``; the sweep's baseline belongs to the
    sweep's axis, so another axis starts from the default baseline."""
    own_axis = canonical(str(settings.axis))
    chosen_axis = canonical(str(axis)) if axis else own_axis
    if baseline is not None:
        base, explicit, origin = baseline, True, "given"
    elif chosen_axis != own_axis:
        base, explicit, origin = DEFAULTS.baseline, False, "default"
    else:
        base = settings.baseline
        explicit = settings.stated is not None and "baseline" in settings.stated
        origin = "default" if settings.stated is not None else "sweep's"
    grid_cols = [g for g in settings.axes if g not in ("seed", "train.seed")]
    chosen_metric = str(metric or settings.metric)
    margins = parse_margins(settings.margin)
    margin = margin_for(margins, chosen_metric, settings.metric)
    if settings.search and axis is None and not (settings.stated and "axis" in settings.stated):
        return Choice(metric=chosen_metric, axis=CONFIG, baseline=None, explicit_baseline=False,
                      baseline_origin="best", grid_cols=[], alpha=float(settings.alpha), mode=settings.mode,
                      paper=settings.paper, margin=margin, margins=margins, final_evals=settings.final_evals,
                      folded=tuple(g for g in settings.search if g not in ("seed", "train.seed")))
    return Choice(metric=chosen_metric, axis=chosen_axis, baseline=base,
                  explicit_baseline=explicit, baseline_origin=origin, grid_cols=grid_cols,
                  alpha=float(settings.alpha), mode=settings.mode, paper=settings.paper,
                  tune=canonical(dotted(settings.tune)) if settings.tune else None, margin=margin,
                  decide=settings.decide, margins=margins, final_evals=settings.final_evals)


@dataclass
class SweepFile:
    """The sweep file a report shows verbatim, where it came from, and notes on the settings."""

    text: str | None = None
    source: str = "not found"
    notes: list[str] = field(default_factory=list)


def launched_file(cl, parent_id: str, name: str) -> SweepFile:
    """The sweep file logged on the parent run (``sweep/<name>.yaml``), if there is one."""
    try:
        arts = [a for a in cl.list_artifacts(parent_id) if not a.is_dir]
        arts += [a for d in cl.list_artifacts(parent_id) if d.is_dir and d.path in ("sweep", "spec")
                 for a in cl.list_artifacts(parent_id, d.path) if not a.is_dir]
    except Exception:  # noqa: BLE001 - an unreadable artifact store only loses the file's text
        return SweepFile()
    yamls = sorted((a.path for a in arts if a.path.endswith((".yaml", ".yml"))),
                   key=lambda p: (Path(p).stem != name, Path(p).stem != "sweep", p))
    if not yamls:
        return SweepFile()
    with tempfile.TemporaryDirectory() as tmp:
        with quiet_downloads():
            p = cl.download_artifacts(parent_id, yamls[0], tmp)
        return SweepFile(text=Path(p).read_text(), source=f"artifact {yamls[0]} of the parent run")


def from_parent_run(cl, parent, name: str) -> tuple[ReportSettings, SweepFile]:
    """The settings and sweep file of a sweep from its parent run (an MLflow ``Run`` or None)."""
    if parent is None:
        return DEFAULTS, SweepFile(notes=["no parent run of the sweep in MLflow, so no report "
                                          f"settings: {_defaults_text()}"])
    settings = ReportSettings.from_params(parent.data.params)
    sweep_file = launched_file(cl, parent.info.run_id, name)
    if settings is None:
        sweep_file.notes.append(f"the parent run has no report settings ({record.REPORT}* params): "
                                f"{_defaults_text()}")
        return DEFAULTS, sweep_file
    return settings, sweep_file


def _defaults_text() -> str:
    return (f"the defaults are used (metric {DEFAULTS.metric}, axis {DEFAULTS.axis}, "
            f"baseline {DEFAULTS.baseline}) and the sweep's axes are unknown")
