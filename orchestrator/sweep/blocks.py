"""The blocks of a sweep file besides the trials: names, ``search``, ``resources``, ``report``,
``decide`` and ``analysis``, each a pydantic dataclass that rejects unknown keys (``SweepSpec`` in
``orchestrator.sweep.schema`` holds them). The field types and bounds say what a file may hold;
``orchestrator.core.validation`` words a mismatch as one line naming the key path.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from lime_arch.errors import ConfigError
from orchestrator.core.validation import CONFIG, Bool, FieldError, Float, Int, Str
from orchestrator.decide.verdict import BUDGET_UNITS, margin_for, margins_text, parse_margins
from orchestrator.sweep.checks import SEED, SearchParam, check_decide, key_of, parse_space

MAX_SEEDS = 1000  # decide.max_seeds and --max-seeds: seeds per arm at most
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
METRIC_RE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\Z")
Name = Annotated[Str, Field(pattern="^" + NAME_RE.pattern.replace(r"\Z", "$"),
                            description="lowercase letters, digits and '-' ([a-z0-9][a-z0-9-]*)")]
Metric = Annotated[Str, Field(pattern="^" + METRIC_RE.pattern.replace(r"\Z", "$"),
                              description="a metric key such as final/val_loss or val/accuracy")]
PaperRef = Annotated[Annotated[Str, Field(pattern="^[a-z0-9-]+$")] | None,
                     Field(description="a short reference name of a paper table: lowercase letters, digits and '-' "
                                       "(such as table-1)")]
# Names a sweep may not have: its results go to results/<name>/ and its Ray experiment to
# results/ray/<name>/, so a sweep named after another folder of results/ would write into it
# (ray: Ray's experiments; bench, analysis, eval: `lime bench`, `lime analyze` and `lime eval`;
# dashboard: the dashboard check; train: `lime train`'s default checkpoints), and its MLflow
# experiment is named after it (lime-train, lime-bench: `lime train`'s and `lime bench`'s experiments).
RESERVED_NAMES = {"ray": "results/ray holds every sweep's Ray experiment",
                  "bench": "results/bench holds `lime bench`'s output",
                  "eval": "results/eval holds `lime eval`'s output",
                  "analysis": "results/analysis holds `lime analyze`'s output",
                  "dashboard": "results/dashboard holds the dashboard check's screenshots",
                  "train": "results/train holds `lime train`'s checkpoints",
                  "lime-train": "the MLflow experiment of `lime train`",
                  "lime-bench": "the MLflow experiment of `lime bench`"}


def check_name(name: str, where: str) -> str:
    """A sweep name given on the command line, checked as a sweep file's ``name`` is before it
    becomes part of a path (``results/<name>/``, ``results/ray/<name>/``)."""
    if not NAME_RE.match(name):
        raise ConfigError(f"{where}: {name!r} is not a sweep name (lowercase letters, digits and '-', starting "
                          "with a letter or digit: [a-z0-9][a-z0-9-]*) nor a sweep file")
    if name in RESERVED_NAMES:
        raise ConfigError(f"{where}: {name!r} is reserved ({RESERVED_NAMES[name]}), not a sweep")
    return name


def _margin_text(v: Any) -> str | None:
    """A margin setting (a number, "1%", or a mapping metric -> either) -> its recorded text."""
    if isinstance(v, str) and not v.strip():  # parse_margins reads "" as none: in a file, leave the key out
        raise FieldError("empty; give an absolute margin (0.01) or a percentage of the baseline's mean (1%), or "
                         "leave the key out")
    try:
        return margins_text(parse_margins(v, ""))
    except ConfigError as e:
        text = str(e)
        raise FieldError(text[2:] if text.startswith(": ") else text.lstrip(".")) from None


Margin = Annotated[Any, BeforeValidator(_margin_text)]


def empty_is_default(v: Any) -> Any:
    return {} if v is None else v  # `report:` with nothing under it: the defaults


class _Auto:
    """A report baseline the file does not give (``null`` is a value an axis may have)."""

    def __repr__(self) -> str:
        return "auto"


AUTO = _Auto()


@dataclass(kw_only=True, config=CONFIG)
class AshaSpec:
    grace_period: Annotated[Int, Field(ge=1, description="an integer >= 1 (training steps before a trial can be "
                                                          "stopped)")]
    reduction_factor: Annotated[Int, Field(ge=2)] = 3


@dataclass(kw_only=True, config=CONFIG)
class SearchSpec:
    metric: Metric = "final/val_loss"
    mode: Literal["min", "max"] = "min"
    num_samples: Annotated[Int, Field(ge=1)] = 8  # sampled configurations; each runs ``repeat`` times (seeds)
    seed: Annotated[Int, Field(ge=0)] = 0
    repeat: Annotated[Int, Field(ge=1)] | None = None  # None: one per grid.seed value, else 1
    space: Annotated[dict[str, SearchParam], BeforeValidator(parse_space)]
    asha: AshaSpec | None = None
    seeds: list[int] | None = field(default=None, init=False)  # explicit repeat seeds (from ``grid.seed``)


@dataclass(kw_only=True, config=CONFIG)
class Resources:
    cpu: Annotated[Float, Field(gt=0, description="a number > 0 (fractions allowed)")] = 1.0
    gpu: Annotated[Float, Field(ge=0, description="a number >= 0 (fractions allowed)")] = 0.0
    # workers > 1: one trial = that many data-parallel workers (Ray Train), cpu and gpu per worker
    workers: Annotated[Int, Field(ge=1, description="an integer >= 1 (data-parallel workers per trial)")] = 1
    parallel: Literal["ddp", "fsdp"] = "ddp"  # how the workers share the model (orchestrator.engine.distributed)

    @field_validator("gpu")
    @classmethod
    def _whole_above_one(cls, gpu: float) -> float:
        if gpu > 1 and gpu != int(gpu):
            raise ValueError(f"above 1 must be a whole number, got {gpu!r}")
        return gpu


@dataclass(kw_only=True, config=CONFIG)
class ReportSpec:
    metric: Metric = "final/val_loss"
    # axis None: variant if it is an axis, else router if it is one, else the first non-seed axis
    axis: Annotated[Str | None, Field(description="an axis name")] = None
    baseline: Any = AUTO  # AUTO: variant's first bundle; none if it is a value of the axis; else its first value
    alpha: Annotated[Float, Field(gt=0, le=0.5)] = 0.05  # the significance level of the report's tests
    mode: Literal["min", "max"] | None = None  # None: search.mode for the searched metric, else from its name
    tune: Annotated[Str | None, Field(description="an axis name of the grid (usually lr)")] = None
    paper: PaperRef = None  # the paper table the sweep mirrors (the report's fidelity section)
    # the equivalence margin: a number (metric units), "1%" of the baseline's mean, or {metric: either}
    margin: Margin = None
    # the final metric as the mean of each trial's last k evaluations (orchestrator.report.curves); 1: the last
    final_evals: Annotated[Int, Field(ge=1, description="an integer >= 1 (evaluations averaged)")] = 1


@dataclass(kw_only=True, config=CONFIG)
class BudgetSpec:
    """``decide.budget``: what the waves may cost at most, in one or more units, each a limit
    (``orchestrator.decide.budget``: a comparison the budget cannot pay for ends "inconclusive at budget")."""

    trials: Annotated[Int, Field(ge=1)] | None = None  # trials launched in all, the first wave included
    core_hours: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = None  # trial wall hours x cores, summed
    gpu_hours: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = None  # trial wall hours x GPUs, summed

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetSpec:
        if self.trials is None and self.core_hours is None and self.gpu_hours is None:
            raise ValueError(f"empty; give one or more of {', '.join(BUDGET_UNITS)}, such as {{trials: 60}} or "
                             "{core_hours: 2}")
        return self

    def words(self) -> str:
        """``60 trials, 2 core-hours``."""
        return ", ".join(f"{getattr(self, k):g} {w}" for k, w in BUDGET_UNITS.items() if getattr(self, k) is not None)


@dataclass(kw_only=True, config=CONFIG)
class DecideSpec:
    """``decide:``: seeds in waves until every comparison is decided (``lime sweep run --until-decided``;
    ``orchestrator.sweep.decide``). The file's ``grid.seed`` is the first wave."""

    max_seeds: Annotated[Int, Field(ge=2, le=MAX_SEEDS, description="an integer >= 2 (seeds per arm at most)")] = 32
    wave: Annotated[Int, Field(ge=1, le=100, description="an integer >= 1 (seeds added per wave)")] = 2
    margin: Margin = None  # overrides report.margin for the sweep
    budget: Annotated[BudgetSpec | None, Field(description="a mapping like {trials: 60} or {core_hours: 2}")] = None


