"""``lime train``: one trial from flags, a trial YAML or a checkpoint to resume.

``--resume CHECKPOINT`` continues from the checkpoint with the config it holds, the flags and
``--set`` applied on top (a ``--config`` file replaces it); a checkpoint that is none, or of
another model than the flags make, is one line and exit 2 (``orchestrator.engine.checkpoint``).
The model must be within ``$LIME_MAX_PARAMS`` (``orchestrator.sweep.limits``). Checkpoints go to
``train.checkpoint_dir``, else to ``<results>/train/<time>-<run name>/`` (``$LIME_RESULTS``, default
``results``; a resumed run keeps writing into its checkpoint's folder), never a temp folder.

Only the config's validation is imported up front (the trial config, the data sources'
declarations, the YAML reader: no torch, Ray or MLflow), so a bad config is refused in a fraction
of a second; the data, the trainer and the tracking load once it has passed (``importlib``); a
checkpoint to resume is read (torch) first.
"""
from __future__ import annotations

import copy
import importlib
import os
import sys
import time
from pathlib import Path

from lime_arch.errors import ConfigError
from orchestrator.core import dashboard
from orchestrator.core.fmt import slug
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, tracking_uri
from orchestrator.engine.sources import check_source
from orchestrator.engine.trial_config import TrialConfig, parse_set, set_dotted
from orchestrator.sweep import limits
from orchestrator.sweep.files import FileError, read_yaml


def trial_from_args(args, base: dict | None = None) -> TrialConfig:
    """The trial of the flags: ``--config`` (else ``base``, a resumed checkpoint's config), then the
    flags, then ``--set``."""
    d: dict = copy.deepcopy(base) if base else {}
    if args.config:
        p = Path(args.config)
        if not p.is_file():
            raise ConfigError(f"--config: file {args.config!r} does not exist")
        try:  # the sweep files' reader: a key given twice is an error, not the last one winning
            d = read_yaml(p, kind="a trial config")[0] or {}
        except FileError as e:
            raise ConfigError(f"--config: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"--config: {args.config} must hold a mapping")
    for flag, key in (("preset", "preset"), ("router", "model.router"), ("data", "data.source"),
                      ("steps", "train.steps"), ("seed", "train.seed")):
        if getattr(args, flag) is not None:
            set_dotted(d, key, getattr(args, flag))
    for k, v in parse_set(args.set):
        set_dotted(d, k, v)
    return TrialConfig.from_dict(d)


LABELS = {"train/loss": "train loss", "val/loss": "val loss", "train/tokens_per_s": "tokens/s"}


class _Progress:
    """A tqdm bar on a terminal, plain lines otherwise; losses say train or validation."""

    def __init__(self, total: int, start: int):
        self.tty = sys.stderr.isatty()
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        self.last = start

    def __call__(self, step: int, m: dict, ck) -> None:
        parts = {label: m[k] for k, label in LABELS.items() if k in m}
        if self.bar:
            self.bar.update(step - self.last)
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in parts.items()})
        else:
            print(f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in parts.items()), flush=True)
        self.last = step

    def close(self) -> None:
        if self.bar:
            self.bar.close()


def run_name(cfg: TrialConfig, mcfg) -> str:
    """What the run is, as its MLflow name: router, preset, seed (and the depth mix unless none)."""
    name = f"router={mcfg.router},preset={cfg.preset},seed={cfg.train.seed}"
    return name + (f",depth_mix={mcfg.depth_mix}" if mcfg.depth_mix != "none" else "")


def checkpoint_dir(cfg: TrialConfig, resume: str | None, name: str) -> str:
    """``train.checkpoint_dir``, else the resumed checkpoint's folder, else a new folder of the
    results: ``<results>/train/<YYYYmmdd-HHMMSS>-<run name>``."""
    if cfg.train.checkpoint_dir:
        return cfg.train.checkpoint_dir
    if resume:
        p = Path(resume)
        return str(p if p.is_dir() else p.parent)
    results = Path(os.environ.get("LIME_RESULTS") or "results")
    return str((results / "train" / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug(name)}").resolve())


def cmd_train(args) -> int:
    checkpoint = importlib.import_module("orchestrator.engine.checkpoint") if args.resume else None  # torch
    ck = checkpoint.read_checkpoint(args.resume) if checkpoint else None  # a checkpoint that is none: one line
    base = ck.get("config") if ck is not None and not args.config else None
    cfg = trial_from_args(args, base if isinstance(base, dict) else None)  # every check before any data is read
    limits.check_model(cfg.model_config(), "model")  # before anything is allocated
    check_source(cfg.data)  # files exist, task parameters fit: still nothing heavy imported
    data = importlib.import_module("orchestrator.engine.data")  # torch from here on
    trial = importlib.import_module("orchestrator.engine.trial")
    mcfg = cfg.model_config(vocab_size=data.make_batches(cfg.data).vocab_size)  # tokenizer/vocab mismatch, empty corpus
    start = 0
    if ck is not None:
        diff = checkpoint.model_differences(ck, mcfg.to_dict())
        if diff:
            raise ConfigError(f"--resume {args.resume}: the checkpoint's model differs from this config "
                              f"({'; '.join(diff)}); drop the flags that change the model, {checkpoint.OR_FRESH}")
        start = int(ck["step"])
    name = run_name(cfg, mcfg)
    cfg.train.checkpoint_dir = checkpoint_dir(cfg, args.resume, name)
    prog = _Progress(cfg.train.steps, start)
    tracking = trial.Tracking(experiment=args.experiment, run_name=name, enabled=not args.no_track)
    try:
        res = trial.run_trial(cfg, tracking=tracking, resume=args.resume, on_log=prog)
    finally:
        prog.close()
    num = importlib.import_module("orchestrator.core.fmt").num  # numpy: not needed to refuse a config
    print(f"status: {res.status}  steps: {res.step}  final val loss: {num(res.final_val_loss, 4)}  "
          f"val ppl: {num(res.final_val_ppl, 4)}")
    print(f"checkpoint: {res.checkpoint}")
    if res.run_id:
        uri = tracking_uri()
        exp_id = client(uri).get_run(res.run_id).info.experiment_id
        print(f"MLflow run {res.run_id} ({tracking.run_name}) in experiment {args.experiment!r}, store {uri}")
        print("\n".join(dashboard.ui_lines(uri, exp_id, run_id=res.run_id)))
    return 0 if res.status is TrialStatus.FINISHED else 1
