"""The rules of a sweep file that its field types cannot say, used by the validators of
``orchestrator.sweep.schema``: axis names resolve to config keys, grid axes are non-empty lists
without duplicates, the ``variant`` axis is a mapping of named bundles of overrides that no other
axis touches, a search space is a set of distributions, grid and search do not overlap, and the
report compares a real axis against one of its values (tuning another axis, if it says so).

Each rule raises ``FieldError(message, at=...)`` with the location below the field it checks
(``router[1]``) or, for rules between blocks, from the top of the file (``grid.lr``);
``orchestrator.core.validation`` adds the rest of the key path.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from lime_arch.config import ModelConfig
from orchestrator.core.keys import ALIASES, VARIANT
from orchestrator.core.validation import FieldError
from orchestrator.decide.verdict import margin_for, parse_margins
from orchestrator.engine.trial_config import DataConfig, OptimConfig, TrainConfig

SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig}
DISTRIBUTIONS = ("loguniform", "uniform", "int", "choice")
SEED = "train.seed"
VARIANT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+-]*\Z")  # no '.', '=' or ',': key paths and trial ids
VARIANT_HELP = ("a mapping of variant name -> overrides, such as {llama: {}, lime: {router: full}} "
                "({} is the base as is)")


@dataclass(frozen=True, kw_only=True)
class SearchParam:
    """One searched key: ``name`` as written in the file, ``key`` the dotted config key."""

    name: str
    key: str
    kind: str  # loguniform | uniform | int | choice
    values: tuple  # (low, high) for ranges (int: inclusive), the options for choice


def format_value(v: Any) -> str:
    """A value as it appears in trial ids (and how two values are told apart)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (int, str)):
        return str(v)
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def key_of(axis: str) -> str:
    """The dotted config key of an axis name (alias or dotted key); ``variant`` stays itself."""
    return ALIASES.get(axis, axis)


def metric_mode(metric: str) -> str:
    """Whether a metric is better low or high, from its name (accuracy-like metrics: max)."""
    return "max" if any(w in metric for w in ("acc", "exact", "score")) else "min"


def resolve_key(name: Any, at: str, where: str | None = None) -> str:
    """An axis name (alias or dotted key) -> the dotted config key, or a FieldError at ``at``."""
    hint = f"use an alias ({', '.join(ALIASES)}) or a dotted key such as optim.lr, model.n_heads, data.task.n_ops"
    if not isinstance(name, str):
        raise FieldError(f"keys must be strings, got {name!r}", at)
    if name in ALIASES:
        return ALIASES[name]
    parts = name.split(".")
    if len(parts) < 2 or parts[0] not in SECTIONS:
        raise FieldError(f"unknown key; {hint}", at)
    fields = {f.name for f in dataclasses.fields(SECTIONS[parts[0]])}
    if parts[1] not in fields:
        raise FieldError(f"unknown key; allowed {parts[0]} fields: {', '.join(sorted(fields))}", at)
    if len(parts) > 2 and not (parts[0] == "data" and parts[1] == "task"):
        raise FieldError(f"{parts[0]}.{parts[1]} has no sub-keys", at)
    return name


def _keyed(mapping: dict, section: str):
    """(name, value, resolved key) per entry of a grid or a search space; two spellings of the
    same key (an alias and its dotted key) are an error."""
    seen: dict[str, str] = {}
    for name, value in mapping.items():
        key = resolve_key(name, str(name))
        if key in seen:
            raise FieldError(f"the same key as {section}.{seen[key]} ({key})", name)
        seen[key] = name
        yield name, value, key


def _no_duplicates(values: list, at: str) -> None:
    ids = [format_value(v) for v in values]
    for i, s in enumerate(ids):
        if s in ids[:i]:
            raise FieldError(f"duplicate value {values[i]!r}", f"{at}[{i}]")


