"""The sweep file as typed data: ``SweepSpec`` (its blocks are in ``orchestrator.sweep.blocks``), and
how it expands into trials.

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
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from lime_arch.errors import ConfigError
from orchestrator.core.keys import VARIANT
from orchestrator.core.validation import CONFIG, Int, Mapping, Str
from orchestrator.engine.sources import check_source
from orchestrator.engine.trial_config import TrainConfig, TrialConfig, set_dotted
from orchestrator.evaluation.settings import EvalSettings
from orchestrator.sweep import limits
from orchestrator.sweep.blocks import (
    AUTO,
    RESERVED_NAMES,
    AnalysisSpec,
    DecideSpec,
    Name,
    ReportSpec,
    Resources,
    SearchSpec,
    empty_is_default,
)
from orchestrator.sweep.checks import (
    SEED,
    check_decide,
    check_tune,
    format_value,
    key_of,
    metric_mode,
    parse_grid,
    report_defaults,
    same,
    search_seeds,
)


@dataclasses.dataclass(kw_only=True)
class Trial:
    trial_id: str
    params: dict[str, Any]  # axis name (as written) -> value
    config: TrialConfig


def _block(cls: type, words: str):
    return Annotated[cls, BeforeValidator(empty_is_default), Field(description=words)]


@dataclass(kw_only=True, config=CONFIG)
class SweepSpec:
    name: Name
    description: Annotated[Str, Field(description="one line of text")]
    extends: Str | None = None  # the parent file's name; orchestrator.sweep.files applies it
    replace: list[Str] | None = None  # mappings that replace the parent's (applied with extends)
    base: Annotated[Mapping, BeforeValidator(empty_is_default),
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
    decide: _block(DecideSpec, "a mapping like {max_seeds: 32, wave: 2, margin: 0.01, budget: {trials: 60}}"
                   ) | None = None
    # downstream tasks of every finished trial's final checkpoint (orchestrator.sweep.evaluate);
    # not part of the trials: adding it to a finished sweep evaluates, it trains nothing again
    eval: Annotated[EvalSettings | None, Field(description="a mapping like {tasks: [paper-table-1], num_fewshot: 3}")
                    ] = None
    path: str | None = field(default=None, init=False)  # the file it came from
    # the folder relative data paths are resolved against: the sweep file's, fixed at load time
    # (Ray runs the trials in other folders: resolving there again would find nothing)
    root: str | None = field(default=None, init=False)
    text: str = field(default="", init=False)  # the file's text (logged on the parent MLflow run)
    resolved: dict[str, Any] = field(default_factory=dict, init=False)  # the file with its extends applied
    only: frozenset[str] | None = field(default=None, init=False)  # a subset of the grid's trial ids (waves)
    trial_cache: tuple[str, list] | None = field(default=None, init=False, repr=False, compare=False)  # trials()

    @property
    def report_stated(self) -> tuple[str, ...]:
        """The report settings the file (or a file it extends) writes; the others are defaults."""
        rep = self.resolved.get("report")
        keys = ("metric", "axis", "baseline", "alpha", "mode", "tune", "paper", "margin")
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
        if self.decide is not None:
            check_decide(self)
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
        _absolute_paths(d, self.root or os.getcwd())
        cfg = TrialConfig.from_dict(d)
        w = self.resources.workers
        if cfg.train.batch_size % w:
            raise ConfigError(f"resources.workers: {w} workers split each global batch by rows, but "
                              f"train.batch_size is {cfg.train.batch_size}; use a multiple of {w}")
        limits.check_model(cfg.model_config(), "model")  # parameters within $LIME_MAX_PARAMS
        check_source(cfg.data)  # files exist, task parameters fit: before Ray starts
        return cfg

    def trial_ids(self) -> list[str]:
        """The ids of ``trials()`` without building their configs."""
        if self.search is not None:
            return []
        ids = [self.trial_id(dict(zip(self.grid, c))) for c in itertools.product(*self.grid.values())]
        return [i for i in ids if self.only is None or i in self.only]

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
        key = json.dumps([self.grid, sorted(self.only) if self.only is not None else None], sort_keys=True,
                         default=str)
        if self.trial_cache is None or self.trial_cache[0] != key:
            axes = list(self.grid)
            out = []
            for combo in itertools.product(*(self.grid[a] for a in axes)):
                params = dict(zip(axes, combo))
                if self.only is not None and self.trial_id(params) not in self.only:
                    continue
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
        if self.only is not None:
            return len(self.trial_ids())
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

    def with_values(self, axis: str, values: list) -> SweepSpec:
        """This grid sweep with only ``values`` of the grid axis ``axis`` (a wave of sequential seeds
        runs the baseline and the undecided variants only; ids stay those of the full grid)."""
        if axis not in self.grid:
            raise ConfigError(f"grid.{axis}: not an axis of the sweep")
        new = copy.copy(self)
        old = self.grid[axis]
        keep = [v for v in old if any(same(v, x) for x in values)]
        new.grid = {a: ({k: old[k] for k in keep} if a == axis and isinstance(old, dict) else
                        keep if a == axis else v) for a, v in self.grid.items()}
        return new

    def restricted(self, ids: set[str] | None) -> SweepSpec:
        """This sweep with only the trials ``ids`` (the union of a sequential sweep's waves: no longer a
        full cross product); None: every trial."""
        new = copy.copy(self)
        new.only = None if ids is None else frozenset(ids)
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


def _absolute_paths(d: dict, root: str) -> None:
    """Local data paths made absolute against ``root`` (the sweep file's folder): the same path in
    the driver, the dry run and every Ray worker, whatever their working directory."""
    data = d.get("data")
    if not isinstance(data, dict):
        return
    if isinstance(data.get("paths"), list):
        data["paths"] = [_anchored(p, root) if isinstance(p, str) else p for p in data["paths"]]
    name = data.get("hf_name")
    if isinstance(name, str) and (name.startswith((".", "/", "~")) or os.path.isdir(os.path.join(root, name))):
        data["hf_name"] = _anchored(name, root)


def _anchored(path: str, root: str) -> str:
    return os.path.normpath(os.path.join(root, os.path.expanduser(path)))