@dataclass(kw_only=True, config=CONFIG)
class AnalysisSpec:
    enabled: Bool = False


def with_options(spec: Any, until_decided: bool, max_seeds: str | None, margin: str | None,
                 budget: str | None = None) -> Any:
    """The sweep with ``--until-decided [--max-seeds N] [--margin M] [--budget B]`` applied (a ConfigError
    line for a bad value, or for a sweep that cannot grow in waves). Torch-free: the flags are checked with the
    file, before Ray, MLflow or torch load."""
    if not until_decided and spec.decide is None:
        if max_seeds is not None or margin is not None or budget is not None:
            raise ConfigError("--max-seeds/--margin/--budget: only with --until-decided (or a decide: block in the "
                              "file)")
        return spec
    dec = copy.copy(spec.decide) if spec.decide is not None else DecideSpec()
    if max_seeds is not None:
        try:
            n = int(max_seeds)
        except ValueError:
            n = 0
        if not 2 <= n <= MAX_SEEDS or str(max_seeds).strip() != str(n):
            raise ConfigError(f"--max-seeds: must be an integer in [2, {MAX_SEEDS}] (seeds per arm at most, as "
                              f"decide.max_seeds), got {max_seeds!r}")
        axis = next((a for a in spec.grid if key_of(a) == SEED), None)
        first = len(spec.grid[axis]) if axis is not None else 0
        if axis is not None and n <= first:  # the first wave (the file's seeds) always runs: no wave could add one
            raise ConfigError(f"--max-seeds: {n} is not above the first wave's {first} seeds (grid.{axis}): no wave "
                              f"could add a seed; give more than {first}")
        dec.max_seeds = n
    if margin is not None:
        if not margin.strip():  # parse_margins reads "" as no margin: a flag given empty is a mistake
            raise ConfigError("--margin: empty; give an absolute margin (0.01) or a percentage of the baseline's "
                              "mean (1%), or leave the flag out")
        dec.margin = margins_text(parse_margins(margin, "--margin"))
        metric = spec.report.metric
        if margin_for(parse_margins(dec.margin), metric, metric) is None:
            raise ConfigError(f"--margin: names a margin for {margin.partition('=')[0].strip()!r} only, but the waves "
                              f"compare {metric}; give its margin (0.01, 1% or {metric}=0.01)")
    if budget is not None:
        dec.budget = parse_budget(budget)
    new = copy.copy(spec)
    new.decide = dec
    try:
        check_decide(new)
    except FieldError as e:
        raise ConfigError(f"{spec.path or spec.name}: {e.at or 'decide'}: {e}") from None
    return new


