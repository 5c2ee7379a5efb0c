"""The data model of a sweep file: ``SweepSpec`` and its parts, and how it expands into trials.

Holds the format's vocabulary (the ``ALIASES`` of grid/search keys, the allowed keys of each
block), the dataclasses a parsed file becomes (``SweepSpec``, ``SearchSpec``, ``Resources``, ...)
and the expansion of a spec into trials: ``SweepSpec.trial_config`` / ``trials`` / ``trial_id``,
plus ``format_value`` and ``trial_dirname`` for readable, deterministic ids and folder names.
The checks of a file's fields are in ``orchestrator.sweep.validate``; the entry points
(``load_spec``, ``parse_spec``) are in ``orchestrator.sweep.spec``, which re-exports every name here.
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
from dataclasses import dataclass, field
from typing import Any

from lime_arch import ConfigError, ModelConfig
from orchestrator.core.keys import ALIASES as KEY_ALIASES
from orchestrator.engine.config import DataConfig, OptimConfig, TrainConfig, TrialConfig, set_dotted
from orchestrator.engine.data import check_source

# Shorthand names for grid and search keys (the report axis uses these names too).
ALIASES = KEY_ALIASES
SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig}
TOP_KEYS = ("name", "description", "base", "grid", "search", "resources", "max_concurrent", "max_failures",
            "checkpoint_interval", "report", "analysis")
SEARCH_KEYS = ("metric", "mode", "num_samples", "seed", "repeat", "space", "asha")
DISTRIBUTIONS = ("loguniform", "uniform", "int", "choice")
ASHA_KEYS = ("grace_period", "reduction_factor")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
METRIC_RE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\Z")


@dataclass(frozen=True, kw_only=True)
class SearchParam:
    """One searched key: ``name`` as written in the file, ``key`` the dotted config key."""

    name: str
    key: str
    kind: str  # loguniform | uniform | int | choice
    values: tuple  # (low, high) for ranges (int: inclusive), the options for choice


@dataclass(kw_only=True)
class AshaSpec:
    grace_period: int
    reduction_factor: int = 3


@dataclass(kw_only=True)
class SearchSpec:
    metric: str = "final/val_loss"
    mode: str = "min"
    num_samples: int = 8  # sampled configurations; each runs ``repeat`` times (seeds)
    seed: int = 0
    repeat: int = 1
    space: dict[str, SearchParam] = field(default_factory=dict)
    asha: AshaSpec | None = None
    seeds: list[int] | None = None  # explicit repeat seeds (from ``grid.seed``), else base seed + index


@dataclass(kw_only=True)
class Resources:
    cpu: float = 1.0
    gpu: float = 0.0


@dataclass(kw_only=True)
class ReportSpec:
    metric: str = "final/val_loss"
    axis: str = "router"
    baseline: Any = "none"


@dataclass(kw_only=True)
class AnalysisSpec:
    enabled: bool = False


@dataclass(kw_only=True)
class Trial:
    trial_id: str
    params: dict[str, Any]  # axis name (as written) -> value
    config: TrialConfig


@dataclass(kw_only=True)
class SweepSpec:
    name: str
    description: str
    base: dict[str, Any] = field(default_factory=dict)  # a TrialConfig dict (preset + overrides)
    grid: dict[str, list] = field(default_factory=dict)  # axis name as written -> values, file order
    search: SearchSpec | None = None
    resources: Resources = field(default_factory=Resources)
    max_concurrent: int | None = None
    max_failures: int = 2
    checkpoint_interval: int | None = None  # None: the base's, else max(log_interval, steps // 5)
    report: ReportSpec = field(default_factory=ReportSpec)
    analysis: AnalysisSpec = field(default_factory=AnalysisSpec)
    path: str | None = None  # the file it came from
    text: str = ""  # the file's text (logged on the parent MLflow run)

    # -- trials -----------------------------------------------------------------------------------
    @staticmethod
    def key(axis: str) -> str:
        """The dotted config key of an axis name (alias or dotted key)."""
        return ALIASES.get(axis, axis)

    def trial_config(self, params: dict[str, Any]) -> TrialConfig:
        """The validated TrialConfig of one trial: base + axis values (+ the sweep's settings).

        ``params`` maps axis names (grid axes or search keys, as written) to values; a search
        trial's ``__trial_index__`` (Ray's Repeater) selects its seed."""
        d = copy.deepcopy(self.base)
        for name, value in params.items():
            if name == "__trial_index__":
                continue
            set_dotted(d, self.key(name), copy.deepcopy(value))
        if "__trial_index__" in params and self.search is not None:
            i = int(params["__trial_index__"])
            seeds = self.search.seeds
            base_seed = d.get("train", {}).get("seed", 0) if isinstance(d.get("train"), dict) else 0
            set_dotted(d, "train.seed", seeds[i] if seeds else int(base_seed) + i)
        train = d.setdefault("train", {})
        if not isinstance(train, dict):
            raise ConfigError("train: must be a mapping")
        defaults = TrainConfig()
        if self.checkpoint_interval is not None:
            train["checkpoint_interval"] = self.checkpoint_interval
        elif not train.get("checkpoint_interval"):
            steps, log = train.get("steps", defaults.steps), train.get("log_interval", defaults.log_interval)
            if isinstance(steps, int) and isinstance(log, int):
                train["checkpoint_interval"] = max(log, steps // 5, 1)
        if train.get("threads") is None:
            train["threads"] = max(1, int(self.resources.cpu))
        if self.analysis.enabled and "analyze" in {f.name for f in dataclasses.fields(TrainConfig)}:
            train.setdefault("analyze", True)  # end-of-trial representation analysis (issue 8)
        _absolute_paths(d)
        cfg = TrialConfig.from_dict(d)
        check_source(cfg.data)  # files exist, task parameters fit: before Ray starts
        return cfg

    def trial_id(self, params: dict[str, Any]) -> str:
        if not params:
            return "base"
        return ",".join(f"{k}={format_value(v)}" for k, v in params.items())

    def trials(self) -> list[Trial]:
        """The grid's trials in file order (first axis slowest). A search sweep has none up front."""
        if self.search is not None:
            return []
        axes = list(self.grid)
        out = []
        for combo in itertools.product(*(self.grid[a] for a in axes)):
            params = dict(zip(axes, combo))
            out.append(Trial(trial_id=self.trial_id(params), params=params, config=self.trial_config(params)))
        return out

    def expand(self) -> list[tuple[str, TrialConfig]]:
        return [(t.trial_id, t.config) for t in self.trials()]

    def n_trials(self) -> int:
        if self.search is not None:
            return self.search.num_samples * self.search.repeat
        return math.prod(len(v) for v in self.grid.values()) if self.grid else 1

    def axes(self) -> list[str]:
        return list(self.search.space) if self.search is not None else list(self.grid)

    def fingerprint(self) -> str:
        """A hash of everything that defines the trials (not the description or the report)."""
        d = {"base": self.base, "grid": self.grid, "resources": dataclasses.asdict(self.resources),
             "checkpoint_interval": self.checkpoint_interval,
             "search": dataclasses.asdict(self.search) if self.search else None}
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (int, str)):
        return str(v)
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


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
