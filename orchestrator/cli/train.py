"""``lime train``: one trial from flags, a trial YAML or a checkpoint to resume."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from lime_arch import ConfigError
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import tracking_uri
from orchestrator.engine.config import TrialConfig, parse_set, set_dotted
from orchestrator.engine.data import make_batches
from orchestrator.engine.train import Tracking, load_checkpoint, run_trial


def trial_from_args(args) -> TrialConfig:
    d: dict = {}
    if args.config:
        p = Path(args.config)
        if not p.is_file():
            raise ConfigError(f"--config: file {args.config!r} does not exist")
        try:
            d = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"--config: {args.config} is not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"--config: {args.config} must hold a mapping")
    for flag, key in (("preset", "preset"), ("router", "model.router"), ("data", "data.source"),
                      ("steps", "train.steps"), ("seed", "train.seed")):
        if getattr(args, flag) is not None:
            set_dotted(d, key, getattr(args, flag))
    for k, v in parse_set(args.set):
        set_dotted(d, k, v)
    return TrialConfig.from_dict(d)


class _Progress:
    """A tqdm bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, start: int):
        self.tty = sys.stderr.isatty()
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        self.last = start

    def __call__(self, step: int, m: dict, ck) -> None:
        parts = {k.split("/")[-1]: v for k, v in m.items() if k in ("train/loss", "val/loss", "train/tokens_per_s")}
        if self.bar:
            self.bar.update(step - self.last)
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in parts.items()})
        else:
            print(f"step {step}: " + " ".join(f"{k}={v:.4g}" for k, v in parts.items()), flush=True)
        self.last = step

    def close(self) -> None:
        if self.bar:
            self.bar.close()


def cmd_train(args) -> int:
    cfg = trial_from_args(args)  # every check before any data is read or model built
    cfg.model_config(vocab_size=make_batches(cfg.data).vocab_size)  # tokenizer/vocab mismatch, empty corpus
    start = 0
    if args.resume:
        start = int(load_checkpoint(args.resume)["step"])
    prog = _Progress(cfg.train.steps, start)
    try:
        res = run_trial(cfg, tracking=Tracking(experiment=args.experiment, enabled=not args.no_track),
                        resume=args.resume, on_log=prog)
    finally:
        prog.close()
    print(f"status: {res.status}  steps: {res.step}  final val loss: {res.final_val_loss}  "
          f"ppl: {res.final_val_ppl}")
    print(f"checkpoint: {res.checkpoint}")
    if res.run_id:
        print(f"MLflow run: {res.run_id} (experiment {args.experiment!r}, store {tracking_uri()}); "
              "open it with `make mlflow-ui` -> http://127.0.0.1:5000")
    return 0 if res.status is TrialStatus.FINISHED else 1
