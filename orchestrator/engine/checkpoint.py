"""Trial checkpoints: one ``checkpoint.pt`` per trial folder, written atomically.

A checkpoint holds the model, optimizer and scheduler states, every RNG state, the step (the
data position: a batch is a pure function of (seed, step)), the MLflow run id, the logged
metric history, the trial config and its format version. Only tensors and plain Python values
are stored, so it loads with ``torch.load(weights_only=True)``.

``read_checkpoint`` is how a user-given checkpoint is opened (``lime train --resume``): a missing
path, a folder without ``checkpoint.pt``, a file that is no ``torch.save`` archive (random bytes,
cut short by a kill), a torch file of other content or of a newer format is one ``ConfigError``
line saying what is wrong and how to start fresh. ``model_differences`` says which model fields of
a config differ from the checkpoint's, before a model is built.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from lime_arch import build_model
from lime_arch.errors import ConfigError
from orchestrator.engine.trial_config import TrialConfig

CKPT_NAME = "checkpoint.pt"
FORMAT_KEY, FORMAT_VERSION = "format_version", 1  # written since 1; older checkpoints have no key (0)
REQUIRED = ("model", "optimizer", "scheduler", "rng", "step")  # what a resume reads
MODEL = ("model", "config")  # what a command that reads the model needs
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive
FRESH = "to start fresh, run without --resume"
OR_FRESH = "or start fresh (run without --resume)"
# fields that do not change the weights or what they compute: a resume may change them
FREE_FIELDS = ("attn_impl", "routing_impl", "init_std", "router_init")


def rng_state() -> dict:
    """The torch, python and numpy RNG states (numpy's as tensors: weights_only loads them)."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])}}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(("MT19937", s["numpy"]["keys"].numpy().astype(np.uint32), s["numpy"]["pos"], 0, 0.0))


def save_checkpoint(path: Path, state: dict) -> Path:
    """Atomic: write a temp file in the same folder, then rename over the old checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt-", suffix=".tmp")
    os.close(fd)
    torch.save({FORMAT_KEY: FORMAT_VERSION, **state}, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint file, or the ``checkpoint.pt`` of a folder."""
    p = Path(path)
    if p.is_dir():
        p = p / CKPT_NAME
    return torch.load(p, map_location="cpu", weights_only=True)


def checkpoint_path(path: str | Path, flag: str = "--resume", hint: str | None = FRESH) -> Path:
    """The checkpoint file of a user-given path (a file, or a folder holding ``checkpoint.pt``), or
    one ConfigError line naming the path and what is wrong."""
    tail = f"; {hint}" if hint else ""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{flag} {path}: no such file or folder{tail}")
    if p.is_dir():
        if not (p / CKPT_NAME).is_file():
            raise ConfigError(f"{flag} {path}: a folder without {CKPT_NAME} (a trial's checkpoint folder holds "
                              f"one){tail}")
        p = p / CKPT_NAME
    elif not p.is_file():
        raise ConfigError(f"{flag} {path}: not a regular file, not a checkpoint{tail}")
    return p


def read_checkpoint(path: str | Path, flag: str = "--resume", *, needs: tuple[str, ...] = REQUIRED,
                    hint: str | None = FRESH) -> dict:
    """A user-given checkpoint (file or folder), validated: one ConfigError line naming the path
    and what is wrong otherwise. ``needs``: the keys the reader uses (a resume: the training state,
    ``REQUIRED``; a command that reads the model: ``MODEL``); ``hint``: what to do instead.
    Every command that opens a user's checkpoint comes through here."""
    tail = f"; {hint}" if hint else ""
    p = checkpoint_path(path, flag, hint)
    if p.stat().st_size == 0:
        raise ConfigError(f"{flag} {p}: an empty file, not a checkpoint{tail}")
    with open(p, "rb") as f:
        zipped = f.read(4) == ZIP_MAGIC
    try:
        ck = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every way a file can fail to load is the same mistake here
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:120]
        if zipped and "Weights only load failed" in first:
            why = "a torch file holding Python objects other than tensors and plain values (not a lime checkpoint)"
        elif zipped:
            why = f"a torch archive that is truncated or corrupt ({first})"
        else:
            why = "not a file torch.save wrote"
        raise ConfigError(f"{flag} {p}: cannot be read as a checkpoint: {why}{tail}") from None
    missing = [k for k in needs if not isinstance(ck, dict) or k not in ck]
    if missing:
        held = (f"a dict of {', '.join(map(str, list(ck)[:6]))}" if isinstance(ck, dict) and ck
                else type(ck).__name__)
        raise ConfigError(f"{flag} {p}: a torch file of other content ({held}), not a lime checkpoint (which holds "
                          f"{', '.join(needs)}){tail}")
    version = ck.get(FORMAT_KEY, 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        again = f"resume it with the version that wrote it, {OR_FRESH}" if hint == FRESH else \
            "read it with the version that wrote it"
        raise ConfigError(f"{flag} {p}: checkpoint format {version!r} is newer than this code reads "
                          f"({FORMAT_VERSION}); {again}")
    return ck


def read_model_checkpoint(path: str | Path, flag: str = "checkpoint") -> tuple[Path, dict]:
    """(checkpoint file, its contents) of a checkpoint whose model a command reads (``lime eval``,
    ``export``, ``prune``, ``analyze``): validated as ``read_checkpoint`` validates a resume, but
    needing only the weights and the trial config (a pruned model's checkpoint has no optimizer);
    the config must validate and the weights fit the model it makes (checked on the meta device:
    no memory, before any data is read), so a checkpoint that is not one is a line, not a
    traceback halfway through the command's work."""
    f, ck = checkpoint_path(path, flag, None), read_checkpoint(path, flag, needs=MODEL, hint=None)
    weights = ck["model"]
    if not isinstance(ck["config"], dict) or not isinstance(weights, dict) or \
            not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise ConfigError(f"{flag} {f}: its model or config is not a lime checkpoint's (a mapping of tensors and a "
                          "trial config)")
    try:
        cfg = TrialConfig.from_dict(ck["config"])
        vocab = ck.get("vocab_size")
        mismatch = weight_mismatch(cfg.model_config(vocab_size=vocab), weights) if vocab else None
    except ConfigError as e:
        raise ConfigError(f"{flag} {f}: its trial config does not validate with this code ({e})") from None
    if mismatch:
        raise ConfigError(f"{flag} {f}: its weights do not fit the model its config makes ({mismatch})")
    return f, ck


def weight_mismatch(mcfg, weights: dict) -> str | None:
    """What keeps ``weights`` (a state dict) from loading into the model of ``mcfg`` (a
    ``lime_arch.ModelConfig``), as ``load_state_dict`` would find it: keys missing or unexpected,
    shapes that differ; None when they load. The model is built on the meta device."""
    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in build_model(mcfg).state_dict().items()}
    missing = [k for k in own if k not in weights]
    extra = [k for k in weights if k not in own]
    shapes = [f"{k} {tuple(weights[k].shape)}, the model's {own[k]}" for k in own
              if k in weights and tuple(weights[k].shape) != own[k]]
    parts = [f"{len(xs)} {what}: {', '.join(xs[:2])}{', ...' if len(xs) > 2 else ''}"
             for what, xs in (("missing", missing), ("unexpected", extra), ("of another shape", shapes)) if xs]
    return "; ".join(parts) or None


def model_differences(ck: dict, mcfg_dict: dict) -> list[str]:
    """``model.<field>: <checkpoint's> in the checkpoint, <this> here`` for every field of the
    resolved model (``ModelConfig.to_dict()``) that differs from the checkpoint's; [] when the
    checkpoint does not say (an older format)."""
    theirs = ck.get("model_config")
    if not isinstance(theirs, dict):
        return []
    return [f"model.{k}: {theirs[k]!r} in the checkpoint, {v!r} here" for k, v in mcfg_dict.items()
            if k in theirs and k not in FREE_FIELDS and theirs[k] != v]
