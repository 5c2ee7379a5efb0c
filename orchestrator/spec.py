"""Sweep files (``sweeps/<name>.yaml``): parse, validate, expand into trials.

A sweep file is a base ``TrialConfig`` plus grid axes (the cross product is the trial set) or an
Optuna ``search`` block, plus how the trials run (resources, concurrency, failures, checkpoints)
and what the report compares. The format is documented in README.md ("Sweeps").

Everything is checked here, before Ray or MLflow is touched: unknown keys, unknown routers or
presets, bad numbers, a grid combined with a search over the same key, empty grids, missing data
files, and every expanded trial's ``TrialConfig.validate``. Each mistake is one ``ConfigError``
line naming the file, the key path in it (``search.space.lr.loguniform``) and what is allowed.

Trial ids are readable and deterministic: the grid axes as written, in file order
(``router=full,seed=2``); the same file always gives the same ids.
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
from pathlib import Path
from typing import Any

import yaml

from lime_arch import ConfigError, ModelConfig

from .config import DataConfig, OptimConfig, TrainConfig, TrialConfig, set_dotted

# Shorthand names for grid and search keys (the report axis uses these names too).
ALIASES: dict[str, str] = {
    "router": "model.router",
    "n_layers": "model.n_layers",
    "d_model": "model.d_model",
    "seed": "train.seed",
    "steps": "train.steps",
    "lr": "optim.lr",
    "router_lr": "optim.router_lr",
    "router_lr_mult": "optim.router_lr_mult",
    "preset": "preset",
    "router_init": "model.router_init",
}
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
        return TrialConfig.from_dict(d)

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


# -- parsing ----------------------------------------------------------------------------------------
def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read and fully validate a sweep file (every trial is built and validated)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such sweep file" + _available(p))
    text = p.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    try:
        return parse_spec(data, stem=p.stem, path=str(path), text=text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _available(p: Path) -> str:
    folder = p.parent if str(p.parent) else Path(".")
    names = sorted(f.stem for f in folder.glob("*.yaml")) if folder.is_dir() else []
    return f"; sweeps in {folder}: {', '.join(names)}" if names else ""


def parse_spec(data: Any, *, stem: str | None = None, path: str | None = None, text: str = "") -> SweepSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"(top level): must be a mapping with keys {', '.join(TOP_KEYS)}")
    _unknown(data, TOP_KEYS, "")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"name: required, lowercase letters, digits and '-' ([a-z0-9][a-z0-9-]*), got {name!r}")
    if stem is not None and name != stem:
        raise ConfigError(f"name: {name!r} must equal the file name {stem!r}")
    desc = data.get("description")
    if not isinstance(desc, str) or not desc.strip() or "\n" in desc.strip():
        raise ConfigError(f"description: required, one line of text, got {desc!r}")
    base = data.get("base", {})
    if base is None:
        base = {}
    if not isinstance(base, dict):
        raise ConfigError(f"base: must be a mapping (preset, model, data, optim, train), got {base!r}")
    spec = SweepSpec(name=name, description=desc.strip(), base=copy.deepcopy(base), path=path, text=text)
    spec.grid = _parse_grid(data.get("grid"))
    spec.resources = _parse_resources(data.get("resources"))
    spec.max_concurrent = _int(data, "max_concurrent", lo=1, default=None, allow_none=True)
    spec.max_failures = _int(data, "max_failures", lo=0, default=2)
    spec.checkpoint_interval = _int(data, "checkpoint_interval", lo=0, default=None, allow_none=True)
    spec.analysis = _parse_analysis(data.get("analysis"))
    spec.search = _parse_search(data.get("search"), spec.grid)
    if spec.search is not None and "seed" in spec.grid:
        del spec.grid["seed"]  # the seeds of the Repeater (see _parse_search)
    spec.report = _parse_report(data.get("report"), spec)
    _validate_trials(spec)
    return spec


def _unknown(d: dict, allowed, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{where}{k}: unknown key; allowed: {', '.join(allowed)}")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any, where: str, what: str = "a number") -> float:
    if isinstance(v, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    if not _is_num(v):
        raise ConfigError(f"{where}: must be {what}, got {v!r}")
    return v


def _int(d: dict, key: str, *, lo: int, default, allow_none: bool = False, where: str = "") -> Any:
    if key not in d:
        return default
    v = d[key]
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{where}{key}: must be an integer >= {lo}, got {v!r}")
    return v


def resolve_key(name: Any, where: str) -> str:
    """An axis name (alias or dotted key) -> the dotted config key, or a ConfigError."""
    hint = f"use an alias ({', '.join(ALIASES)}) or a dotted key such as optim.lr, model.n_heads, data.task.n_ops"
    if not isinstance(name, str):
        raise ConfigError(f"{where}: keys must be strings, got {name!r}")
    if name in ALIASES:
        return ALIASES[name]
    parts = name.split(".")
    if len(parts) < 2 or parts[0] not in SECTIONS:
        raise ConfigError(f"{where}: unknown key; {hint}")
    cls = SECTIONS[parts[0]]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if parts[1] not in fields:
        raise ConfigError(f"{where}: unknown key; allowed {parts[0]} fields: {', '.join(sorted(fields))}")
    if len(parts) > 2 and not (parts[0] == "data" and parts[1] == "task"):
        raise ConfigError(f"{where}: {parts[0]}.{parts[1]} has no sub-keys")
    return name


def _parse_grid(grid: Any) -> dict[str, list]:
    if grid is None:
        return {}
    if not isinstance(grid, dict):
        raise ConfigError(f"grid: must be a mapping of axis -> list of values, got {grid!r}")
    out: dict[str, list] = {}
    seen: dict[str, str] = {}
    for name, values in grid.items():
        where = f"grid.{name}"
        key = resolve_key(name, where)
        if key in seen:
            raise ConfigError(f"{where}: the same key as grid.{seen[key]} ({key})")
        seen[key] = name
        if not isinstance(values, list):
            raise ConfigError(f"{where}: must be a list of values, got {values!r}")
        if not values:
            raise ConfigError(f"{where}: empty list; give at least one value")
        ids = [format_value(v) for v in values]
        for i, s in enumerate(ids):
            if s in ids[:i]:
                raise ConfigError(f"{where}[{i}]: duplicate value {values[i]!r}")
        out[name] = list(values)
    return out


def _parse_resources(r: Any) -> Resources:
    if r is None:
        return Resources()
    if not isinstance(r, dict):
        raise ConfigError(f"resources: must be a mapping like {{cpu: 1, gpu: 0}}, got {r!r}")
    _unknown(r, ("cpu", "gpu"), "resources.")
    cpu = _num(r.get("cpu", 1), "resources.cpu", "a number > 0 (fractions allowed)")
    gpu = _num(r.get("gpu", 0), "resources.gpu", "a number >= 0 (fractions allowed)")
    if cpu <= 0:
        raise ConfigError(f"resources.cpu: must be a number > 0 (fractions allowed), got {cpu!r}")
    if gpu < 0:
        raise ConfigError(f"resources.gpu: must be a number >= 0 (fractions allowed), got {gpu!r}")
    if gpu > 1 and gpu != int(gpu):
        raise ConfigError(f"resources.gpu: above 1 must be a whole number, got {gpu!r}")
    return Resources(cpu=float(cpu), gpu=float(gpu))


def _parse_analysis(a: Any) -> AnalysisSpec:
    if a is None:
        return AnalysisSpec()
    if not isinstance(a, dict):
        raise ConfigError(f"analysis: must be a mapping like {{enabled: false}}, got {a!r}")
    _unknown(a, ("enabled",), "analysis.")
    en = a.get("enabled", False)
    if not isinstance(en, bool):
        raise ConfigError(f"analysis.enabled: must be true or false, got {en!r}")
    return AnalysisSpec(enabled=en)


def _metric(v: Any, where: str) -> str:
    if not isinstance(v, str) or not METRIC_RE.match(v):
        raise ConfigError(f"{where}: must be a metric key such as final/val_loss or val/accuracy, got {v!r}")
    return v


def _parse_search(s: Any, grid: dict[str, list]) -> SearchSpec | None:
    if s is None:
        return None
    if not isinstance(s, dict):
        raise ConfigError(f"search: must be a mapping with keys {', '.join(SEARCH_KEYS)}, got {s!r}")
    _unknown(s, SEARCH_KEYS, "search.")
    out = SearchSpec()
    out.metric = _metric(s.get("metric", out.metric), "search.metric")
    out.mode = s.get("mode", "min")
    if out.mode not in ("min", "max"):
        raise ConfigError(f"search.mode: must be min or max, got {out.mode!r}")
    out.num_samples = _int(s, "num_samples", lo=1, default=8, where="search.")
    out.seed = _int(s, "seed", lo=0, default=0, where="search.")
    out.repeat = _int(s, "repeat", lo=1, default=1, where="search.")
    space = s.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError("search.space: required, a mapping of key -> {loguniform|uniform|int|choice: [...]}")
    keys: dict[str, str] = {}
    for name, dist in space.items():
        where = f"search.space.{name}"
        key = resolve_key(name, where)
        if key in keys:
            raise ConfigError(f"{where}: the same key as search.space.{keys[key]} ({key})")
        keys[key] = name
        if key == "train.seed":
            raise ConfigError(f"{where}: seeds are not searched; use search.repeat or grid.seed: [...]")
        out.space[name] = _parse_dist(name, key, dist, where)
    for gname in grid:
        gkey = SweepSpec.key(gname)
        if gkey in keys:
            raise ConfigError(f"grid.{gname}: also searched in search.space.{keys[gkey]}; a key is either a "
                              "grid axis or searched, not both")
        if gkey != "train.seed":
            raise ConfigError(f"grid.{gname}: a grid cannot be combined with search (Optuna samples every "
                              f"trial); use search.space.{gname}: {{choice: [...]}} or separate sweeps; "
                              "only grid.seed is allowed (the repeat seeds)")
    if "seed" in grid or "train.seed" in grid:
        gname = "seed" if "seed" in grid else "train.seed"
        seeds = grid[gname]
        for i, v in enumerate(seeds):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"grid.{gname}[{i}]: seeds must be integers >= 0, got {v!r}")
        if "repeat" in s and out.repeat != len(seeds):
            raise ConfigError(f"search.repeat: {out.repeat} differs from the {len(seeds)} seeds of grid.{gname}; "
                              "give one of them")
        out.seeds, out.repeat = list(seeds), len(seeds)
    asha = s.get("asha")
    if asha is not None:
        if not isinstance(asha, dict):
            raise ConfigError(f"search.asha: must be a mapping like {{grace_period: 50}}, got {asha!r}")
        _unknown(asha, ASHA_KEYS, "search.asha.")
        if "grace_period" not in asha:
            raise ConfigError("search.asha.grace_period: required (training steps before a trial can be stopped)")
        gp = _int(asha, "grace_period", lo=1, default=None, where="search.asha.")
        rf = _int(asha, "reduction_factor", lo=2, default=3, where="search.asha.")
        out.asha = AshaSpec(grace_period=gp, reduction_factor=rf)
    return out


def _parse_dist(name: str, key: str, dist: Any, where: str) -> SearchParam:
    if not isinstance(dist, dict) or len(dist) != 1:
        raise ConfigError(f"{where}: must be one of {{loguniform: [low, high]}}, {{uniform: [low, high]}}, "
                          f"{{int: [low, high]}}, {{choice: [a, b, ...]}}; got {dist!r}")
    (kind, args), = dist.items()
    w = f"{where}.{kind}"
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{w}: unknown distribution; allowed: {', '.join(DISTRIBUTIONS)}")
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{w}: must be a non-empty list of values, got {args!r}")
        ids = [format_value(v) for v in args]
        for i, sid in enumerate(ids):
            if sid in ids[:i]:
                raise ConfigError(f"{w}[{i}]: duplicate value {args[i]!r}")
        return SearchParam(name=name, key=key, kind=kind, values=tuple(args))
    if not isinstance(args, list) or len(args) != 2:
        raise ConfigError(f"{w}: must be [low, high], got {args!r}")
    if kind == "int":
        lo, hi = args
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)) or lo >= hi:
            raise ConfigError(f"{w}: must be two integers low < high (both inclusive), got {args!r}")
        return SearchParam(name=name, key=key, kind=kind, values=(lo, hi))
    lo, hi = (_num(v, w, "[low, high] with numbers") for v in args)
    if kind == "loguniform" and not 0 < lo < hi:
        raise ConfigError(f"{w}: bounds must satisfy 0 < low < high, got {args!r}")
    if kind == "uniform" and not lo < hi:
        raise ConfigError(f"{w}: bounds must satisfy low < high, got {args!r}")
    return SearchParam(name=name, key=key, kind=kind, values=(float(lo), float(hi)))


def _parse_report(r: Any, spec: SweepSpec) -> ReportSpec:
    out = ReportSpec()
    if r is None:
        r = {}
    if not isinstance(r, dict):
        raise ConfigError(f"report: must be a mapping like {{metric: final/val_loss, axis: router, baseline: none}}, "
                          f"got {r!r}")
    _unknown(r, ("metric", "axis", "baseline"), "report.")
    out.metric = _metric(r.get("metric", out.metric), "report.metric")
    axes = spec.axes()
    # defaults: router vs none when router is an axis, else the first non-seed axis vs its first value
    if "axis" not in r and axes and not any(spec.key(a) == "model.router" for a in axes):
        others = [a for a in axes if spec.key(a) != "train.seed"] or axes
        out.axis = others[0]
    axis = r.get("axis", out.axis)
    if not isinstance(axis, str):
        raise ConfigError(f"report.axis: must be an axis name, got {axis!r}")
    out.axis = axis
    if "baseline" in r:
        out.baseline = r["baseline"]
    elif spec.search is None and axes:
        values = next((v for a, v in spec.grid.items() if spec.key(a) == spec.key(axis)), None)
        if values and not any(_same(out.baseline, v) for v in values):
            out.baseline = values[0]
    if axes or "axis" in r:
        key = resolve_key(axis, "report.axis")
        match = [a for a in axes if spec.key(a) == key]
        if not match:
            raise ConfigError(f"report.axis: {axis!r} is not an axis of this sweep; "
                              f"axes: {', '.join(axes) or '(none)'}")
        if spec.search is None:
            values = spec.grid[match[0]]
            if not any(_same(out.baseline, v) for v in values):
                raise ConfigError(f"report.baseline: {out.baseline!r} is not a value of grid.{match[0]} "
                                  f"({', '.join(format_value(v) for v in values)})")
    return out


def _same(a: Any, b: Any) -> bool:
    if _is_num(a) and _is_num(b):
        return float(a) == float(b)
    return format_value(a) == format_value(b)


# -- trial validation -------------------------------------------------------------------------------
def _validate_trials(spec: SweepSpec) -> None:
    """Build and validate every trial; name the key in the file that a failure comes from."""
    def check(params: dict, where_first: str | None = None) -> None:
        try:
            spec.trial_config(params)
        except ConfigError as e:
            raise ConfigError(_attribute(spec, params, str(e), where_first)) from None

    check({})  # the base alone (no axis values yet) is where most mistakes are
    if spec.search is None:
        for name, values in spec.grid.items():
            for i, v in enumerate(values):
                check({name: v}, f"grid.{name}[{i}]")
        for t in itertools.product(*spec.grid.values()):
            check(dict(zip(spec.grid, t)))
        return
    space = spec.search.space
    idx = {"__trial_index__": spec.search.repeat - 1}
    for name, p in space.items():
        for v in _probe_values(p):
            check({name: v, **idx}, f"search.space.{name}.{p.kind}")
    for corner in (0, -1):  # all lows, all highs together
        check({n: _probe_values(p)[corner] for n, p in space.items()})


def _probe_values(p: SearchParam) -> list:
    if p.kind == "choice":
        return list(p.values)
    if p.kind == "int":
        return [int(p.values[0]), int(p.values[1])]
    return [p.values[0], p.values[1]]


def _attribute(spec: SweepSpec, params: dict, msg: str, where_first: str | None) -> str:
    """Prefix an error with the key path in the file: base.*, grid.axis[i] or search.space.*."""
    if not params:
        return _prefixed("base", msg)
    if where_first is not None:
        name = next(iter(k for k in params if k != "__trial_index__"))
        key = spec.key(name)
        if msg.startswith(key + ":"):
            return f"{where_first}: {msg[len(key) + 1:].strip()}"
        return f"{where_first} ({format_value(params[name])}): {msg}"
    return f"trial {spec.trial_id({k: v for k, v in params.items() if k != '__trial_index__'})}: {msg}"


def _prefixed(prefix: str, msg: str) -> str:
    head = msg.split(":", 1)[0]
    if re.fullmatch(r"[A-Za-z0-9_./]+", head):
        return f"{prefix}.{msg}"
    return f"{prefix}: {msg}"


# -- compute estimate (dry run) -----------------------------------------------------------------------
TOKENIZER_VOCAB = {"byte": 257}


def vocab_for(cfg: TrialConfig) -> tuple[int, str]:
    """The vocabulary the model will have, without loading any data: (size, where it comes from)."""
    if "vocab_size" in cfg.model:
        return int(cfg.model["vocab_size"]), "set in model"
    d = cfg.data
    if d.source in ("builtin", "text"):
        if d.tokenizer == "byte":
            return TOKENIZER_VOCAB["byte"], "byte tokenizer"
        return d.bpe_vocab_size, f"bpe {d.bpe_vocab_size}"
    if d.source == "hf":
        return cfg.model_config().vocab_size, "vocab from tokenizer (preset's shown)"
    try:  # synthetic tasks: a fixed character vocabulary
        from .tasks import TASKS

        if d.source in TASKS:
            return TASKS[d.source].vocab.size, f"{d.source} vocabulary"
    except Exception:  # noqa: BLE001 - the estimate falls back to the preset's vocabulary
        pass
    return cfg.model_config().vocab_size, "preset's vocabulary"


def estimate(cfg: TrialConfig) -> dict[str, Any]:
    """Tokens, parameters and training FLOPs (3x forward) of one trial."""
    from lime_arch import flops_per_token, param_counts

    vocab, vocab_src = vocab_for(cfg)
    mcfg = cfg.model_config(vocab_size=vocab)
    t = cfg.train
    tokens = t.steps * t.batch_size * t.seq_len * t.grad_accum
    fpt = flops_per_token(mcfg, t.seq_len)["total"]
    counts = param_counts(mcfg)
    return {"tokens": tokens, "flops_per_token": fpt, "train_flops": 3 * fpt * tokens,
            "params": counts["total"], "router_params": counts["router"], "vocab": vocab, "vocab_source": vocab_src,
            "model": mcfg}


def human(n: float, unit: str = "") -> str:
    for div, suf in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suf}{unit}"
    return f"{n:.3g}{unit}"
