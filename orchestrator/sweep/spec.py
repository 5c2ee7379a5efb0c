"""Sweep files (``sweeps/<name>.yaml``): load, validate, expand into trials; the dry-run estimate.

A sweep file is a base ``TrialConfig`` plus grid axes (the cross product is the trial set) or an
Optuna ``search`` block, plus how the trials run (resources, concurrency, failures, checkpoints)
and what the report compares; it may extend another file (``extends:``). The format is
documented in docs/SWEEPS.md.

Everything is checked here, before Ray or MLflow is touched: the ``extends`` chain
(``orchestrator.sweep.files``), every key and value (``orchestrator.sweep.schema``), and every
expanded trial's ``TrialConfig``. Each mistake is one ``ConfigError`` line naming the file, the
key path in it (``search.space.lr.loguniform``) and what is allowed.

Callers import the sweep format's public names from here.
"""
from __future__ import annotations

import copy
import itertools
import os
import re
from pathlib import Path
from typing import Any

import lime_arch  # the accounting (torch) loads when the dry run estimates, not when a file is checked
from lime_arch.errors import ConfigError
from orchestrator.core.fmt import human  # noqa: F401 - the dry run's numbers
from orchestrator.core.keys import ALIASES, VARIANT  # noqa: F401 - part of the format's vocabulary
from orchestrator.core.validation import validate
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.sweep import limits, metric_names
from orchestrator.sweep.blocks import AnalysisSpec, AshaSpec, ReportSpec, Resources, SearchSpec  # noqa: F401
from orchestrator.sweep.checks import SearchParam, format_value, resolve_key  # noqa: F401
from orchestrator.sweep.files import FileError, is_base, origin_of, read_yaml, resolve, sweep_files
from orchestrator.sweep.schema import SweepSpec, Trial, trial_dirname  # noqa: F401
from orchestrator.tasks import TASKS


# -- loading ----------------------------------------------------------------------------------------
def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read and fully validate a sweep file (every trial is built and validated)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such sweep file" + _available(p))
    if is_base(p):
        users = _extended_by(p)
        raise ConfigError(f"{path}: a shared base for other sweeps (its file name starts with '_'), not a sweep; "
                          f"run one that extends it" + (f": {', '.join(users)}" if users else ""))
    limits.max_trials(), limits.max_params()  # a bad $LIME_MAX_* is its own mistake, not the file's
    data, text = read_yaml(p)
    return parse_spec(data, stem=p.stem, path=str(path), text=text)


def _available(p: Path) -> str:
    folder = p.parent if str(p.parent) else Path(".")
    names = [f.stem for f in sweep_files(folder)] if folder.is_dir() else []
    return f"; sweeps in {folder}: {', '.join(names)}" if names else ""


def _extended_by(base: Path) -> list[str]:
    out = []
    for f in sweep_files(base.parent):
        try:
            chain = resolve(read_yaml(f)[0], f).chain
        except ConfigError:
            continue
        if any(c.resolve() == base.resolve() for c in chain):
            out.append(f.stem)
    return out


def parse_spec(data: Any, *, stem: str | None = None, path: str | None = None, text: str = "") -> SweepSpec:
    """Validate a sweep file's contents; ``path`` is needed to follow ``extends`` and prefixes errors."""
    prefix = f"{path}: " if path else ""
    if isinstance(data, dict) and "extends" in data and path is None:
        raise ConfigError("extends: the file's folder is needed to find its parent; load it with load_spec")
    res = resolve(data, Path(path)) if path else resolve(data, Path("."))
    try:
        spec = validate(SweepSpec, res.data, top="(top level)")
        if stem is not None and spec.name != stem:
            raise ConfigError(f"name: {spec.name!r} must equal the file name {stem!r}")
        spec.path, spec.text, spec.resolved = path, text, copy.deepcopy(res.data)
        spec.root = str(Path(path).resolve().parent) if path else os.getcwd()  # relative data paths: once, here
        _validate_trials(spec)
        _check_metric_names(spec)
    except FileError:
        raise
    except ConfigError as e:
        where = origin_of(str(e), res.origin)
        raise ConfigError(f"{prefix}{e}" + (f" (set in {where})" if where else "")) from None
    return spec


