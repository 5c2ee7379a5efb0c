"""``lime train``: one trial from flags, a trial YAML or a checkpoint to resume."""
from __future__ import annotations

import sys
from pathlib import Path

from lime_arch import ConfigError
from orchestrator.core import dashboard
from orchestrator.core.fmt import num
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, tracking_uri
from orchestrator.engine.data import make_batches
from orchestrator.engine.trial import Tracking, load_checkpoint, run_trial
from orchestrator.engine.trial_config import TrialConfig, parse_set, set_dotted
from orchestrator.sweep.files import FileError, read_yaml


def trial_from_args(args) -> TrialConfig:
    d: dict = {}
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


def cmd_train(args) -> int:
    cfg = trial_from_args(args)  # every check before any data is read or model built
    mcfg = cfg.model_config(vocab_size=make_batches(cfg.data).vocab_size)  # tokenizer/vocab mismatch, empty corpus
    start = 0
    if args.resume:
        start = int(load_checkpoint(args.resume)["step"])
    prog = _Progress(cfg.train.steps, start)
    tracking = Tracking(experiment=args.experiment, run_name=run_name(cfg, mcfg), enabled=not args.no_track)
    try:
        res = run_trial(cfg, tracking=tracking, resume=args.resume, on_log=prog)
    finally:
        prog.close()
    print(f"status: {res.status}  steps: {res.step}  final val loss: {num(res.final_val_loss, 4)}  "
          f"val ppl: {num(res.final_val_ppl, 4)}")
    print(f"checkpoint: {res.checkpoint}")
    if res.run_id:
        uri = tracking_uri()
        exp_id = client(uri).get_run(res.run_id).info.experiment_id
        print(f"MLflow run {res.run_id} ({tracking.run_name}) in experiment {args.experiment!r}, store {uri}")
        print("\n".join(dashboard.ui_lines(uri, exp_id, run_id=res.run_id)))
    return 0 if res.status is TrialStatus.FINISHED else 1
