"""The pydantic schemas of trial configs and sweep files, and their errors as one line:
``key.path: what is wrong (what is allowed), got <value>``."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.engine.trial_config import DataConfig, TrialConfig
from orchestrator.sweep.spec import load_spec, parse_spec

OPTIM_KEYS = ("beta1, beta2, eps, grad_clip, lr, min_lr, router_lr, router_lr_mult, schedule, warmup_steps, "
              "weight_decay")


def _trial_error(d) -> str:
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_dict(d)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("d, expect", [
    # unknown keys, at any depth, with every allowed key
    ({"optim": {"lrr": 1}}, f"optim.lrr: unknown key; allowed: {OPTIM_KEYS}"),
    ({"trian": {}}, "trian: unknown key; allowed: data, model, optim, preset, train"),
    # wrong types: no silent coercion (a YAML true is no number, 8.0 is no step count)
    ({"train": {"steps": "ten"}}, "train.steps: must be an integer >= 1, got 'ten'"),
    ({"train": {"batch_size": 8.0}}, "train.batch_size: must be an integer >= 1, got 8.0"),
    ({"optim": {"lr": True}}, "optim.lr: must be a number > 0, got True"),
    ({"optim": {"router_lr_mult": "x2"}}, "optim.router_lr_mult: must be a number >= 0 or null, got 'x2'"),
    ({"train": {"compile": "yes"}}, "train.compile: must be true or false, got 'yes'"),
    ({"data": {"hf_config": 3}}, "data.hf_config: must be a string or null, got 3"),
    ({"data": {"paths": ["a.txt", 3]}}, "data.paths[1]: must be a string, got 3"),
    ({"train": 5}, "train: must be a mapping with keys analyze, analyze_sequences, batch_size, checkpoint_dir, "
                   "checkpoint_interval, compile, device, eval_batches, eval_interval, grad_accum, log_interval, "
                   "seed, seq_len, steps, threads, got 5"),
    ([1], "config: must be a mapping with keys data, model, optim, preset, train, got [1]"),
    # out of range
    ({"train": {"steps": 0}}, "train.steps: must be >= 1, got 0"),
    ({"train": {"threads": 0}}, "train.threads: must be >= 1, got 0"),
    ({"optim": {"beta2": 1.0}}, "optim.beta2: must be in [0, 1), got 1.0"),
    ({"data": {"val_fraction": 0}}, "data.val_fraction: must be in (0, 1), got 0"),
    ({"optim": {"weight_decay": -0.1}}, "optim.weight_decay: must be >= 0, got -0.1"),
    # one of a set
    ({"optim": {"schedule": "step"}}, "optim.schedule: 'step' is not one of cosine, linear, constant"),
    ({"train": {"device": "gpu"}}, "train.device: 'gpu' is not one of auto, cpu, cuda"),
    # registries and rules between fields (TrialConfig.validate)
    ({"preset": "huge"}, "preset: unknown preset 'huge'; allowed: tiny"),
    ({"data": {"source": "wiki"}}, "data.source: unknown source 'wiki'; allowed: builtin, text, hf"),
    ({"optim": {"lr": 1e-3, "min_lr": 1e-2}}, "optim.min_lr: 0.01 is above optim.lr=0.001"),
    ({"model": {"widthh": 3}}, "model.widthh: unknown key; allowed:"),
])
def test_a_bad_trial_config_is_one_line_naming_the_key(d, expect):
    msg = _trial_error(d)
    assert msg.startswith(expect), msg


def test_numbers_keep_what_yaml_means():
    cfg = TrialConfig.from_dict({"optim": {"lr": "1e-3", "warmup_steps": 0, "router_lr_mult": 2},
                                 "train": {"steps": 7}})
    assert cfg.optim.lr == 0.001 and type(cfg.optim.lr) is float  # PyYAML reads 1e-3 (no dot) as a string
    assert type(cfg.optim.router_lr_mult) is int  # multipliers keep their type: they name MLflow params
    assert type(TrialConfig.from_dict({"optim": {"lr": 1}}).optim.lr) is float
    assert TrialConfig.from_dict({"optim": {"router_lr_mult": "2"}}).optim.router_lr_mult == 2.0
    assert cfg.to_dict()["optim"]["router_lr_mult"] == 2 and cfg.to_dict()["train"]["steps"] == 7


def test_configs_are_keyword_only_and_mutable():
    with pytest.raises(ValueError, match="positional"):
        DataConfig("builtin")
    with pytest.raises(ValueError, match="bogus"):
        DataConfig(bogus=1)
    cfg = TrialConfig.from_dict({})
    cfg.train.checkpoint_dir = "/tmp/x"  # the sweep trial points the engine at its own folder
    assert TrialConfig.from_dict(cfg.to_dict()).train.checkpoint_dir == "/tmp/x"


GOOD = {"name": "s", "description": "a sweep", "base": {"preset": "tiny", "train": {"steps": 5, "seq_len": 32}},
        "grid": {"router": ["none", "full"]}}


@pytest.mark.parametrize("over, expect", [
    ({"resources": {"cpu": "many"}}, "resources.cpu: must be a number > 0 (fractions allowed), got 'many'"),
    ({"resources": {"tpu": 1}}, "resources.tpu: unknown key; allowed: cpu, gpu"),
    ({"resources": {"gpu": 1.5}}, "resources.gpu: above 1 must be a whole number, got 1.5"),
    ({"resources": [1]}, "resources: must be a mapping like {cpu: 1, gpu: 0}, got [1]"),
    ({"max_concurrent": 0}, "max_concurrent: must be >= 1, got 0"),
    ({"max_failures": 1.5}, "max_failures: must be an integer >= 0, got 1.5"),
    ({"analysis": {"enabled": "yes"}}, "analysis.enabled: must be true or false, got 'yes'"),
    ({"report": {"metric": "loss"}}, "report.metric: must be a metric key such as final/val_loss or val/accuracy, "
                                     "got 'loss'"),
    ({"name": "My Sweep"}, "name: must be lowercase letters, digits and '-' ([a-z0-9][a-z0-9-]*), got 'My Sweep'"),
    ({"grid": {}, "search": {"space": {"lr": {"uniform": [0.001, 0.01]}}, "num_samples": 0}},
     "search.num_samples: must be >= 1, got 0"),
    ({"grid": {}, "search": {"space": {"lr": {"uniform": [0.001, 0.01]}}, "mode": "best"}},
     "search.mode: 'best' is not one of min, max"),
    ({"grid": {}, "search": {"space": {"lr": {"uniform": [0.001, 0.01]}}, "asha": {}}},
     "search.asha.grace_period: required, an integer >= 1 (training steps before a trial can be stopped)"),
    ({"grid": {}, "search": {"space": {}}}, "search.space: required, a mapping of key -> {loguniform|uniform|int"),
    ({"grid": {"seed": [0, 1]}, "search": {"space": {"lr": {"uniform": [0.001, 0.01]}}, "repeat": 3}},
     "search.repeat: 3 differs from the 2 seeds of grid.seed; give one of them"),
    ({"grid": {"router": ["none", "none"]}}, "grid.router[1]: duplicate value 'none'"),
])
def test_a_bad_sweep_block_is_one_line_naming_the_key(tmp_path, over, expect):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**GOOD, **over}))
    with pytest.raises(ConfigError) as e:
        load_spec(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: {expect}"), msg


def test_the_whole_file_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"^\(top level\): must be a mapping with keys analysis, base, "):
        parse_spec("just text")
    p = Path(tmp_path / "empty.yaml")
    p.write_text("")
    with pytest.raises(ConfigError, match=r"empty.yaml: \(top level\): must be a mapping"):
        load_spec(p)
