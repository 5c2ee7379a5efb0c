"""Reading sweep files: YAML, ``extends`` chains, and the shared-base convention.

A sweep file may start from another one in the same folder: ``extends: <name>`` reads
``<name>.yaml`` and applies this file on top of it. Mappings merge key by key, deeply (``base``,
``grid``, ``resources``, ``report``, ``search`` ...): the parent's keys keep their place and new
keys come after them. Anything else (lists, numbers, strings, ``null``) replaces the parent's
value, so ``grid: {seed: [0, 1]}`` replaces only the seed axis. ``replace: [base, ...]`` lists
mappings of this file that replace the parent's instead of merging into them (``base``: nothing of
the parent's base is kept; ``base.data``: only its data block). ``name``, ``description``,
``extends`` and ``replace`` are never inherited: every sweep states its own name and description.

Files whose name starts with ``_`` (``sweeps/_fineweb-edu.yaml``) are shared bases: pieces other
sweeps extend, never run themselves, with neither a name nor a description.

The files stay plain YAML (any YAML reader can read them). Errors found here name the file they
are in (a parent's mistake names the parent).
"""
from __future__ import annotations

import copy
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import yaml

from lime_arch.errors import ConfigError

EXTENDS_RE = re.compile(r"_?[a-z0-9][a-z0-9-]*\Z")
# The most values a file may hold once its YAML aliases are expanded: aliases share one object,
# so a small file of nested aliases (a "billion laughs") stands for a tree far larger than memory,
# and walking it (merging, validating, hashing) would run until a MemoryError
MAX_VALUES = 100_000
NOT_INHERITED = ("name", "description", "extends", "replace")


class FileError(ConfigError):
    """A ConfigError whose message already starts with the file it is about."""


class Override(dict):
    """A mapping named in its file's ``replace:``: it replaces the parent's instead of merging into it."""


def is_base(path: str | os.PathLike) -> bool:
    """A shared base (``_name.yaml``): extended by sweeps, never run."""
    return Path(path).name.startswith("_")


def sweep_files(folder: str | os.PathLike) -> list[Path]:
    """The runnable sweep files of a folder (shared bases left out), by name."""
    return sorted(p for p in Path(folder).glob("*.yaml") if not is_base(p))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: plain YAML
    readers keep the last one silently (a second ``grid:`` would replace the first)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, it is no key
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first on line {seen[key]}); a key may appear once "
                                        "in a mapping", key_node.start_mark)
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: the constructor below reports it
                    continue
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, kind: str = "a sweep file") -> tuple[Any, str]:
    """A file's YAML and its text; not UTF-8 text, invalid YAML or a duplicate key: one FileError line
    (``kind`` names what the file should be; ``lime train --config`` reads trial files with it too)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(f"{path}: not a text file (byte {e.start} is not UTF-8); {kind} is YAML text") from None
    except OSError as e:
        raise FileError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise FileError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    problem = _expansion_problem(data)
    if problem:
        raise FileError(f"{path}: {problem}; {kind} holds at most {MAX_VALUES} values") from None
    return data, text


def _expansion_problem(data: Any) -> str | None:
    """Why ``data`` is too large once its aliases are expanded (or refers to itself), else None.
    Counted without expanding: each shared object's size once (memoised by identity)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(v: Any) -> int:
        if not isinstance(v, (dict, list)):
            return 1
        if id(v) in sizes:
            return sizes[id(v)]
        if id(v) in open_:
            raise RecursionError
        open_.add(id(v))
        items = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v
        n = 1
        for x in items:
            n += size(x)
            if n > MAX_VALUES:
                break
        open_.discard(id(v))
        sizes[id(v)] = n
        return n

    try:
        n = size(data)
    except RecursionError:
        return "a YAML alias refers to a value that contains it (the file would expand forever)"
    if n > MAX_VALUES:
        return f"expands to more than {MAX_VALUES} values (YAML aliases repeat their anchor's value)"
    return None


@dataclasses.dataclass
class Resolved:
    """A sweep file with its ``extends`` chain applied."""

    data: dict[str, Any]  # plain mappings, ``extends`` and ``replace`` kept as written
    chain: list[Path]  # the parents, nearest first
    origin: dict[tuple, Path]  # key path -> the parent file that set it (keys this file set are absent)


