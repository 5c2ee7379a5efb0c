"""The sweep's record in MLflow: what a sweep and its trials write, and how it is read back.

This is the one definition of the contract between the sweep layer (which writes) and the report,
the console and ``lime sweep status`` (which read). Torch-free; MLflow's client is passed in.

Runs. One experiment per sweep (named after it); one parent run per sweep (tag ``sweep_role =
parent``), one child run per trial for its whole life (``sweep_role = trial``, ``trial_id``,
``mlflow.parentRunId``). Every run's ``status`` tag is a ``TrialStatus`` (``core/status.py``).

Parent params (``SweepRecord.to_params``): the sweep's shape and report settings, written once per
parent. Parent tags (``ParentTags``): what later launches update: timing (``sweep/wall_s`` summed
over launches, ``sweep/slots``, ``sweep/ray_start_s``, ``sweep/launches``), the seeds in effect
after a growth, the trial counts and the best trial.

Resume state has one source of truth: this record. A sweep's parent run is the active parent of its
experiment with the sweep's fingerprint (``find_parent``); a trial's run is its parent's child with
its ``trial_id`` (``trial_runs``), and a trial whose run is finished is never trained again. The
others are derived from it or hold what MLflow cannot:
  ``<results>/ray/<sweep>/lime_sweep.json``  a local cache of the parent run id, the store and the
      seed history (rebuilt from the parent when missing: BASE_SEEDS, SEED_EXTENSION and
      SEED_VALUES params, ``orchestrator.sweep.history``);
  a trial's checkpoint                         the weights, optimizer state and step a trial
      continues from (its ``run_id`` is only checked against the record);
  Ray's experiment folder                      the scheduler's queue (which trials are pending);
      deleting it re-queues every trial, and the finished ones report their recorded result at once.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.core.keys import canonical, dotted
from orchestrator.core.status import TrialStatus

# -- tags -------------------------------------------------------------------------------------------------
SWEEP = "sweep"  # the sweep's name, on the parent and every trial run
ROLE = "sweep_role"
PARENT, TRIAL = "parent", "trial"  # values of ROLE
TRIAL_ID = "trial_id"
STATUS = "status"
GIT_SHA = "git_sha"
PARENT_RUN = "mlflow.parentRunId"
NOTE = "mlflow.note.content"
RAY_NODE, HOST = "ray_node_id", "host"
OLD_ROLES = ("lime.role", "role")  # role tags of runs written before ``sweep_role``

# -- parent params --------------------------------------------------------------------------------------
PREFIX = "sweep."
REPORT = "sweep.report."  # prefix of the report settings
AXES = "sweep.axes"
FINGERPRINT = "sweep.fingerprint"
SEARCH_METRIC = "sweep.search.metric"  # only a search sweep's parent has it
SEED_EXTENSION = "sweep.seeds."  # + extension name ("extend-1"): the seeds it added ("4, 5")
SEED_VALUES = "sweep.values."  # + extension name: a wave's compared axis and values (JSON {"axis", "values"})
BASE_SEEDS = "sweep.base_seeds"  # the first launch's seeds ("0, 1"): the FINGERPRINT's trials
REPORT_KEYS = ("metric", "axis", "baseline", "alpha", "mode", "tune", "paper", "margin",
               "final_evals")  # what a file may state
REPORT_OPTIONAL = ("alpha", "mode", "paper", "tune", "margin", "final_evals")  # absent on parents of older sweeps
DECIDE = "sweep.decide."  # the sequential design (``decide:`` / ``--until-decided``): max_seeds, wave, budget
DECIDE_MARGIN = DECIDE + "margin_abs"  # the absolute margin the waves use (a % margin fixed at the first wave)
DECIDE_WAVE = DECIDE + "wave-"  # + k: the decisions after the k-th look (JSON, ``decide.waves.Wave.record``)

# -- parent tags (numbers that later launches update) -----------------------------------------------------
SWEEP_WALL, SLOTS, RAY_START, LAUNCHES = "sweep/wall_s", "sweep/slots", "sweep/ray_start_s", "sweep/launches"

# -- metrics ----------------------------------------------------------------------------------------------
TRIAL_WALL = "trial/wall_s"  # the seconds a trial's attempts spent in their workers
VAL_LOSS = "val/loss"  # the loss per target token on the validation windows, at every eval
VAL_LOSS_SE = "val/loss_se"  # its standard error over the windows (engine.trainer.mean_and_se)
FINAL_VAL_LOSS = "final/val_loss"  # the last eval, at the end of a finished trial
FINAL_VAL_LOSS_SE = "final/val_loss_se"


def cast_param(s: Any) -> Any:
    """An MLflow param string back to a Python value (int, float, bool, None, else the string)."""
    if not isinstance(s, str):
        return s
    t = s.strip()
    if t == "None":
        return None
    if t in ("True", "False"):
        return t == "True"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return s


def _split(s: str | None) -> tuple[str, ...]:
    return tuple(a.strip() for a in (s or "").split(",") if a.strip())


def axis_names(written: Iterable[str]) -> tuple[str, ...]:
    """Axes as a sweep file writes them (``model.n_layers``, ``router``) -> canonical names,
    first occurrence kept."""
    return tuple(dict.fromkeys(canonical(dotted(a)) for a in written))


# -- typed settings ---------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """What a report compares: the defaults, a parent run's params or a sweep file's."""

    metric: str = FINAL_VAL_LOSS
    axis: str = "router"  # as written (alias or dotted key)
    baseline: Any = "none"
    axes: tuple[str, ...] = ()  # the sweep's grid (or search space) axes, canonical
    stated: frozenset[str] | None = frozenset()  # what the file states of metric/axis/baseline; None: unknown
    alpha: float = 0.05
    mode: str | None = None
    paper: str | None = None
    tune: str | None = None
    margin: str | None = None  # the equivalence margin's text (``orchestrator.decide.verdict.parse_margins``)
    search: tuple[str, ...] = ()  # a search sweep's searched keys, canonical (empty: a grid)
    decide: DecideRecord | None = None  # the sweep ran with sequential seeds (the waves are DECIDE_WAVE params)
    final_evals: int = 1  # the final metric: the mean of the last this many evaluations (report.curves)

    @classmethod
    def from_params(cls, params: dict[str, str]) -> ReportSettings | None:
        """The settings a parent run's params carry; None when it has none (a sweep launched before
        they were logged). The optional ones default when absent or "None"."""
        if not all(REPORT + k in params for k in ("metric", "axis", "baseline")):
            return None
        axes = axis_names(_split(params.get(AXES)))
        stated = None
        if REPORT + "explicit" in params:
            stated = frozenset(k for k in _split(params[REPORT + "explicit"]) if k in ("metric", "axis", "baseline"))
        optional: dict[str, Any] = {}
        for key in REPORT_OPTIONAL:
            v = cast_param(params.get(REPORT + key))
            if v is None or v == "":
                continue
            if key == "alpha" and not (isinstance(v, float) and 0 < v < 1):
                raise ConfigError(f"{REPORT}alpha: must be a number between 0 and 1, got {v!r}")
            if key == "final_evals" and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ConfigError(f"{REPORT}final_evals: must be an integer >= 1, got {v!r}")
            optional[key] = float(v) if key == "alpha" else v if key == "final_evals" else str(v)
        return cls(metric=params[REPORT + "metric"], axis=params[REPORT + "axis"],
                   baseline=cast_param(params[REPORT + "baseline"]), axes=axes, stated=stated,
                   search=axes if SEARCH_METRIC in params else (), decide=DecideRecord.from_params(params), **optional)


@dataclass(frozen=True, kw_only=True)
class DecideRecord:
    """The sequential design of a sweep (``decide:`` or ``--until-decided``) as its parent records it."""

    max_seeds: int
    wave: int
    budget: str | None = None  # ``orchestrator.decide.budget.Budget.to_text``; absent: no budget

    def to_params(self) -> dict[str, str]:
        out = {DECIDE + "max_seeds": str(self.max_seeds), DECIDE + "wave": str(self.wave)}
        return out | ({DECIDE + "budget": self.budget} if self.budget else {})

    @classmethod
    def from_params(cls, params: dict[str, str]) -> DecideRecord | None:
        if DECIDE + "max_seeds" not in params:
            return None
        return cls(max_seeds=int(params[DECIDE + "max_seeds"]), wave=int(params[DECIDE + "wave"]),
                   budget=params.get(DECIDE + "budget") or None)


def decide_waves(params: dict[str, str]) -> dict[int, str]:
    """The recorded waves of a sequential sweep: k -> the JSON of its decisions, in order."""
    waves = {int(k[len(DECIDE_WAVE):]): v for k, v in params.items()
             if k.startswith(DECIDE_WAVE) and k[len(DECIDE_WAVE):].isdigit()}
    return dict(sorted(waves.items()))


@dataclass(frozen=True, kw_only=True)
class ReportRecord:
    """The sweep file's report block as the parent run records it."""

    metric: str
    axis: str
    baseline: Any
    alpha: float
    mode: str
    stated: tuple[str, ...] = ()  # REPORT_KEYS the file (or a file it extends) writes
    tune: str | None = None
    paper: str | None = None
    margin: str | None = None
    final_evals: int = 1


