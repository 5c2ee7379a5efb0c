"""The sweep file as typed data: ``SweepSpec`` and its blocks, and how it expands into trials.

Each block is a pydantic dataclass that rejects unknown keys; the field types and bounds say
what a file may hold (``orchestrator.core.validation`` turns a mismatch into one line naming the key
path), and the validators apply the rules of ``orchestrator.sweep.checks``. Validating a mapping
into ``SweepSpec`` (``orchestrator.sweep.spec.parse_spec``) is the whole file check except the
trials themselves, which ``parse_spec`` builds and validates next.

Trial ids are readable and deterministic: the grid axes as written, in file order
(``router=full,seed=2``, ``variant=lime,seed=0``); the same file always gives the same ids.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from lime_arch.errors import ConfigError
from orchestrator.core.keys import VARIANT
from orchestrator.core.validation import CONFIG, Bool, Float, Int, Mapping, Str
from orchestrator.engine.data import check_source
from orchestrator.engine.trial_config import TrainConfig, TrialConfig, set_dotted
from orchestrator.sweep.checks import (
    SEED,
    SearchParam,
    check_tune,
    format_value,
    key_of,
    metric_mode,
    parse_grid,
    parse_space,
    report_defaults,
    search_seeds,
)

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
# (ray: Ray's experiments; bench, analysis: `lime bench` and `lime analyze`; dashboard: the dashboard
# check), and its MLflow experiment is named after it (lime-train, lime-bench: `lime train`'s and
# `lime bench`'s experiments).
RESERVED_NAMES = {"ray": "results/ray holds every sweep's Ray experiment",
                  "bench": "results/bench holds `lime bench`'s output",
                  "analysis": "results/analysis holds `lime analyze`'s output",
                  "dashboard": "results/dashboard holds the dashboard check's screenshots",
                  "lime-train": "the MLflow experiment of `lime train`",
                  "lime-bench": "the MLflow experiment of `lime bench`"}


def _empty_is_default(v: Any) -> Any:
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


@dataclass(kw_only=True, config=CONFIG)
class AnalysisSpec:
    enabled: Bool = False


@dataclasses.dataclass(kw_only=True)
class Trial:
    trial_id: str
    params: dict[str, Any]  # axis name (as written) -> value
    config: TrialConfig


def _block(cls: type, words: str):
    return Annotated[cls, BeforeValidator(_empty_is_default), Field(description=words)]


@dataclass(kw_only=True, config=CONFIG)
class SweepSpec:
    name: Name
    description: Annotated[Str, Field(description="one line of text")]
    extends: Str | None = None  # the parent file's name; orchestrator.sweep.files applies it
    replace: list[Str] | None = None  # mappings that replace the parent's (applied with extends)
    base: Annotated[Mapping, BeforeValidator(_empty_is_default),
                    Field(description="a mapping (preset, model, data, optim, train)")] = field(default_factory=dict)
    # file order; grid.variant is a mapping name -> overrides (iterating it gives the names)
    grid: Annotated[dict[str, list | dict], BeforeValidator(parse_grid)] = field(default_factory=dict)
    search: SearchSpec | None = None
    resources: _block(Resources, "a mapping like {cpu: 1, gpu: 0}") = field(default_factory=Resources)
    max_concurrent: Annotated[Int, Field(ge=1)] | None = None
    max_failures: Annotated[Int, Field(ge=0)] = 2
    checkpoint_interval: Annotated[Int, Field(ge=0)] | None = None  # None: the base's, else max(log, steps // 5)
    report: _block(ReportSpec, "a mapping like {metric: final/val_loss, axis: router, baseline: none, alpha: 0.05}"
                   ) = field(default_factory=ReportSpec)
    analysis: _block(AnalysisSpec, "a mapping like {enabled: false}") = field(default_factory=AnalysisSpec)
    path: str | None = field(default=None, init=False)  # the file it came from
    text: str = field(default="", init=False)  # the file's text (logged on the parent MLflow run)
    resolved: dict[str, Any] = field(default_factory=dict, init=False)  # the file with its extends applied
    trial_cache: tuple[str, list] | None = field(default=None, init=False, repr=False, compare=False)  # trials()

    @property
    def report_stated(self) -> tuple[str, ...]:
        """The report settings the file (or a file it extends) writes; the others are defaults."""
        rep = self.resolved.get("report")
        keys = ("metric", "axis", "baseline", "alpha", "mode", "tune", "paper")
        return tuple(k for k in keys if isinstance(rep, dict) and k in rep)

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_NAMES:
            raise ValueError(f"{name!r} is reserved ({RESERVED_NAMES[name]}); reserved names: "
                             f"{', '.join(RESERVED_NAMES)}")
        return name

    @field_validator("description")
    @classmethod
    def _one_line(cls, desc: str) -> str:
        if not desc.strip() or "\n" in desc.strip():
            raise ValueError(f"must be one line of text, got {desc!r}")
        return desc.strip()

    @model_validator(mode="after")
    def _between_blocks(self) -> SweepSpec:
        if self.search is not None:
            s = self.search
            s.seeds = search_seeds(self.grid, s.space, s.repeat)
            s.repeat = len(s.seeds) if s.seeds else (s.repeat or 1)
            self.grid = {a: v for a, v in self.grid.items() if key_of(a) != "train.seed"}  # the Repeater's seeds
        r, grid = self.report, (None if self.search is not None else self.grid)
        r.axis, r.baseline = report_defaults(r.axis, r.baseline, self.axes(), grid, AUTO)
        check_tune(r.tune, r.axis, self.axes(), grid)
        if r.mode is None:
            searched = self.search is not None and self.search.metric == r.metric
            r.mode = self.search.mode if searched else metric_mode(r.metric)
        return self

    # -- trials -----------------------------------------------------------------------------------
    @staticmethod
    def key(axis: str) -> str:
        """The dotted config key of an axis name (alias or dotted key)."""
        return key_of(axis)

    def trial_config(self, params: dict[str, Any]) -> TrialConfig:
        """The validated TrialConfig of one trial: base + axis values (+ the sweep's settings).

        ``params`` maps axis names (grid axes or search keys, as written) to values; a search
        trial's ``__trial_index__`` (Ray's Repeater) selects its seed."""
        d = copy.deepcopy(self.base)
        for name, value in params.items():
            if name == VARIANT and isinstance(self.grid.get(VARIANT), dict):
                for k, v in self.variant(value).items():
                    set_dotted(d, self.key(k), copy.deepcopy(v))
            elif name != "__trial_index__":
                set_dotted(d, self.key(name), copy.deepcopy(value))
        if "__trial_index__" in params and self.search is not None:
            set_dotted(d, "train.seed", self.seed_of(int(params["__trial_index__"])))
        train = d.setdefault("train", {})
        if not isinstance(train, dict):
            raise ConfigError("train: must be a mapping")
        if self.checkpoint_interval is not None:
            train["checkpoint_interval"] = self.checkpoint_interval
        elif not train.get("checkpoint_interval"):
            defaults = TrainConfig()
            steps, log = train.get("steps", defaults.steps), train.get("log_interval", defaults.log_interval)
            if isinstance(steps, int) and isinstance(log, int):
                train["checkpoint_interval"] = max(log, steps // 5, 1)
        if train.get("threads") is None:
            train["threads"] = max(1, int(self.resources.cpu))
        if self.analysis.enabled:
            train.setdefault("analyze", True)  # end-of-trial representation analysis
        _absolute_paths(d)
        cfg = TrialConfig.from_dict(d)
        w = self.resources.workers
        if cfg.train.batch_size % w:
            raise ConfigError(f"resources.workers: {w} workers split each global batch by rows, but "
                              f"train.batch_size is {cfg.train.batch_size}; use a multiple of {w}")
        check_source(cfg.data)  # files exist, task parameters fit: before Ray starts
        return cfg

    def variant(self, name: Any) -> dict[str, Any]:
        """The overrides of a named variant (keys as written)."""
        variants = self.grid.get(VARIANT)
        if not isinstance(variants, dict) or not isinstance(name, str) or name not in variants:
            raise ConfigError(f"{VARIANT}: no variant {name!r}; variants: {', '.join(variants or {}) or '(none)'}")
        return variants[name]

    def seed_of(self, index: int) -> int:
        """The seed of a search trial's ``index``-th repeat: grid.seed's, else the base seed + index."""
        if self.search is not None and self.search.seeds:
            return self.search.seeds[index]
        train = self.base.get("train")
        return int(train.get("seed", 0) if isinstance(train, dict) else 0) + index

    def trial_id(self, params: dict[str, Any]) -> str:
        if not params:
            return "base"
        return ",".join(f"{k}={format_value(v)}" for k, v in params.items())

    def trials(self) -> list[Trial]:
        """The grid's trials in file order (first axis slowest). A search sweep has none up front.

        Built once per grid (validation builds them, the driver and the dry run read them; the
        Ray workers get them with the pickled spec): treat the configs as read-only, or copy them
        (``config_of``)."""
        if self.search is not None:
            return []
        key = json.dumps(self.grid, sort_keys=True, default=str)
        if self.trial_cache is None or self.trial_cache[0] != key:
            axes = list(self.grid)
            out = []
            for combo in itertools.product(*(self.grid[a] for a in axes)):
                params = dict(zip(axes, combo))
                out.append(Trial(trial_id=self.trial_id(params), params=params, config=self.trial_config(params)))
            self.trial_cache = (key, out)
        return self.trial_cache[1]

    def config_of(self, params: dict[str, Any]) -> TrialConfig:
        """A fresh copy of the config of the trial with these axis values (built if it is not a
        grid trial: a search trial's sampled values)."""
        values = {k: v for k, v in params.items() if not k.startswith("__")}
        for t in self.trials():
            if t.params == values:
                return copy.deepcopy(t.config)
        return self.trial_config(params)

    def expand(self) -> list[tuple[str, TrialConfig]]:
        return [(t.trial_id, t.config) for t in self.trials()]

    def n_trials(self) -> int:
        if self.search is not None:
            return self.search.num_samples * self.search.repeat
        return math.prod(len(v) for v in self.grid.values()) if self.grid else 1

    def axes(self) -> list[str]:
        return list(self.search.space) if self.search is not None else list(self.grid)

    def seed_axis(self) -> str | None:
        """The grid axis that holds the seeds (``seed`` or ``train.seed``), if there is one."""
        return next((a for a in self.grid if key_of(a) == SEED), None)

    def with_seeds(self, seeds: list) -> SweepSpec:
        """This grid sweep with other values of its seed axis (the rest shared, not copied)."""
        axis = self.seed_axis()
        if axis is None or self.search is not None:
            raise ConfigError("grid.seed: the sweep has no seed axis")
        new = copy.copy(self)
        new.grid = {a: (list(seeds) if a == axis else v) for a, v in self.grid.items()}
        return new

    def fingerprint(self) -> str:
        """A hash of everything that defines the trials (not the description or the report).

        Unchanged since the first launches: it decides whether a launch may resume a sweep."""
        res = dataclasses.asdict(self.resources)
        for k, default in (("workers", 1), ("parallel", "ddp")):  # added later: absent unless set
            if res.get(k) == default:
                res.pop(k)
        d = {"base": self.base, "grid": self.grid, "resources": res,
             "checkpoint_interval": self.checkpoint_interval,
             "search": dataclasses.asdict(self.search) if self.search else None}
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def trial_dirname(trial_id: str) -> str:
    """A folder name for a trial id (no '/', bounded length, still readable)."""
    s = re.sub(r"[^A-Za-z0-9=,._+:-]", "_", trial_id)
    if len(s) > 120:
        s = s[:100] + "-" + hashlib.sha1(trial_id.encode()).hexdigest()[:12]
    return s


def _absolute_paths(d: dict) -> None:
    """Ray runs trials in other folders: make local data paths absolute (relative to the cwd)."""
    data = d.get("data")
    if not isinstance(data, dict):
        return
    if isinstance(data.get("paths"), list):
        data["paths"] = [os.path.abspath(os.path.expanduser(p)) if isinstance(p, str) else p
                         for p in data["paths"]]
    name = data.get("hf_name")
    if isinstance(name, str) and (name.startswith((".", "/", "~")) or os.path.isdir(name)):
        data["hf_name"] = os.path.abspath(os.path.expanduser(name))
