"""``lime train`` and ``lime bench``."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from lime_arch import ConfigError

from .config import TrialConfig, parse_set, set_dotted


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
    from .data import make_batches
    from .train import Tracking, run_trial

    cfg.model_config(vocab_size=make_batches(cfg.data).vocab_size)  # tokenizer/vocab mismatch, empty corpus
    start = 0
    if args.resume:
        from .train import load_checkpoint

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
        from .tracking import tracking_uri

        print(f"MLflow run: {res.run_id} (experiment {args.experiment!r}, store {tracking_uri()}); "
              "open it with `make mlflow-ui` -> http://127.0.0.1:5000")
    return 0 if res.status == "finished" else 1


def cmd_bench(args) -> int:
    from lime_arch.bench import options, print_summary, run_bench

    kw = options(args)  # ConfigError -> one line, exit 2, before anything runs
    out = run_bench(**kw)
    print_summary(out)
    paths = out["paths"]
    if not args.no_track:
        from .tracking import RunLogger

        log = RunLogger("lime-bench", run_name="bench-quick" if args.quick else "bench", tags={"kind": "bench"})
        log.log_params({k: v for k, v in out["machine"].items() if isinstance(v, (str, int, float, bool))})
        metrics = {}
        for r in out["rows"]:
            key = f"{r['router']}.{r['impl']}.{r['shape']}"
            for m in ("ratio", "overhead_pct", "flop_overhead_pct", "mem_ratio", "alone_pct"):
                if r.get(m) is not None:
                    metrics[f"bench/{m}/{key}"] = float(r[m])
        for d in out["decode"]:
            metrics[f"bench/decode_ratio/{d['router']}.b{d['batch']}"] = float(d["ratio"])
            metrics[f"bench/decode_tok_s/{d['router']}.b{d['batch']}"] = float(d["tok_s"])
        metrics["bench/checks_passed"] = float(sum(c["ok"] for c in out["checks"]))
        log.log_metrics(metrics, step=0, flush=True)
        for p in paths:
            log.log_artifact(p)
        log.end("finished")
        print(f"MLflow run: {log.run_id} (experiment 'lime-bench')")
    return 0