def parse_grid(grid: Any) -> dict[str, list | dict]:
    """``grid:`` -> axis name (as written) -> its values, in file order; the ``variant`` axis ->
    variant name -> its overrides (iterating it gives the names, like a list of values)."""
    if grid is None:
        return {}
    if not isinstance(grid, dict):
        raise FieldError(f"must be a mapping of axis -> list of values, got {grid!r}")
    axes = {k: v for k, v in grid.items() if k != VARIANT}
    keys = {}
    for name, values, key in _keyed(axes, "grid"):
        if not isinstance(values, list):
            hint = f" (only grid.{VARIANT} holds named bundles of overrides)" if isinstance(values, dict) else ""
            raise FieldError(f"must be a list of values, got {values!r}{hint}", name)
        if not values:
            raise FieldError("empty list; give at least one value", name)
        _no_duplicates(values, name)
        keys[key] = name
    out: dict[str, list | dict] = {}
    for name, values in grid.items():
        out[name] = parse_variants(values, keys) if name == VARIANT else list(values)
    return out


def parse_variants(variants: Any, axis_keys: dict[str, str]) -> dict[str, dict]:
    """``grid.variant`` -> name -> overrides (keys as written). ``axis_keys``: dotted key -> the
    grid axis that sets it (a variant may not set those)."""
    if variants is None or variants == {}:
        raise FieldError(f"empty; give at least one named bundle: {VARIANT_HELP}", VARIANT)
    if not isinstance(variants, dict):
        raise FieldError(f"must be {VARIANT_HELP}, got {variants!r}", VARIANT)
    out, seen = {}, {}
    for vname, bundle in variants.items():
        if not isinstance(vname, str) or not VARIANT_NAME_RE.match(vname):
            raise FieldError(f"variant names are letters, digits, '_', '+' and '-' (starting with a letter or digit), "
                             f"got {vname!r}", VARIANT)
        at = f"{VARIANT}.{vname}"
        bundle = {} if bundle is None else bundle
        if not isinstance(bundle, dict):
            raise FieldError("must be a mapping of key -> value (an alias or a dotted key: {router: full, "
                             f"optim.lr: 0.003}}); {{}} is the base as is, got {bundle!r}", at)
        keys: dict[str, str] = {}
        for k in bundle:
            key = resolve_key(k, f"{at}.{k}")
            if key in keys:
                raise FieldError(f"the same key as {at}.{keys[key]} ({key})", f"{at}.{k}")
            if key == SEED:
                raise FieldError("a variant does not set the seed (every variant runs every seed of grid.seed)",
                                 f"{at}.{k}")
            if key in axis_keys:
                raise FieldError(f"also an axis of this grid (grid.{axis_keys[key]}); a key is either a grid axis "
                                 "or set by the variants, not both", f"{at}.{k}")
            keys[key] = k
        same_as = json.dumps({key_of(k): v for k, v in bundle.items()}, sort_keys=True, default=str)
        if same_as in seen:
            raise FieldError(f"the same overrides as grid.{VARIANT}.{seen[same_as]}", at)
        seen[same_as] = vname
        out[vname] = dict(bundle)
    return out


SPACE_HELP = "a mapping of key -> {loguniform|uniform|int|choice: [...]}"


def parse_space(space: Any) -> dict[str, SearchParam]:
    """``search.space:`` -> searched name -> its distribution."""
    if not isinstance(space, dict) or not space:
        raise FieldError(f"required, {SPACE_HELP}")
    out = {}
    for name, dist, key in _keyed(space, "search.space"):
        if key == SEED:
            raise FieldError("seeds are not searched; use search.repeat or grid.seed: [...]", name)
        out[name] = _parse_dist(name, key, dist)
    return out


