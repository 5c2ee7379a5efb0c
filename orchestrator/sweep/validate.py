"""Validation of a sweep file's fields and of every trial it expands into.

``parse_spec`` (in ``orchestrator.sweep.spec``) calls these: one parser per block (``grid``,
``resources``, ``analysis``, ``search`` with its distributions, ``report``), each checking its
keys and values and raising a ``ConfigError`` that names the key path in the file, then
``_validate_trials``, which builds every trial's ``TrialConfig`` and attributes a failure to the
key it comes from (``base.*``, ``grid.<axis>[i]`` or ``search.space.*``). ``resolve_key`` (an
axis name -> its dotted config key) is public and re-exported by ``orchestrator.sweep.spec``.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any

from lime_arch import ConfigError
from orchestrator.sweep.types import (
    ALIASES,
    ASHA_KEYS,
    DISTRIBUTIONS,
    METRIC_RE,
    SEARCH_KEYS,
    SECTIONS,
    AnalysisSpec,
    AshaSpec,
    ReportSpec,
    Resources,
    SearchParam,
    SearchSpec,
    SweepSpec,
    format_value,
)


# -- fields -----------------------------------------------------------------------------------------
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



def _keyed(mapping: dict, section: str):
    """(name, value, where, resolved key) per entry of a grid or search space; two spellings of
    the same key (an alias and its full path) are an error."""
    seen: dict[str, str] = {}
    for name, value in mapping.items():
        where = f"{section}.{name}"
        key = resolve_key(name, where)
        if key in seen:
            raise ConfigError(f"{where}: the same key as {section}.{seen[key]} ({key})")
        seen[key] = name
        yield name, value, where, key

def _parse_grid(grid: Any) -> dict[str, list]:
    if grid is None:
        return {}
    if not isinstance(grid, dict):
        raise ConfigError(f"grid: must be a mapping of axis -> list of values, got {grid!r}")
    out: dict[str, list] = {}
    for name, values, where, _key in _keyed(grid, "grid"):
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
    keys: dict[str, str] = {}  # resolved key -> its name in search.space
    for name, dist, where, key in _keyed(space, "search.space"):
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
