"""Registries of pluggable things by name, and spec strings with typed arguments (torch-free).

One machinery for every registry of the project: the routers (``lime_arch.routers``), the depth
mixes (``lime_arch.depth_mix``), the router kinds (``lime_arch.routing.kinds``), the data sources
(``orchestrator.engine.trial_config.SOURCES``) and the synthetic tasks (``orchestrator.tasks``).

``Registry`` is an ordered ``dict`` of entries by name (registration order) that checks names at
registration (lowercase words joined by '-', none of them all digits: those are arguments), refuses
a second entry under one name, and words the one-line ``ConfigError`` of an unknown name
("<key>: unknown <what> 'x'; allowed: a, b"). A registry may be given its names up front
(``declared``): then only those may be registered, and ``require`` checks a name against the table
without any entry loaded (config validation without importing the data modules).

``SpecRegistry`` holds classes named by spec strings: ``name``, ``name-4``, ``name-2-8``, each
argument typed (int or float) and positive. Two policies:
  required (``RequiredArg``, the routers): a family takes exactly its arguments (``first-4``);
  optional (``OptionalArg``, the depth mixes): arguments may be left out from the right and take
      their defaults (``denseformer`` = ``denseformer-1-1``).
The spec's name is its leading words; the rest must be numbers. ``parse`` returns the class and
the argument values, ``specs`` lists the registry as spec strings, and every message names the
config key (``model.router``) and lists what is registered (``first-<int>``,
``denseformer[-<dilation>[-<period>]]``).

``Declared`` is how a registry's classes stay torch-free: a class body declares what a config
check reads (the name, the typed arguments, ``check``, a router's sources) and may define torch
methods too (they run only on an instance); instantiating it instantiates its *implementation*,
the class mixed with the torch base its family names (``implementation = "module:Base"``), made
once per class on first use. Routers and depth mixes are ``Declared``; a config is validated
without importing torch, and ``FullRouter(...)`` is still an ``nn.Module`` that is a
``FullRouter``.
"""
from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from lime_arch.errors import ConfigError

T = TypeVar("T")

NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*")  # no all-digit part: those are arguments
_WORD = re.compile(r"[a-z][a-z0-9]*")  # one part of a name
TOKEN = {int: re.compile(r"\d+"), float: re.compile(r"\d+(?:\.\d+)?")}  # one argument in a spec
TYPE_WORD = {int: "integer", float: "number"}


def spec_string(name: str, values: Iterable[int | float]) -> str:
    """The canonical spec: ``first`` + (4,) -> ``first-4``."""
    return "-".join([name, *(str(v) for v in values)])


def split_spec(spec: str) -> tuple[str, list[str]] | None:
    """``'first-4'`` -> ``('first', ['4'])``: the leading words and the numbers after them; None
    when the text after the words is not a run of numbers (``'first--1'``, ``'first-2-x'``)."""
    parts = spec.split("-")
    i = 0
    while i < len(parts) and _WORD.fullmatch(parts[i]):
        i += 1
    name, tokens = "-".join(parts[:i]), parts[i:]
    if not name or not all(TOKEN[float].fullmatch(t) for t in tokens):
        return None
    return name, tokens