def _parse_dist(name: str, key: str, dist: Any) -> SearchParam:
    if not isinstance(dist, dict) or len(dist) != 1:
        raise FieldError("must be one of {loguniform: [low, high]}, {uniform: [low, high]}, {int: [low, high]}, "
                         f"{{choice: [a, b, ...]}}; got {dist!r}", name)
    (kind, args), = dist.items()
    at = f"{name}.{kind}"
    if kind not in DISTRIBUTIONS:
        raise FieldError(f"unknown distribution; allowed: {', '.join(DISTRIBUTIONS)}", at)
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise FieldError(f"must be a non-empty list of values, got {args!r}", at)
        _no_duplicates(args, at)
        return SearchParam(name=name, key=key, kind=kind, values=tuple(args))
    if not isinstance(args, list) or len(args) != 2:
        raise FieldError(f"must be [low, high], got {args!r}", at)
    if kind == "int":
        lo, hi = args
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)) or lo >= hi:
            raise FieldError(f"must be two integers low < high (both inclusive), got {args!r}", at)
        return SearchParam(name=name, key=key, kind=kind, values=(lo, hi))
    lo, hi = (_number(v, at) for v in args)
    if kind == "loguniform" and not 0 < lo < hi:
        raise FieldError(f"bounds must satisfy 0 < low < high, got {args!r}", at)
    if kind == "uniform" and not lo < hi:
        raise FieldError(f"bounds must satisfy low < high, got {args!r}", at)
    return SearchParam(name=name, key=key, kind=kind, values=(lo, hi))


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(v: Any, at: str) -> float:
    if isinstance(v, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    if not _is_num(v):
        raise FieldError(f"must be [low, high] with numbers, got {v!r}", at)
    return float(v)


def search_seeds(grid: dict[str, list], space: dict[str, SearchParam], repeat: int | None) -> list[int] | None:
    """A search sweep's grid may hold the seeds only (``grid.seed``: each sample runs each seed)."""
    searched = {p.key: n for n, p in space.items()}
    for gname in grid:
        gkey = key_of(gname)
        if gkey in searched:
            raise FieldError(f"also searched in search.space.{searched[gkey]}; a key is either a grid axis or "
                             "searched, not both", f"grid.{gname}")
        if gname == VARIANT:
            raise FieldError("named variants are a grid axis; a search sweep cannot have them (search "
                             "search.space keys instead, or run one sweep per variant)", f"grid.{gname}")
        if gkey != SEED:
            raise FieldError(f"a grid cannot be combined with search (Optuna samples every trial); use "
                             f"search.space.{gname}: {{choice: [...]}} or separate sweeps; only grid.seed is "
                             "allowed (the repeat seeds)", f"grid.{gname}")
    gname = next((g for g in grid if key_of(g) == SEED), None)
    if gname is None:
        return None
    seeds = grid[gname]
    for i, v in enumerate(seeds):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise FieldError(f"seeds must be integers >= 0, got {v!r}", f"grid.{gname}[{i}]")
    if repeat is not None and repeat != len(seeds):
        raise FieldError(f"{repeat} differs from the {len(seeds)} seeds of grid.{gname}; give one of them",
                         "search.repeat")
    return list(seeds)


def report_defaults(axis: str | None, baseline: Any, axes: list[str], grid: dict[str, list] | None,
                    auto: Any) -> tuple[str, Any]:
    """The compared axis and its baseline: as written, else ``variant`` vs its first bundle when the
    grid has named variants, else ``router`` vs ``none`` when router is an axis, else the first
    non-seed axis vs its first value. ``grid`` is None for a search sweep (any baseline is
    accepted there); ``auto`` marks a baseline the file does not give."""
    if axis is None:
        axis = "router"
        if VARIANT in axes:
            axis = VARIANT
        elif axes and not any(key_of(a) == "model.router" for a in axes):
            axis = ([a for a in axes if key_of(a) != SEED] or axes)[0]
        written = False
    else:
        written = True
    if baseline is auto:
        values = next((list(v) for a, v in (grid or {}).items() if key_of(a) == key_of(axis)), None)
        baseline = values[0] if axis == VARIANT and values else "none"
        if values and not any(same(baseline, v) for v in values):
            baseline = values[0]
    if axes or written:
        match = _axis_match(axis, axes, "report.axis")
        if grid is not None and not any(same(baseline, v) for v in grid[match]):
            raise FieldError(f"{baseline!r} is not a value of grid.{match} "
                             f"({', '.join(format_value(v) for v in grid[match])})", "report.baseline")
    return axis, baseline


def _axis_match(name: Any, axes: list[str], at: str) -> str:
    """The axis (as the grid writes it) that ``name`` names, or a FieldError at ``at``."""
    key = VARIANT if name == VARIANT else resolve_key(name, at)
    match = [a for a in axes if key_of(a) == key]
    if not match:
        raise FieldError(f"{name!r} is not an axis of this sweep; axes: {', '.join(axes) or '(none)'}", at)
    return match[0]


def check_tune(tune: Any, axis: str, axes: list[str], grid: dict[str, list] | None) -> None:
    """``report.tune``: a grid axis other than the compared one and the seeds (each value of the
    compared axis is then reported at its own best value of it)."""
    if tune is None:
        return
    if grid is None:
        raise FieldError("only a grid sweep has an axis to tune over (a search sweep already searches)",
                         "report.tune")
    match = _axis_match(tune, axes, "report.tune")
    if key_of(match) == SEED:
        raise FieldError("the seeds are the samples of each comparison, not a setting to tune; name another axis "
                         "(usually lr)", "report.tune")
    if key_of(match) == key_of(axis):
        raise FieldError(f"{tune!r} is the compared axis (report.axis); tune another axis (usually lr)",
                         "report.tune")


def check_decide(spec: Any) -> None:
    """``decide:``: sequential seeds need a grid whose only axes are the compared one and the seeds
    (a wave adds seeds to the baseline and the undecided values of that axis), no tuning axis, and a
    cap at least as large as the file's first wave."""
    if spec.search is not None:
        raise FieldError("a search sweep samples its trials; sequential seeds need a grid sweep", "decide")
    seed = next((a for a in spec.grid if key_of(a) == SEED), None)
    if seed is None:
        raise FieldError("sequential seeds need a seed axis (grid.seed: the first wave's seeds)", "decide")
    if spec.report.tune is not None:
        raise FieldError("report.tune chooses each variant's value on the seeds it then compares; sequential "
                         "seeds cannot be combined with it", "decide")
    compared = key_of(spec.report.axis)
    others = [a for a in spec.grid if key_of(a) not in (SEED, compared) and a != spec.report.axis]
    if others:
        raise FieldError(f"the grid's axes must be the compared one ({spec.report.axis}) and the seeds; also has "
                         f"{', '.join(others)} (run one sweep per value, or compare without decide)", "decide")
    if len(spec.grid[seed]) > spec.decide.max_seeds:
        raise FieldError(f"{len(spec.grid[seed])} seeds in grid.{seed} (the first wave) exceed max_seeds "
                         f"{spec.decide.max_seeds}", "decide.max_seeds")
    if len(spec.grid[seed]) == spec.decide.max_seeds:  # the first wave is the whole sweep: no wave could add one
        raise FieldError(f"{spec.decide.max_seeds} equals the {len(spec.grid[seed])} seeds of grid.{seed} (the first "
                         f"wave): no wave could add a seed; give more than {len(spec.grid[seed])} (or drop decide:)",
                         "decide.max_seeds")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in spec.grid[seed]):
        raise FieldError("the seeds must be integers (a wave adds the next ones)", f"grid.{seed}")
    if spec.decide.margin is not None:  # the waves stop on the compared metric's margin: one for another is a mistake
        metric = spec.report.metric
        named = parse_margins(spec.decide.margin, "decide.margin")
        if margin_for(named, metric, metric) is None:
            raise FieldError(f"names a margin for {', '.join(map(str, named))} only, but the waves compare {metric}; "
                             f"give its margin (0.01, 1% or {metric}: 0.01)", "decide.margin")
    b = spec.decide.budget
    first = math.prod(len(v) for v in spec.grid.values())  # the compared values x the seeds (checked above)
    if b is not None and b.trials is not None and b.trials < first:  # the first wave always runs: the file's grid
        values = first // len(spec.grid[seed])
        raise FieldError(f"{b.trials} is below the first wave's {first} trials (the grid's {values} values x"
                         f" {len(spec.grid[seed])} seeds in grid.{seed})", "decide.budget.trials")
    if b is not None and b.gpu_hours is not None and not spec.resources.gpu > 0:
        raise FieldError("the trials hold no GPU (resources.gpu is 0): a GPU-hours budget would never be spent; give "
                         "trials or core_hours", "decide.budget.gpu_hours")


def same(a: Any, b: Any) -> bool:
    if _is_num(a) and _is_num(b):
        return float(a) == float(b)
    return format_value(a) == format_value(b)
