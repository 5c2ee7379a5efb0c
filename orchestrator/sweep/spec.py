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

This module holds the entry points (``load_spec``, ``parse_spec``) and the dry-run compute
estimate (``vocab_for``, ``estimate``, ``human``). The data model and trial expansion are in
``orchestrator.sweep.types``, the field and per-trial checks in ``orchestrator.sweep.validate``;
their public names are re-exported here, so callers import everything from ``orchestrator.sweep.spec``.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from lime_arch import ConfigError
from orchestrator.engine.config import TrialConfig

# Re-exported: callers import every public name of the sweep format from orchestrator.sweep.spec.
from orchestrator.sweep.types import (  # noqa: F401
    ALIASES,
    ASHA_KEYS,
    DISTRIBUTIONS,
    METRIC_RE,
    NAME_RE,
    SEARCH_KEYS,
    SECTIONS,
    TOP_KEYS,
    AnalysisSpec,
    AshaSpec,
    ReportSpec,
    Resources,
    SearchParam,
    SearchSpec,
    SweepSpec,
    Trial,
    format_value,
    trial_dirname,
)
from orchestrator.sweep.validate import (  # noqa: F401
    _int,
    _parse_analysis,
    _parse_grid,
    _parse_report,
    _parse_resources,
    _parse_search,
    _unknown,
    _validate_trials,
    resolve_key,
)


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
        from orchestrator.tasks import TASKS

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