@dataclass(frozen=True, kw_only=True)
class SearchRecord:
    metric: str
    mode: str
    num_samples: int
    seed: int
    repeat: int


@dataclass(frozen=True, kw_only=True)
class SweepRecord:
    """What a sweep's parent run holds as params: ``to_params`` and ``from_params`` are inverses."""

    n_trials: int
    axes: tuple[str, ...]  # as written in the file
    cpu: float
    gpu: float
    max_failures: int
    max_concurrent: int | None
    fingerprint: str
    report: ReportRecord
    extends: str | None = None
    search: SearchRecord | None = None
    decide: DecideRecord | None = None

    def to_params(self) -> dict[str, str]:
        r = self.report
        out: dict[str, Any] = {
            "sweep.n_trials": self.n_trials, AXES: ",".join(self.axes), "sweep.resources.cpu": self.cpu,
            "sweep.resources.gpu": self.gpu, "sweep.max_failures": self.max_failures,
            "sweep.max_concurrent": self.max_concurrent, REPORT + "metric": r.metric, REPORT + "axis": r.axis,
            REPORT + "baseline": r.baseline, REPORT + "explicit": ",".join(r.stated), FINGERPRINT: self.fingerprint,
            REPORT + "alpha": r.alpha, REPORT + "mode": r.mode}
        for key in ("tune", "paper", "margin"):  # only when the file sets them (a reader takes absence as unset)
            if getattr(r, key) is not None:
                out[REPORT + key] = getattr(r, key)
        if r.final_evals != 1:  # absent: the last evaluation (as parents of older sweeps)
            out[REPORT + "final_evals"] = r.final_evals
        if self.extends:
            out["sweep.extends"] = self.extends
        if self.search is not None:
            out.update({f"sweep.search.{f.name}": getattr(self.search, f.name)
                        for f in dataclasses.fields(SearchRecord)})
        if self.decide is not None:
            out.update(self.decide.to_params())
        return {k: str(v) for k, v in out.items()}

    @classmethod
    def from_params(cls, params: dict[str, str]) -> SweepRecord:
        """The record of a parent whose params ``to_params`` wrote (KeyError if one is missing)."""
        c = {k: cast_param(v) for k, v in params.items()}
        search = None
        if SEARCH_METRIC in params:
            search = SearchRecord(metric=params[SEARCH_METRIC], mode=params["sweep.search.mode"],
                                  num_samples=c["sweep.search.num_samples"], seed=c["sweep.search.seed"],
                                  repeat=c["sweep.search.repeat"])
        report = ReportRecord(metric=params[REPORT + "metric"], axis=params[REPORT + "axis"],
                              baseline=c[REPORT + "baseline"], alpha=float(c[REPORT + "alpha"]),
                              mode=params[REPORT + "mode"], stated=_split(params.get(REPORT + "explicit")),
                              tune=params.get(REPORT + "tune"), paper=params.get(REPORT + "paper"),
                              margin=params.get(REPORT + "margin"),
                              final_evals=int(params.get(REPORT + "final_evals", 1)))
        return cls(n_trials=c["sweep.n_trials"], axes=_split(params.get(AXES)), cpu=float(c["sweep.resources.cpu"]),
                   gpu=float(c["sweep.resources.gpu"]), max_failures=c["sweep.max_failures"],
                   max_concurrent=c["sweep.max_concurrent"], fingerprint=params[FINGERPRINT], report=report,
                   extends=params.get("sweep.extends"), search=search, decide=DecideRecord.from_params(params))

    def report_settings(self) -> ReportSettings:
        """The report's view of this record (axes canonical): what ``ReportSettings.from_params``
        reads back from ``to_params``."""
        r = self.report
        axes = axis_names(self.axes)
        return ReportSettings(metric=r.metric, axis=r.axis, baseline=r.baseline, axes=axes,
                              stated=frozenset(k for k in r.stated if k in ("metric", "axis", "baseline")),
                              alpha=r.alpha, mode=r.mode, paper=r.paper, tune=r.tune, margin=r.margin,
                              search=axes if self.search is not None else (), decide=self.decide,
                              final_evals=r.final_evals)