class Registry(dict[str, T]):
    """Entries by name, in registration order (a ``dict``: ``in``, ``[name]``, iteration).

    ``what`` names an entry in messages (``"task"``); ``key`` is the config key an unknown name is
    reported under (None: no prefix); ``word`` introduces the listing ("allowed", "registered");
    ``sort`` lists names alphabetically; ``declared`` fixes the names up front."""

    def __init__(self, what: str, *, key: str | None = None, word: str = "allowed", sort: bool = False,
                 declared: Sequence[str] | None = None):
        super().__init__()
        self.what, self.key, self.word, self.sort = what, key, word, sort
        self.declared = None if declared is None else tuple(declared)
        for name in self.declared or ():
            self.check_name(name)

    def copy(self) -> Registry[T]:
        """A registry with the same settings and entries (tests register into a copy)."""
        out = type(self).__new__(type(self))
        out.__dict__.update(self.__dict__)
        dict.update(out, self)
        return out

    # -- registration (a ValueError or TypeError here is a bug in the registering code) ---------
    def check_name(self, name: Any) -> None:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{self.what} name {name!r}: lowercase words joined by '-', none of them all digits")

    def check_new(self, name: Any) -> None:
        """Refuse a bad, taken or undeclared name."""
        self.check_name(name)
        if name in self:
            old = self[name]
            raise ValueError(f"{self.what} name {name!r} is registered already "
                             f"(by {getattr(old, '__qualname__', type(old).__qualname__)})")
        if self.declared is not None and name not in self.declared:
            raise ValueError(f"{self.what} name {name!r} is not declared; declared: {', '.join(self.declared)}")

    def add(self, name: str, entry: T) -> T:
        self.check_new(name)
        self[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` adds the function or class under ``name``."""
        return lambda entry: self.add(name, entry)

    def missing(self) -> list[str]:
        """Declared names without an entry (none once every module that registers is imported)."""
        return [n for n in self.declared or () if n not in self]

    # -- lookup (user input: ConfigError) --------------------------------------------------------
    def names(self) -> list[str]:
        names = list(self) if self.declared is None else list(self.declared)
        return sorted(names) if self.sort else names

    def listing(self) -> str:
        return ", ".join(self.names())

    def unknown(self, name: Any) -> ConfigError:
        where = f"{self.key}: " if self.key else ""
        return ConfigError(f"{where}unknown {self.what} {name!r}; {self.word}: {self.listing()}")

    def require(self, name: Any) -> None:
        """ConfigError unless ``name`` is a known name (a declared one, where names are declared)."""
        known = self.declared if self.declared is not None else self
        if not isinstance(name, str) or name not in known:
            raise self.unknown(name)

    def lookup(self, name: Any) -> T:
        """The entry of ``name``; ConfigError listing the names when there is none."""
        if not isinstance(name, str) or name not in self:
            raise self.unknown(name)
        return self[name]


# -- torch-free declarations, implemented on first use ---------------------------------------------
class Declared:
    """A class declared without its heavy base. ``implementation`` ("module:Base") names the base
    (an ``nn.Module`` subclass, say) that ``implementation_of`` mixes the class with: the
    implementation subclasses both, in that order, so the class's own methods and attributes come
    first, and ``isinstance(obj, TheClass)`` holds. The base may add class attributes to the
    mix (``implementation_attributes(cls)``, e.g. a router's resolved kind)."""

    implementation: ClassVar[str]

    def __new__(cls, *args: Any, **kwargs: Any):
        # FullRouter(...) makes an instance of FullRouter's implementation; __init__ then runs as
        # usual (the implementation is a subclass of cls)
        return object.__new__(implementation_of(cls))

    def __reduce_ex__(self, protocol: int):
        # the implementation is made at run time, so pickle cannot find it by name: name the
        # declaration (deepcopy and pickle both come here)
        return _instance_of, (type(self).declaration,), self.__getstate__()


@functools.cache
def _implementation(cls: type) -> type:
    mod, _, base_name = cls.implementation.partition(":")
    base = getattr(importlib.import_module(mod), base_name)
    clash = [a.name for a in getattr(cls, "arguments", ()) if hasattr(base, a.name)]
    if clash:
        raise TypeError(f"{cls.__qualname__}: argument name {clash[0]!r} is an attribute of {base.__name__}")
    extra = base.implementation_attributes(cls) if hasattr(base, "implementation_attributes") else {}
    namespace = {"declaration": cls, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__, **extra}
    return type(cls.__name__, (cls, base), namespace)


def implementation_of(cls: type) -> type:
    """The implementation class of a ``Declared`` class (itself if it is one already)."""
    if "declaration" in cls.__dict__:
        return cls
    return _implementation(cls)


def _instance_of(cls: type) -> Any:
    """An empty instance of a declared class's implementation (unpickling fills its state)."""
    return object.__new__(implementation_of(cls))


# -- spec strings ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RequiredArg:
    """A typed argument every spec of its family writes; ``example`` (positive, of ``type``) is the
    value used in error messages and by ``SpecRegistry.specs``."""

    name: str
    type: type = int  # int or float
    example: int | float = 4

    @property
    def value(self) -> int | float:
        return self.example


@dataclass(frozen=True)
class OptionalArg:
    """A typed argument a spec may leave out (from the right); ``default`` (positive, of ``type``)
    applies then."""

    name: str
    default: int | float
    type: type = int  # int or float

    @property
    def value(self) -> int | float:
        return self.default


class SpecRegistry(Registry[type]):
    """Classes named by spec strings. A class declares ``arguments`` (a tuple of ``arg_class``);
    registration sets its ``name`` and checks it is a ``base`` subclass whose arguments are typed,
    positive and named so that setting them on an instance overwrites nothing (``reserved`` are the
    attributes the base class sets). ``check(name, cls)`` adds a registry's own checks."""

    def __init__(self, what: str, *, key: str, base: type, arg_class: type, reserved: Iterable[str],
                 check: Callable[[str, type], None] | None = None):
        super().__init__(what, key=key, word="registered")
        self.base, self.arg_class, self.reserved, self.extra_check = base, arg_class, frozenset(reserved), check
        self.optional = issubclass(arg_class, OptionalArg)

    def add(self, name: str, cls: type) -> type:
        self.check_new(name)
        self.check_class(name, cls)
        cls.name = name
        self[name] = cls
        return cls

    def check_class(self, name: str, cls: Any) -> None:
        what = self.what
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{what} {name!r}: {cls!r} is not a subclass of {self.base.__name__}")
        if self.extra_check is not None:
            self.extra_check(name, cls)
        args = cls.arguments
        if not isinstance(args, tuple) or not all(isinstance(a, self.arg_class) for a in args):
            raise TypeError(f"{what} {name!r}: arguments must be a tuple of {self.arg_class.__name__}, got {args!r}")
        value_word = "default" if self.optional else "example"
        seen: set[str] = set()
        for a in args:
            if not a.name.isidentifier() or a.name in seen or a.name in self.reserved or hasattr(cls, a.name):
                raise ValueError(f"{what} {name!r}: argument name {a.name!r} is not a free identifier")
            if a.type not in TOKEN:
                raise TypeError(f"{what} {name!r}: argument {a.name!r} has type {a.type!r}; allowed: int, float")
            if type(a.value) is not a.type or not a.value > 0:
                raise ValueError(f"{what} {name!r}: argument {a.name!r} needs a positive {a.type.__name__} "
                                 f"{value_word}")
            seen.add(a.name)

    # -- listing ----------------------------------------------------------------------------------
    def signature(self, cls: type) -> str:
        """``first-<int>`` (required) or ``denseformer[-<dilation>[-<period>]]`` (optional)."""
        if self.optional:
            return cls.name + "".join(f"[-<{a.name}>" for a in cls.arguments) + "]" * len(cls.arguments)
        return "-".join([cls.name, *(f"<{a.type.__name__}>" for a in cls.arguments)])

    def listing(self) -> str:
        return ", ".join(self.signature(c) for c in self.values())

    def specs(self, example_args: Sequence[int | float] | None = None) -> list[str]:
        """Every entry as a spec string, in registration order. Optional arguments: the name alone
        (the defaults). Required ones: a parameter-free entry once; a family once per value in
        ``example_args`` (that value for each of its arguments), or once with its arguments'
        declared examples when ``example_args`` is None."""
        out = []
        for name, cls in self.items():
            if not cls.arguments or self.optional:
                out.append(name)
            elif example_args is None:
                out.append(spec_string(name, [a.example for a in cls.arguments]))
            else:
                out.extend(spec_string(name, [a.type(v) for a in cls.arguments]) for v in example_args)
        return out

    # -- parsing ----------------------------------------------------------------------------------
    def parse(self, spec: Any) -> tuple[type, tuple[int | float, ...]]:
        """``'first-4'`` -> (the class, (4,)); the full argument tuple, defaults filled in. Unknown
        names and bad arguments raise a one-line ConfigError naming ``key``."""
        if not isinstance(spec, str):
            raise ConfigError(f"{self.key}: must be a string, got {spec!r}; registered: {self.listing()}")
        split = split_spec(spec)
        cls = None if split is None else self.get(split[0])
        if cls is None:
            raise self.unknown(spec)
        tokens, args = split[1], cls.arguments
        if tokens and not args:
            raise self.unknown(spec)
        if self.optional:
            return cls, self._optional(spec, cls, tokens)
        return cls, self._required(spec, cls, tokens)

    def _required(self, spec: str, cls: type, tokens: list[str]) -> tuple[int | float, ...]:
        args = cls.arguments
        if not tokens:
            if not args:
                return ()
            what = {int: "an integer", float: "a number"}[args[0].type] if len(args) == 1 \
                else f"{len(args)} arguments ({'-'.join(f'<{a.name}>' for a in args)})"
            raise ConfigError(f"{self.key}: {spec!r} needs {what}, e.g. "
                              f"{spec_string(spec, [a.example for a in args])}")
        if len(tokens) != len(args) or not all(TOKEN[a.type].fullmatch(t) for a, t in zip(args, tokens)):
            raise self.unknown(spec)
        values = tuple(a.type(t) for a, t in zip(args, tokens))
        for a, v in zip(args, values):
            if not v > 0:
                where = "after '-'" if len(args) == 1 else f"for {a.name}"
                raise ConfigError(f"{self.key}: {spec!r} needs a positive {TYPE_WORD[a.type]} {where}, got {v}")
        return values

    def _optional(self, spec: str, cls: type, tokens: list[str]) -> tuple[int | float, ...]:
        args = cls.arguments
        if len(tokens) > len(args):
            raise ConfigError(f"{self.key}: {spec!r}: {cls.name} takes at most {len(args)} argument(s), "
                              f"{self.signature(cls)}; registered: {self.listing()}")
        values = []
        for a, t in zip(args, tokens):
            if not TOKEN[a.type].fullmatch(t) or not a.type(t) > 0:
                raise ConfigError(f"{self.key}: {spec!r} needs a positive {TYPE_WORD[a.type]} for {a.name}, got {t}")
            values.append(a.type(t))
        return tuple(values) + tuple(a.default for a in args[len(values):])
