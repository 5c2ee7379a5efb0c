"""Trial configuration: typed, keyword-only dataclasses that reject unknown keys.

``TrialConfig`` bundles a model preset plus overrides (names and numbers, never classes), the
data source, the optimizer and the training loop. ``asdict`` goes straight into MLflow params and
Ray Tune search spaces; dotted keys (``optim.lr``) address any field.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from lime_arch import ConfigError, ModelConfig, preset
from lime_arch.config import PRESETS
from orchestrator.engine.taskspec import build_task
from orchestrator.tasks import TASKS

SCHEDULES = ("cosine", "linear", "constant")
# Every data source by name (checked here without reading data; see orchestrator.engine.data).
DATA_SOURCES = ("builtin", "text", "hf", *TASKS)
CORPUS_TOKENIZERS = ("byte", "bpe")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(kw_only=True)
class DataConfig:
    source: str = "builtin"  # builtin | text | hf | a synthetic task (arithmetic, prosqa, kv-recall)
    tokenizer: str = "byte"  # byte | bpe | (hf) a tokenizer name or tokenizer.json path
    bpe_vocab_size: int = 2048
    paths: list = field(default_factory=list)  # text: files or globs
    val_fraction: float = 0.1  # builtin/text: the last fraction of documents is held out
    hf_name: str = "HuggingFaceFW/fineweb-edu"  # a hub name or a local `save_to_disk` folder
    hf_config: str | None = "sample-10BT"
    hf_split: str = "train"
    hf_text_field: str = "text"
    hf_streaming: bool = True
    hf_val_docs: int = 200  # the first documents are the validation set
    max_train_tokens: int = 5_000_000  # tokens read from an hf stream for training
    task: dict = field(default_factory=dict)  # synthetic task parameters
    n_train: int = 2000  # synthetic examples
    n_val: int = 200


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 3e-3
    min_lr: float = 3e-4
    schedule: str = "cosine"
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    router_lr: float | None = None
    router_lr_mult: float | None = None


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 8
    seq_len: int = 128
    grad_accum: int = 1
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    log_interval: int = 10
    eval_interval: int = 100
    eval_batches: int = 8
    checkpoint_interval: int = 0  # 0: only at the end
    checkpoint_dir: str | None = None
    threads: int | None = None  # torch intra-op threads on CPU (None: torch's default)
    analyze: bool = False  # representation analysis at the end of the trial (lime analyze)
    analyze_sequences: int = 32


@dataclass(kw_only=True)
class TrialConfig:
    preset: str = "tiny"
    model: dict = field(default_factory=dict)  # overrides of the preset's fields
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def model_config(self, vocab_size: int | None = None) -> ModelConfig:
        """The resolved model: preset + overrides; the vocabulary follows the tokenizer unless set."""
        over = dict(self.model)
        if vocab_size is not None:
            if "vocab_size" in over and over["vocab_size"] != vocab_size:
                raise ConfigError(f"model.vocab_size: {over['vocab_size']} does not match the "
                                  f"{self.data.source} tokenizer's vocabulary of {vocab_size}")
            over["vocab_size"] = vocab_size
        return preset(self.preset, **over)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialConfig:
        cfg = _build(cls, d, "")
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Everything that can be checked before any data is read or any compute starts."""
        if self.preset not in PRESETS:
            raise ConfigError(f"preset: unknown preset {self.preset!r}; allowed: {', '.join(PRESETS)}")
        if not isinstance(self.model, dict):
            raise ConfigError("model: must be a mapping of model fields")
        mc = self.model_config()
        t, o = self.train, self.optim
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "log_interval", "eval_interval",
                     "eval_batches"):
            if getattr(t, name) < 1:
                raise ConfigError(f"train.{name}: must be >= 1, got {getattr(t, name)}")
        if t.checkpoint_interval < 0:
            raise ConfigError(f"train.checkpoint_interval: must be >= 0, got {t.checkpoint_interval}")
        if t.seq_len > mc.max_seq_len:
            raise ConfigError(f"train.seq_len: {t.seq_len} is longer than model.max_seq_len={mc.max_seq_len}")
        if t.device not in DEVICES:
            raise ConfigError(f"train.device: {t.device!r} is not one of {', '.join(DEVICES)}")
        if o.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule: {o.schedule!r} is not one of {', '.join(SCHEDULES)}")
        for name in ("lr", "eps"):
            if not getattr(o, name) > 0:
                raise ConfigError(f"optim.{name}: must be > 0, got {getattr(o, name)}")
        for name in ("min_lr", "weight_decay", "warmup_steps", "grad_clip"):
            if getattr(o, name) < 0:
                raise ConfigError(f"optim.{name}: must be >= 0, got {getattr(o, name)}")
        if o.min_lr > o.lr:
            raise ConfigError(f"optim.min_lr: {o.min_lr} is above optim.lr={o.lr}")
        if not (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1):
            raise ConfigError("optim.beta1/beta2: must be in [0, 1)")
        if o.router_lr is not None and o.router_lr_mult is not None:
            raise ConfigError("optim.router_lr: set router_lr or router_lr_mult, not both")
        if not 0 < self.data.val_fraction < 1:
            raise ConfigError(f"data.val_fraction: must be in (0, 1), got {self.data.val_fraction}")
        d = self.data
        if d.source not in DATA_SOURCES:
            raise ConfigError(f"data.source: unknown source {d.source!r}; allowed: {', '.join(DATA_SOURCES)}")
        if d.source in ("builtin", "text") and d.tokenizer not in CORPUS_TOKENIZERS:
            raise ConfigError(f"data.tokenizer: {d.tokenizer!r} is not one of {', '.join(CORPUS_TOKENIZERS)}")
        if d.source in TASKS:
            build_task(d.source, d)  # task parameters and sizes, without generating anything


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or tp)


