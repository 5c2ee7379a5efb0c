"""The rules of a sweep file that its field types cannot say, used by the validators of
``orchestrator.sweep.schema``: axis names resolve to config keys, grid axes are non-empty lists
without duplicates, a search space is a set of distributions, grid and search do not overlap,
and the report compares a real axis against one of its values.

Each rule raises ``FieldError(message, at=...)`` with the location below the field it checks
(``router[1]``) or, for rules between blocks, from the top of the file (``grid.lr``);
``orchestrator.core.schema`` adds the rest of the key path.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from lime_arch.config import ModelConfig
from orchestrator.core.keys import ALIASES
from orchestrator.core.schema import FieldError
from orchestrator.engine.config import DataConfig, OptimConfig, TrainConfig

SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig}
DISTRIBUTIONS = ("loguniform", "uniform", "int", "choice")
SEED = "train.seed"


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
    """The dotted config key of an axis name (alias or dotted key)."""
    return ALIASES.get(axis, axis)


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


def parse_grid(grid: Any) -> dict[str, list]:
    """``grid:`` -> axis name (as written) -> its values, in file order."""
    if grid is None:
        return {}
    if not isinstance(grid, dict):
        raise FieldError(f"must be a mapping of axis -> list of values, got {grid!r}")
    for name, values, _key in _keyed(grid, "grid"):
        if not isinstance(values, list):
            raise FieldError(f"must be a list of values, got {values!r}", name)
        if not values:
            raise FieldError("empty list; give at least one value", name)
        _no_duplicates(values, name)
    return {name: list(values) for name, values in grid.items()}


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
    """The compared axis and its baseline: as written, else ``router`` vs ``none`` when router is an
    axis, else the first non-seed axis vs its first value. ``grid`` is None for a search sweep
    (any baseline is accepted there); ``auto`` marks a baseline the file does not give."""
    if axis is None:
        axis = "router"
        if axes and not any(key_of(a) == "model.router" for a in axes):
            axis = ([a for a in axes if key_of(a) != SEED] or axes)[0]
        written = False
    else:
        written = True
    if baseline is auto:
        baseline = "none"
        values = next((v for a, v in (grid or {}).items() if key_of(a) == key_of(axis)), None)
        if values and not any(same(baseline, v) for v in values):
            baseline = values[0]
    if axes or written:
        key = resolve_key(axis, "report.axis")
        match = [a for a in axes if key_of(a) == key]
        if not match:
            raise FieldError(f"{axis!r} is not an axis of this sweep; axes: {', '.join(axes) or '(none)'}",
                             "report.axis")
        if grid is not None and not any(same(baseline, v) for v in grid[match[0]]):
            raise FieldError(f"{baseline!r} is not a value of grid.{match[0]} "
                             f"({', '.join(format_value(v) for v in grid[match[0]])})", "report.baseline")
    return axis, baseline


def same(a: Any, b: Any) -> bool:
    if _is_num(a) and _is_num(b):
        return float(a) == float(b)
    return format_value(a) == format_value(b)