def resolve(data: Any, path: Path) -> Resolved:
    """Apply the ``extends`` chain of ``data`` (the contents of ``path``)."""
    if not isinstance(data, dict) or "extends" not in data:
        if isinstance(data, dict):
            _replacing(data, path)  # only to refuse a `replace:` without `extends`
        return Resolved(plain(data), [], {})
    chain, origin = [], {}
    merged, seen, here = _replacing(data, path), [path.resolve()], path
    while "extends" in merged:
        parent = _parent_file(here, merged.get("extends"), seen)
        pdata, _ = read_yaml(parent)
        if not isinstance(pdata, dict):
            raise FileError(f"{parent}: must be a mapping of sweep keys, got {type(pdata).__name__}")
        if is_base(parent):
            _check_base(parent, pdata)
        chain.append(parent)
        seen.append(parent.resolve())
        inherited = {k: v for k, v in _replacing(pdata, parent).items() if k not in NOT_INHERITED}
        _record(inherited, merged, parent, (), origin)
        merged = {**merge(inherited, {k: v for k, v in merged.items() if k != "extends"}),
                  **({"extends": pdata["extends"]} if "extends" in pdata else {})}
        here = parent
    own = {k: data[k] for k in ("extends", "replace") if k in data}
    return Resolved(plain({**own, **{k: v for k, v in merged.items() if k not in own}}), chain, origin)


def _replacing(data: dict, path: Path) -> dict:
    """``data`` with the mappings its ``replace:`` names marked to replace the parent's."""
    paths = data.get("replace", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise FileError(f"{path}: replace: must be a list of keys of this file, such as [base] or "
                        f"[base.data], got {paths!r}")
    if paths and "extends" not in data:
        raise FileError(f"{path}: replace: only with extends (it names mappings that replace the parent's)")
    out = copy.deepcopy({k: v for k, v in data.items() if k != "replace"})
    for dotted in paths:
        parts, cur = dotted.split("."), out
        for p in parts[:-1]:
            cur = cur.get(p) if isinstance(cur, dict) else None
        if not isinstance(cur, dict) or parts[-1] not in cur:
            raise FileError(f"{path}: replace: {dotted} is not in this file")
        if not isinstance(cur[parts[-1]], dict):
            raise FileError(f"{path}: replace: {dotted} is not a mapping (other values replace the parent's anyway)")
        cur[parts[-1]] = Override(cur[parts[-1]])
    return out


def _parent_file(here: Path, name: Any, seen: list[Path]) -> Path:
    if not isinstance(name, str) or not EXTENDS_RE.match(name):
        raise FileError(f"{here}: extends: must be the name of a sweep file in the same folder "
                        f"(without .yaml), got {name!r}")
    parent = here.parent / f"{name}.yaml"
    if not parent.is_file():
        names = [p.stem for p in sorted(here.parent.glob("*.yaml"))]
        raise FileError(f"{here}: extends: no file {parent}; files there: {', '.join(names) or '(none)'}")
    if parent.resolve() in seen:
        cycle = " -> ".join(p.stem for p in [*seen, parent.resolve()])
        raise FileError(f"{here}: extends: a cycle ({cycle})")
    return parent


def _check_base(path: Path, data: dict) -> None:
    for key in ("name", "description"):
        if key in data:
            raise FileError(f"{path}: {key}: a shared base (its file name starts with '_') has no {key}; "
                            f"each sweep that extends it states its own")


def merge(parent: dict, child: dict) -> dict:
    """``child`` on top of ``parent``: mappings merge deeply unless replacing; the rest replaces."""
    out = Override(parent) if isinstance(parent, Override) else dict(parent)  # an override stays one
    for k, v in child.items():
        if isinstance(v, dict) and not isinstance(v, Override) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def _record(parent: Any, child: Any, file: Path, at: tuple, origin: dict) -> None:
    """Note which parent file set each key path that ``child`` does not set itself."""
    if not isinstance(parent, dict):
        return
    for k, v in parent.items():
        key = (*at, k)
        if not isinstance(child, dict) or k not in child:
            origin.setdefault(key, file)
            if isinstance(v, dict):
                for sub in _leaves(v, key):
                    origin.setdefault(sub, file)
        elif isinstance(child[k], dict) and not isinstance(child[k], Override):
            _record(v, child[k], file, key, origin)


def _leaves(d: dict, at: tuple):
    for k, v in d.items():
        yield (*at, k)
        if isinstance(v, dict):
            yield from _leaves(v, (*at, k))


def plain(v: Any) -> Any:
    """Override mappings back to plain dicts (for validation, hashing and YAML output)."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def origin_of(message: str, origin: dict[tuple, Path]) -> Path | None:
    """The parent file that set the key an error message starts with (``base.train.steps: ...``)."""
    head = message.split(":", 1)[0].split(" ", 1)[0]
    parts = tuple(p for p in re.sub(r"\[\d+\]", "", head).split(".") if p)
    while parts:
        if parts in origin:
            return origin[parts]
        parts = parts[:-1]
    return None


def resolved_yaml(data: dict[str, Any]) -> str:
    """The resolved sweep as YAML (what ran), ``extends`` and ``replace`` left out: they are applied."""
    first = {k: data[k] for k in ("name", "description") if k in data}
    rest = {k: v for k, v in data.items() if k not in (*first, "extends", "replace")}
    return yaml.safe_dump({**first, **rest}, sort_keys=False,
                          default_flow_style=None, width=120)