def _build(cls, d: Any, path: str):
    if isinstance(d, cls):
        return d
    if not isinstance(d, dict):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: must be a mapping, got {d!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in d.items():
        if k not in known:
            raise ConfigError(f"{path}{k}: unknown key; allowed: {', '.join(sorted(known))}")
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            kwargs[k] = _build(tp, v, f"{path}{k}.")
            continue
        if tp is float and isinstance(v, str):  # YAML reads 3e-3 as a string
            try:
                v = float(v)
            except ValueError:
                pass
        if not _type_ok(v, tp):
            raise ConfigError(f"{path}{k}: expected {_tname(tp)}, got {v!r}")
        kwargs[k] = float(v) if tp is float else v
    return cls(**kwargs)


def _tname(tp: Any) -> str:
    args = typing.get_args(tp)
    if args:
        return " or ".join(_tname(a) for a in args)
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    """``set_dotted(cfg, "optim.lr", 1e-3)``; ``model.*`` keys are preset overrides."""
    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in ("model", "data", "optim", "train"):
        if key == "preset":
            d["preset"] = value
            return
        raise ConfigError(f"{key}: unknown key; use preset or model.*, data.*, optim.*, train.*")
    cur = d
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ConfigError(f"{key}: {p} is not a section")
    if parts[0] == "model":
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        if parts[-1] not in known or len(parts) != 2:
            raise ConfigError(f"{key}: unknown key; allowed model fields: {', '.join(sorted(known))}")
    cur[parts[-1]] = value


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """``["optim.lr=3e-3", "data.paths=[a.txt]"]`` -> typed pairs (values parsed as YAML)."""
    out = []
    for it in items:
        if "=" not in it:
            raise ConfigError(f"--set {it}: expected key=value")
        k, v = it.split("=", 1)
        try:
            val = yaml.safe_load(v) if v != "" else ""
        except yaml.YAMLError:
            val = v
        out.append((k.strip(), val))
    return out
