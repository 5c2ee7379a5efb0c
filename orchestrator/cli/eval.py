"""``lime eval <MLflow run id | checkpoint>``: downstream tasks with the LM Evaluation Harness.

The tasks are checked first (names, data; the hub only when reachable or cached offline), then
the checkpoint's model is loaded with its trial's tokenizer and scored (``orchestrator.evaluation``).
The scores are printed, logged to the checkpoint's MLflow run (or ``--run-id``; ``--no-log``: not
at all) as ``eval/<task>/<metric>`` with their standard errors, and the harness's results JSON is
written to ``--out`` (default ``$LIME_RESULTS/eval/<run or checkpoint>/``) and logged on the run.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from lime_arch import ConfigError
from orchestrator.core.fmt import num
from orchestrator.core.outputs import check_out_folder
from orchestrator.evaluation.run import evaluate_checkpoint
from orchestrator.evaluation.settings import eval_settings
from orchestrator.sweep.checkpoints import resolve_target


def settings_from_args(args):
    """``EvalSettings`` from the flags (each mistake one line naming its flag)."""
    d = {"tasks": [t.strip() for t in (args.tasks or "").split(",") if t.strip()], "batch_size": args.batch_size,
         "include": list(args.include or []), "gold_loss": not args.no_gold_loss, "max_gen_toks": args.max_gen_toks}
    for flag in ("num_fewshot", "max_length"):
        if getattr(args, flag) is not None:
            d[flag] = getattr(args, flag)
    if args.limit is not None:
        d["limit"] = _limit(args.limit)
    try:
        return eval_settings(d, key="")
    except ConfigError as e:  # "num_fewshot: ..." -> "--num-fewshot: ..."
        field, _, rest = str(e).partition(":")
        name, bracket, index = field.partition("[")
        raise ConfigError(f"--{name.replace('_', '-')}{bracket}{index}:{rest}") from None


def _limit(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    raise ConfigError(f"--limit: must be an integer >= 1 or a fraction in (0, 1), got {text!r}")


def score_lines(outcome) -> list[str]:
    """The scores as a plain table, and the mean of the tasks' primary scores (higher is better)."""
    rows = [("task", "metric", "value", "stderr", "shots")]
    for s in outcome.scores:
        star = "*" if outcome.primary.get(s.task, ("",))[0] == s.metric else ""
        rows.append((s.task, s.metric + star, num(s.value, 4), num(s.stderr, 4), str(outcome.shots.get(s.task, ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    acc = [v for t, (m, hib) in outcome.primary.items() if hib
           for v in [next((s.value for s in outcome.scores if s.task == t and s.metric == m), math.nan)]
           if math.isfinite(v)]
    if acc:
        lines.append(f"average of the {len(acc)} primary (*) scores where higher is better: {sum(acc) / len(acc):.4f}")
    return lines


DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device(name: str) -> str:
    """``--device``: auto, cpu, cuda or cuda:<index>, and a CUDA device only where torch sees one."""
    if not DEVICE.fullmatch(name):
        raise ConfigError(f"--device: must be auto, cpu, cuda or cuda:<index>, got {name!r}")
    if name.startswith("cuda"):
        import torch

        count = torch.cuda.device_count()
        index = int(name.partition(":")[2] or 0)
        if index >= count:
            raise ConfigError(f"--device: {name!r}, but torch sees {count} CUDA device(s) here; use cpu or auto")
    return name


def cmd_eval(args) -> int:
    if args.run_id and args.no_log:
        raise ConfigError("--run-id: names the run to log to, but --no-log logs nothing; drop one of them")
    settings = settings_from_args(args)
    check_device(args.device)
    # before the model is scored, not after (the default: a folder under $LIME_RESULTS/eval)
    default = Path(os.environ.get("LIME_RESULTS") or "results") / "eval"
    check_out_folder(args.out if args.out is not None else default, "--out")
    path, run_id = resolve_target(args.target)
    done = evaluate_checkpoint(path, settings, run_id=args.run_id or run_id, device=args.device,
                               log=not args.no_log, key="")
    out = done.outcome
    print("\n".join(score_lines(out)))
    if out.skipped:
        print(f"already scored on the run under the same settings (not run again): {', '.join(out.skipped)}")
    name = done.run_id or done.trained.run_id or Path(done.trained.path).name
    folder = Path(args.out) if args.out else Path(os.environ.get("LIME_RESULTS") or "results") / "eval" / name
    if out.harness:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(out.harness, indent=1, sort_keys=True) + "\n")
        print(f"harness results: {folder / 'results.json'}")
    print(f"requests answered: {out.requests}" if out.requests else "nothing was evaluated")
    if done.run_id and out.keys:
        print(f"logged {len(out.metrics())} eval/* metrics to MLflow run {done.run_id}")
    elif not done.run_id:
        print("not logged to MLflow" + (" (--no-log)" if args.no_log else " (the checkpoint names no run)"))
    return 0
