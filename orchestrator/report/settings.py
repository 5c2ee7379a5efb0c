"""What a report compares, and the sweep file it shows, from the sweep's parent MLflow run.

``lime sweep run`` logs on the parent run the report settings of the sweep file as params
(``sweep.report.metric``, ``sweep.report.axis``, ``sweep.report.baseline``), its axes as written
(``sweep.axes``, comma-separated) and the file itself as an artifact under ``sweep/``. A report
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
name), ``sweep.report.paper`` (the paper result the sweep mirrors, ``orchestrator.report.paper.refs``;
default from the sweep's name) and ``sweep.report.tune`` (an axis, usually ``lr``, along which
each variant is compared at its own best value).

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

from lime_arch.errors import ConfigError
from orchestrator.core.keys import canonical, dotted
from orchestrator.core.tracking import quiet_downloads
from orchestrator.report.runs import cast_param
from orchestrator.report.search import CONFIG

PARAM = "sweep.report."  # prefix of the report params on the parent run
OPTIONAL = ("alpha", "mode", "paper", "tune")
AXES_PARAM = "sweep.axes"
SEARCH_PARAM = "sweep.search.metric"  # only a search sweep's parent has it


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


@dataclass(frozen=True)
class ReportSettings:
    """A sweep's report settings: the defaults, the parent run's params or a sweep file's."""

    metric: str = "final/val_loss"
    axis: str = "router"  # as written (alias or dotted key)
    baseline: Any = "none"
    axes: tuple[str, ...] = ()  # the sweep's grid (or search space) axes, canonical
    stated: frozenset[str] | None = frozenset()  # what the file states of metric/axis/baseline; None: unknown
    alpha: float = 0.05
    mode: str | None = None
    paper: str | None = None
    tune: str | None = None
    search: tuple[str, ...] = ()  # a search sweep's searched keys, canonical (empty: a grid)

    def choose(self, metric: str | None = None, axis: str | None = None,
               baseline: Any = None) -> Choice:
        """Apply the command line's ``--metric/--axis/--baseline``; the sweep's baseline belongs
        to the sweep's axis, so another axis starts from the default baseline."""
        own_axis = canonical(str(self.axis))
        chosen_axis = canonical(str(axis)) if axis else own_axis
        if baseline is not None:
            base, explicit, origin = baseline, True, "given"
        elif chosen_axis != own_axis:
            base, explicit, origin = DEFAULTS.baseline, False, "default"
        else:
            base = self.baseline
            explicit = self.stated is not None and "baseline" in self.stated
            origin = "default" if self.stated is not None else "sweep's"
        grid_cols = [g for g in self.axes if g not in ("seed", "train.seed")]
        if self.search and axis is None and not (self.stated and "axis" in self.stated):
            return Choice(metric=str(metric or self.metric), axis=CONFIG, baseline=None, explicit_baseline=False,
                          baseline_origin="best", grid_cols=[], alpha=float(self.alpha), mode=self.mode,
                          paper=self.paper, folded=tuple(g for g in self.search if g not in ("seed", "train.seed")))
        return Choice(metric=str(metric or self.metric), axis=chosen_axis, baseline=base,
                      explicit_baseline=explicit, baseline_origin=origin, grid_cols=grid_cols,
                      alpha=float(self.alpha), mode=self.mode, paper=self.paper,
                      tune=canonical(dotted(self.tune)) if self.tune else None)


DEFAULTS = ReportSettings()
REPORT_DEFAULTS = {"metric": DEFAULTS.metric, "axis": DEFAULTS.axis, "baseline": DEFAULTS.baseline}


def axis_names(written: list[str]) -> tuple[str, ...]:
    """Axes as a sweep file writes them (``model.n_layers``, ``router``) -> canonical names,
    first occurrence kept."""
    return tuple(dict.fromkeys(canonical(dotted(a)) for a in written))


def settings_from_params(params: dict[str, str]) -> ReportSettings | None:
    """The settings a parent run's params carry; None when it has none."""
    keys = ("metric", "axis", "baseline")
    if not all(PARAM + k in params for k in keys):
        return None
    axes = [a.strip() for a in params.get(AXES_PARAM, "").split(",") if a.strip()]
    stated = None
    if PARAM + "explicit" in params:
        stated = frozenset(k.strip() for k in params[PARAM + "explicit"].split(",") if k.strip() in keys)
    return ReportSettings(metric=params[PARAM + "metric"], axis=params[PARAM + "axis"],
                          baseline=cast_param(params[PARAM + "baseline"]), axes=axis_names(axes),
                          stated=stated, search=axis_names(axes) if SEARCH_PARAM in params else (),
                          **optional_settings(params))


def optional_settings(params: dict[str, str]) -> dict[str, Any]:
    """alpha, mode, paper and tune from the parent run's params (absent or "None": the default)."""
    out: dict[str, Any] = {}
    for key in OPTIONAL:
        v = cast_param(params.get(PARAM + key))
        if v is None or v == "":
            continue
        if key == "alpha" and not (isinstance(v, float) and 0 < v < 1):
            raise ConfigError(f"{PARAM}alpha: must be a number between 0 and 1, got {v!r}")
        out[key] = float(v) if key == "alpha" else str(v)
    return out


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
    settings = settings_from_params(parent.data.params)
    sweep_file = launched_file(cl, parent.info.run_id, name)
    if settings is None:
        sweep_file.notes.append(f"the parent run has no report settings ({PARAM}* params): "
                                f"{_defaults_text()}")
        return DEFAULTS, sweep_file
    return settings, sweep_file


def _defaults_text() -> str:
    return (f"the defaults are used (metric {DEFAULTS.metric}, axis {DEFAULTS.axis}, "
            f"baseline {DEFAULTS.baseline}) and the sweep's axes are unknown")