# -- the parent's tags ------------------------------------------------------------------------------------
@dataclass
class ParentTags:
    """The tags a parent run carries beside its params, read with ``of`` and written with
    ``write``: a tag can change when a later launch resumes or grows the sweep, a param cannot.
    Numbers are tags, not metrics: a parent metric would be a chart beside the trials' charts."""

    wall_s: float | None = None  # Tune's fit, summed over every launch
    slots: float | None = None  # trials that run at once
    ray_start_s: float | None = None
    launches: float | None = None
    seeds: str | None = None  # the seeds in effect after a growth ("0,1,2,3")
    n_trials: str | None = None  # the trial count in effect after a growth
    counts: dict[str, int] = field(default_factory=dict)  # trials_finished / _failed / _unfinished
    best: dict[str, str] = field(default_factory=dict)  # best_trial_id, best_run_id, best_metric, best_value

    TIMING = {"wall_s": SWEEP_WALL, "slots": SLOTS, "ray_start_s": RAY_START, "launches": LAUNCHES}
    COUNTS = ("trials_finished", "trials_failed", "trials_unfinished")
    BEST = ("best_trial_id", "best_run_id", "best_metric", "best_value")

    @classmethod
    def of(cls, tags: dict[str, str]) -> ParentTags:
        out = cls(seeds=tags.get("sweep.seeds"), n_trials=tags.get("sweep.n_trials"))
        for attr, key in cls.TIMING.items():
            try:
                setattr(out, attr, float(tags[key]))
            except (KeyError, ValueError):
                pass
        out.counts = {k: int(tags[k]) for k in cls.COUNTS if str(tags.get(k, "")).isdigit()}
        out.best = {k: tags[k] for k in cls.BEST if k in tags}
        return out

    def items(self) -> dict[str, str]:
        """The tags to set: the fields that are set, as strings (numbers in full precision)."""
        out = {key: repr(float(getattr(self, attr))) for attr, key in self.TIMING.items()
               if getattr(self, attr) is not None}
        if self.seeds is not None:
            out["sweep.seeds"] = self.seeds
        if self.n_trials is not None:
            out["sweep.n_trials"] = self.n_trials
        out.update({k: str(v) for k, v in self.counts.items()})
        out.update(self.best)
        return out

    def write(self, cl, run_id: str) -> None:
        for k, v in self.items().items():
            cl.set_tag(run_id, k, v)