# -- every trial, before anything starts --------------------------------------------------------------
def _validate_trials(spec: SweepSpec) -> None:
    """Build and validate every trial; name the key in the file that a failure comes from."""
    def check(params: dict, where_first: str | None = None) -> None:
        try:
            spec.trial_config(params)
        except ConfigError as e:
            raise ConfigError(_attribute(spec, params, str(e), where_first)) from None

    context: dict = {}  # what the other axes hold while one axis' values are checked
    try:
        check({})  # the base alone (no axis values yet) is where most mistakes are
    except ConfigError:
        # a base that needs the grid (base.model.router_prune with the routers in the grid): valid
        # when the trials are, so it is checked as they see it, with every axis at its first value
        context = {name: values[0] for name, values in spec.grid.items() if values} if spec.search is None else {}
        if not context or not _passes(spec, context):
            raise
    _check_count(spec)  # before a value of any axis is built
    if spec.search is None:
        for name, values in spec.grid.items():
            for i, v in enumerate(values):  # the axis first: an error is attributed to it
                params = {name: v, **{k: x for k, x in context.items() if k != name}}
                check(params, f"grid.{name}.{v}" if name == VARIANT else f"grid.{name}[{i}]")
        try:
            spec.trials()  # every trial, built once and kept on the spec
        except ConfigError:
            for t in itertools.product(*spec.grid.values()):  # which one: name its key in the file
                check(dict(zip(spec.grid, t)))
            raise
        return
    space = spec.search.space
    idx = {"__trial_index__": spec.search.repeat - 1}
    for name, p in space.items():
        for v in _probe_values(p):
            check({name: v, **idx}, f"search.space.{name}.{p.kind}")
    for corner in (0, -1):  # all lows, all highs together
        check({n: _probe_values(p)[corner] for n, p in space.items()})


def _check_metric_names(spec: SweepSpec) -> None:
    """The report's metric and the margins' name metrics the trials will log (``metric_names``);
    a search sweep's trials are seen through the probes of its space."""
    if spec.search is None:
        configs = [t.config for t in spec.trials()]
    else:
        idx = {"__trial_index__": 0}
        configs = [spec.trial_config({n: v, **idx}) for n, p in spec.search.space.items() for v in _probe_values(p)]
    found = metric_names.unknown(spec, configs)
    if found:
        raise ConfigError(f"{found[0]}: {found[1]}")


def _passes(spec: SweepSpec, params: dict) -> bool:
    try:
        spec.trial_config(params)
    except ConfigError:
        return False
    return True


def _check_count(spec: SweepSpec) -> None:
    if spec.search is None:
        shape = " x ".join(f"{a} ({len(v)})" for a, v in spec.grid.items()) or "no axis"
        limits.check_trials(spec.n_trials(), "grid", shape)
    else:
        s = spec.search
        limits.check_trials(spec.n_trials(), "search.num_samples", f"{s.num_samples} samples x {s.repeat} seed(s)")


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
        if name == VARIANT:  # the bundle's key the message is about: grid.variant.lime.router
            for k in spec.variant(params[name]):
                if msg.startswith(spec.key(k) + ":"):
                    return f"{where_first}.{k}: {msg[len(spec.key(k)) + 1:].strip()}"
            return f"{where_first}: {msg}"
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
    if d.source in TASKS:  # synthetic tasks: a fixed character vocabulary
        return TASKS[d.source].vocab.size, f"{d.source} vocabulary"
    return cfg.model_config().vocab_size, "preset's vocabulary"


def estimate(cfg: TrialConfig) -> dict[str, Any]:
    """Tokens, parameters and training FLOPs (3x forward) of one trial."""
    vocab, vocab_src = vocab_for(cfg)
    mcfg = cfg.model_config(vocab_size=vocab)
    t = cfg.train
    tokens = t.steps * t.batch_size * t.seq_len * t.grad_accum
    fpt = lime_arch.flops_per_token(mcfg, t.seq_len)["total"]
    counts = lime_arch.param_counts(mcfg)
    return {"tokens": tokens, "flops_per_token": fpt, "train_flops": 3 * fpt * tokens,
            "params": counts["total"], "router_params": counts["router"], "vocab": vocab, "vocab_source": vocab_src,
            "model": mcfg}