def parse_budget(text: str) -> BudgetSpec:
    """``--budget trials=60`` (or ``core_hours=2``, ``gpu_hours=1``; several joined by ','): the file's
    ``decide.budget`` from the command line; a bad one is one ConfigError line naming the flag."""
    kw: dict[str, str] = {}
    for part in str(text).split(","):
        key, eq, value = (s.strip() for s in part.partition("="))
        key = key.replace("-", "_")
        if not eq or key not in BUDGET_UNITS or key in kw or not value:
            raise ConfigError(f"--budget: must be KEY=VALUE with KEY one of {', '.join(BUDGET_UNITS)} (such as "
                              f"trials=60 or core_hours=2; several joined by ','), got {text!r}")
        kw[key] = value
    out: dict[str, float] = {}
    for key, value in kw.items():
        try:
            x = float(int(value)) if key == "trials" else float(value)
        except ValueError:
            x = math.nan
        if not (x >= 1 if key == "trials" else math.isfinite(x) and x > 0):
            what = ("an integer >= 1 (trials launched in all)" if key == "trials" else
                    f"a number > 0 ({BUDGET_UNITS[key]})")
            raise ConfigError(f"--budget: {key} must be {what}, as decide.budget.{key}; got {value!r}")
        out[key] = x
    return BudgetSpec(**{k: int(v) if k == "trials" else v for k, v in out.items()})
