"""Trial configuration: typed, keyword-only pydantic dataclasses that reject unknown keys.

``TrialConfig`` bundles a model preset plus overrides (names and numbers, never classes), the
data source, the optimizer and the training loop. ``to_dict`` goes straight into MLflow params and
Ray Tune search spaces; dotted keys (``optim.lr``) address any field.

Two levels of checks, both before any data is read: each field's type and range when a config is
built (pydantic; ``orchestrator.core.validation`` words the error), and in ``validate`` what needs a
registry or another section: the preset, the model overrides (``lime_arch.ModelConfig``), the
data source and task, and the rules between fields (``min_lr <= lr``, ``seq_len <= max_seq_len``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field
from pydantic.dataclasses import dataclass

from lime_arch.config import PRESETS, ModelConfig, preset
from lime_arch.errors import ConfigError
from lime_arch.routers import check_router
from orchestrator.core.validation import CONFIG, Bool, Float, Int, Mapping, Str, optional_number, validate
from orchestrator.engine.sources import (  # noqa: F401 - the names of the data sources, declared there
    CORPUS_SOURCES,
    CORPUS_TOKENIZERS,
    DATA_SOURCES,
    SOURCES,
)
from orchestrator.engine.taskspec import build_task
from orchestrator.tasks import TASKS

SCHEDULES = ("cosine", "linear", "constant")
DEVICES = ("auto", "cpu", "cuda")

Positive = Annotated[Int, Field(ge=1)]
Count = Annotated[Int, Field(ge=0)]
Rate = Annotated[Float, Field(ge=0)]
Beta = Annotated[Float, Field(ge=0, lt=1)]


@dataclass(kw_only=True, config=CONFIG)
class DataConfig:
    source: Str = "builtin"  # builtin | text | hf | a synthetic task (arithmetic, prosqa, kv-recall)
    tokenizer: Str = "byte"  # byte | bpe | (hf) a tokenizer name or tokenizer.json path
    bpe_vocab_size: Positive = 2048
    paths: Annotated[list[Str], Field(strict=True)] = field(default_factory=list)  # text: files or globs
    val_fraction: Annotated[Float, Field(gt=0, lt=1)] = 0.2  # builtin/text: the last documents are held out
    val_tokens: Positive = 32768  # builtin/text/hf: validation targets, spread over the held-out documents
    hf_name: Str = "HuggingFaceFW/fineweb-edu"  # a hub name or a local `save_to_disk` folder
    hf_config: Str | None = "sample-10BT"
    hf_split: Str = "train"
    hf_text_field: Str = "text"
    hf_streaming: Bool = True
    hf_val_docs: Positive = 200  # the first documents are the validation set
    max_train_tokens: Positive = 5_000_000  # tokens read from an hf stream for training
    task: Mapping = field(default_factory=dict)  # synthetic task parameters (checked by the task)
    n_train: Positive = 2000  # synthetic examples
    n_val: Positive = 200


@dataclass(kw_only=True, config=CONFIG)
class OptimConfig:
    lr: Annotated[Float, Field(gt=0)] = 3e-3
    min_lr: Rate = 3e-4
    schedule: Literal[SCHEDULES] = "cosine"
    warmup_steps: Count = 20
    weight_decay: Rate = 0.1
    beta1: Beta = 0.9
    beta2: Beta = 0.95
    eps: Annotated[Float, Field(gt=0)] = 1e-8
    grad_clip: Rate = 1.0
    router_lr: optional_number(ge=0) = None
    router_lr_mult: optional_number(ge=0) = None


@dataclass(kw_only=True, config=CONFIG)
class TrainConfig:
    steps: Positive = 200
    batch_size: Positive = 8
    seq_len: Positive = 128
    grad_accum: Positive = 1
    seed: Int = 0
    device: Literal[DEVICES] = "auto"
    compile: Bool = False
    log_interval: Positive = 10
    eval_interval: Positive = 100
    eval_batches: Positive = 8
    checkpoint_interval: Count = 0  # 0: only at the end
    checkpoint_dir: Str | None = None
    threads: Annotated[Int, Field(ge=1)] | None = None  # torch intra-op threads on CPU (None: torch's default)
    analyze: Bool = False  # representation analysis at the end of the trial (lime analyze)
    analyze_sequences: Positive = 32


@dataclass(kw_only=True, config=CONFIG)
class TrialConfig:
    preset: Str = "tiny"
    model: Mapping = field(default_factory=dict)  # overrides of the preset's fields (lime_arch.ModelConfig)
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
        cfg = validate(cls, d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """What the field types cannot say: registries and the rules between fields."""
        if self.preset not in PRESETS:
            raise ConfigError(f"preset: unknown preset {self.preset!r}; allowed: {', '.join(PRESETS)}")
        mc = self.model_config()
        # a trial's router reads no layer the model lacks (first-20 on 12 layers routes as first-12 would):
        # checked here, for the trials of `lime train` and sweeps; lime_arch's own configs (benchmarks,
        # references) may still build one
        check_router(mc.router, n_layers=mc.n_layers)
        t, o, d = self.train, self.optim, self.data
        if t.seq_len > mc.max_seq_len:
            raise ConfigError(f"train.seq_len: {t.seq_len} is longer than model.max_seq_len={mc.max_seq_len}")
        if mc.router_prune is not None and mc.router_prune.start > t.steps:  # (== steps: a post-hoc pruned model)
            raise ConfigError(f"model.router_prune.start: {mc.router_prune.start} is beyond train.steps={t.steps}: "
                              "the router would never be pruned; start at a step <= train.steps")
        if mc.router_prune is not None and t.compile:
            raise ConfigError("model.router_prune: not with train.compile (the compiled routing ops build their "
                              "plan from the router's spec, which knows no mask); set train.compile: false")
        if o.min_lr > o.lr:
            raise ConfigError(f"optim.min_lr: {o.min_lr} is above optim.lr={o.lr}")
        if o.router_lr is not None and o.router_lr_mult is not None:
            raise ConfigError("optim.router_lr: set router_lr or router_lr_mult, not both")
        SOURCES.require(d.source)  # "data.source: unknown source ...; allowed: ..."
        if d.source in ("builtin", "text") and d.tokenizer not in CORPUS_TOKENIZERS:
            raise ConfigError(f"data.tokenizer: {d.tokenizer!r} is not one of {', '.join(CORPUS_TOKENIZERS)}")
        if d.source in TASKS:
            build_task(d.source, d)  # task parameters and sizes, without generating anything


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