def parent_numbers(parent) -> dict[str, float]:
    """A parent run's metrics and its numeric ``sweep/*`` tags (sweeps launched before these were
    tags logged them as metrics)."""
    out = dict(parent.data.metrics)
    for k, v in parent.data.tags.items():
        if k.startswith("sweep/"):
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


# -- runs -------------------------------------------------------------------------------------------------
def role(tags: dict[str, str]) -> str:
    """A run's role (``parent``, ``trial``, or "" when untagged), old tag names included."""
    return (tags.get(ROLE) or next((tags[t] for t in OLD_ROLES if tags.get(t)), "")).lower()


def parent_tags(sweep: str, description: str, sha: str) -> dict[str, str]:
    return {SWEEP: sweep, ROLE: PARENT, GIT_SHA: sha, STATUS: TrialStatus.RUNNING.value, NOTE: description}


def trial_tags(sweep: str, trial_id: str, axis_values: dict[str, Any], **extra: Any) -> dict[str, str]:
    """A trial run's own tags: the sweep, the trial id and role, its axis values as written."""
    tags = {SWEEP: sweep, TRIAL_ID: trial_id, ROLE: TRIAL, **extra}
    tags.update({k: v for k, v in axis_values.items() if not k.startswith("__")})
    return {k: str(v) for k, v in tags.items()}


def _quote(s: str) -> str:
    q = '"' if "'" in s else "'"
    return f"{q}{s}{q}"


def child_runs(cl, exp_id: str, parent: str, trial_id: str | None = None, status: str | None = None) -> list:
    """The trial runs of a sweep's parent run (one trial's, with ``trial_id``; by MLflow status)."""
    filt = [f"tags.`{PARENT_RUN}` = '{parent}'"]
    if trial_id is not None:
        filt.append(f"tags.{TRIAL_ID} = {_quote(trial_id)}")
    if status:
        filt.append(f"attributes.status = '{status}'")
    return list(cl.search_runs([exp_id], " and ".join(filt), max_results=5000))


def find_parent(cl, exp_id: str, fingerprint: str) -> str | None:
    """The newest active parent run of the experiment recorded with ``fingerprint``: the sweep's
    parent when its local state (``lime_sweep.json``) is gone."""
    runs = cl.search_runs([exp_id], f"tags.{ROLE} = '{PARENT}' and params.`{FINGERPRINT}` = '{fingerprint}'",
                          max_results=50, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def run_status(run) -> TrialStatus | None:
    """A run's ``status`` tag as a TrialStatus (None when missing or written by another version)."""
    try:
        return TrialStatus(run.data.tags.get(STATUS))
    except ValueError:
        return None


def end_run(cl, run_id: str, status: TrialStatus) -> None:
    """Close a run: what happened as its ``status`` tag, MLflow's status from it."""
    cl.set_tag(run_id, STATUS, status.value)
    cl.set_terminated(run_id, status=status.mlflow)
