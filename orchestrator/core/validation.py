"""Typed config schemas on pydantic, and its errors as one ``ConfigError`` line.

Trial configs and sweep files are pydantic dataclasses built with ``CONFIG`` (unknown keys are
errors) from the field types below, which never coerce silently: ``"3"`` is not an integer,
``true`` is not a number, ``3.0`` is not a step count. The one allowance is YAML's: PyYAML reads
``1e-3`` (no dot) as a string, so a number field accepts a numeric string.

``config_error`` turns pydantic's ``ValidationError`` (a location path and a message) into the
project's one-line format ``key.path: what is wrong, got <value>``. A field says what is allowed
through its type and bounds (``an integer >= 1``), or in words through ``Field(description=...)``.
A validator that knows a finer location raises ``FieldError(message, at="router[1]")``.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal

import annotated_types as at
from pydantic import BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from lime_arch.errors import ConfigError

CONFIG = ConfigDict(extra="forbid")


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):  # bool is an int in Python; a YAML `true` is never a number here
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return v


def _number_or_none(v: Any) -> Any:
    _no_bool(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise PydanticCustomError("float_type", "Input should be a valid number") from None
    return v


Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
Float = Annotated[float, BeforeValidator(_no_bool)]  # an int becomes a float, as before


def optional_number(**bounds: Any) -> Any:
    """A number or None that keeps its type (2 stays 2: multipliers whose values name MLflow params);
    ``bounds`` (``ge=0``) apply to the number."""
    return Annotated[Annotated[int, Strict(), Field(**bounds)] | Annotated[float, Strict(), Field(**bounds)] | None,
                     BeforeValidator(_number_or_none)]


Mapping = Annotated[dict, Strict()]


class FieldError(ValueError):
    """A validator's error at a finer location than the field it validates (``at``: ``"x[1]"``,
    ``"[1]"``, or from the top of the document when raised by a whole-document validator)."""

    def __init__(self, message: str, at: str = ""):
        super().__init__(message)
        self.at = at


def validate(cls: type, data: Any, *, prefix: str = "", top: str = "config") -> Any:
    """``cls`` (a pydantic dataclass) from ``data``, or a ConfigError naming ``prefix`` + the key path."""
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as e:
        raise config_error(e, cls, prefix=prefix, top=top) from None


def config_error(err: ValidationError, root: type, *, prefix: str = "", top: str = "config") -> ConfigError:
    """The first error of ``err`` (an unknown key first: it explains the rest) as one line."""
    errors = err.errors()
    first = next((e for e in errors if e["type"] in _UNKNOWN), errors[0])
    loc = tuple(first["loc"])
    if first["type"] in _UNKNOWN:
        path, _ = _locate(root, loc[:-1])
        container = _dataclass_at(root, loc[:-1])
        allowed = ", ".join(sorted(f.name for f in dataclasses.fields(container) if f.init)) if container else ""
        return ConfigError(f"{prefix}{_join(path, str(loc[-1]))}: unknown key; allowed: {allowed}")
    path, target = _locate(root, loc)
    at_ = getattr((first.get("ctx") or {}).get("error"), "at", "")
    path = _join(path, at_)
    return ConfigError(f"{prefix}{path}: {_message(first, target)}" if path else f"{top}: {_message(first, target)}")


_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
_TYPE_ERRORS = ("int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "bool_type",
                "string_type", "list_type", "dict_type", "dataclass_type", "dataclass_exact_type", "none_required",
                "string_pattern_mismatch", "tuple_type", "model_type")
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


@dataclasses.dataclass
class _Target:
    """What a location points at: its type, its bounds and its words."""

    tp: Any = Any
    meta: tuple = ()
    description: str | None = None


def _join(path: str, sub: str) -> str:
    if not sub:
        return path
    if sub.startswith("[") or not path:
        return path + sub
    return f"{path}.{sub}"


def _unwrap(tp: Any, meta: tuple = (), description: str | None = None) -> _Target:
    while typing.get_origin(tp) is Annotated:
        tp, *extra = typing.get_args(tp)
        for x in extra:
            if isinstance(x, FieldInfo):
                meta += tuple(x.metadata)
                description = description or x.description
            else:
                meta += (x,)
    return _Target(tp, meta, description)


def _members(tp: Any) -> list:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_unwrap(a).tp for a in typing.get_args(tp)]
    return [tp]


def _fields(tp: Any) -> dict[str, FieldInfo] | None:
    for m in _members(tp):
        if isinstance(m, type) and hasattr(m, "__pydantic_fields__"):
            return m.__pydantic_fields__
    return None


def _locate(root: type, loc: tuple) -> tuple[str, _Target]:
    """The dotted key path of a pydantic location, and what the last key of it points at."""
    target, path = _Target(root), ""
    for item in loc:
        fields = _fields(target.tp)
        origin = typing.get_origin(target.tp)
        if fields is not None and item in fields:
            info = fields[item]
            target = _unwrap(info.annotation, tuple(info.metadata), info.description)
            path = _join(path, str(item))
        elif origin is dict and typing.get_args(target.tp):
            target = _unwrap(typing.get_args(target.tp)[1])
            path = _join(path, str(item))
        elif origin in (list, tuple) and isinstance(item, int) and typing.get_args(target.tp):
            target = _unwrap(typing.get_args(target.tp)[0])
            path = f"{path}[{item}]"
        else:
            break  # a union member's tag: the error is about this field
    return path, target


def _dataclass_at(root: type, loc: tuple) -> type | None:
    tp = _locate(root, loc)[1].tp if loc else root
    return next((m for m in _members(tp) if dataclasses.is_dataclass(m)), None)


def _message(err: dict, target: _Target) -> str:
    kind, value = err["type"], err.get("input")
    got = f", got {value!r}"
    if kind == "missing":
        return f"required, {describe(target)}"
    if kind in ("value_error", "assertion_error"):
        return str((err.get("ctx") or {}).get("error") or err["msg"])
    if kind == "literal_error":
        allowed = [a for m in _members(target.tp) if typing.get_origin(m) is Literal for a in typing.get_args(m)]
        return f"{value!r} is not one of {', '.join(str(a) for a in allowed)}"
    if kind in _RANGE_ERRORS and not target.description:
        return f"must be {_bounds(_all_meta(target))}{got}"
    if kind in _TYPE_ERRORS or kind in _RANGE_ERRORS:
        return f"must be {describe(target)}{got}"
    return f"{err['msg'][:1].lower()}{err['msg'][1:]}{got}"


_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null",
          dict: "a mapping", list: "a list", tuple: "a list", Any: "any value"}


def describe(target: _Target | Any) -> str:
    """What a field allows, in words: its description, else its type and bounds."""
    if not isinstance(target, _Target):
        target = _unwrap(target)
    if target.description:
        return target.description
    bounds = _bounds(_all_meta(target))
    words = []
    for m in _members(target.tp):
        origin = typing.get_origin(m)
        if origin is Literal:
            w = f"one of {', '.join(str(a) for a in typing.get_args(m))}"
        elif dataclasses.is_dataclass(m):
            w = f"a mapping with keys {', '.join(sorted(f.name for f in dataclasses.fields(m) if f.init))}"
        else:
            w = _WORDS.get(origin or m, getattr(m, "__name__", str(m)))
            if bounds and m in (int, float):
                w = f"{w} {bounds}"
        if w not in words:
            words.append(w)
    if bounds and f"an integer {bounds}" in words and f"a number {bounds}" in words:
        words.remove(f"an integer {bounds}")
    elif "an integer" in words and "a number" in words:
        words.remove("an integer")
    return " or ".join(words)


def _all_meta(target: _Target) -> tuple:
    """The bounds of a field and of its union's members (``Annotated[int, Field(ge=1)] | None``)."""
    meta = target.meta
    if typing.get_origin(target.tp) in (typing.Union, types.UnionType):
        for a in typing.get_args(target.tp):
            meta += _unwrap(a).meta
    return meta


def _bounds(meta: tuple) -> str:
    lo = next(((">=", m.ge) for m in meta if isinstance(m, at.Ge)), None) or \
        next(((">", m.gt) for m in meta if isinstance(m, at.Gt)), None)
    hi = next(((("<=", m.le)) for m in meta if isinstance(m, at.Le)), None) or \
        next((("<", m.lt) for m in meta if isinstance(m, at.Lt)), None)
    if lo and hi:
        return f"in {'[' if lo[0] == '>=' else '('}{lo[1]}, {hi[1]}{']' if hi[0] == '<=' else ')'}"
    bound = lo or hi
    return f"{bound[0]} {bound[1]}" if bound else ""
