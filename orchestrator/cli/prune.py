"""``lime prune <run id | checkpoint> ... --top-p 0.9``: post-hoc top-p pruning of trained models
(the paper's Table 5; ``orchestrator.evaluation.prune``).

Every target is checked before any compute (a path that exists is a checkpoint, anything else an
MLflow run id of ``$MLFLOW_TRACKING_URI``). For each: the validation loss before and after pruning
every layer's router at ``--top-p`` (the kept weights of a row renormalised to its |weight| mass,
the paper's rule; ``--no-renormalize``: masked only), the pruned weights per layer, the source
layers no head reads any more and the sources each routed head keeps (a target pruned already keeps
its drops: only the weights it still keeps are ranked, and the counts include the earlier drops);
logged on the trial's MLflow run (or ``--run-id``; ``--no-log``: not at all) as
``prune/top_p_<p>/...`` at the trained step, with the markdown as an artifact. ``--save DIR`` writes
the pruned model as a checkpoint (one target: DIR; several: DIR/<label>/). With two or more targets
(the seeds of one variant) the loss change after - before gets the paired interval and verdict of
the reports (``orchestrator.decide.rule``: the median's sign interval at 95%, the mean's beside it,
``--margin`` for equivalence). The markdown goes to ``--out`` (default
``$LIME_RESULTS/prune/top_p_<p>.md``); a file already there is replaced only when it is an earlier
summary of ``lime prune`` (its first line), anything else is refused before the work.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from lime_arch import ConfigError
from orchestrator.cli.analyze import log_to_run
from orchestrator.core.outputs import check_out_file, check_out_folder
from orchestrator.core.tracking import client, existing_client, existing_run
from orchestrator.decide import rule
from orchestrator.engine.checkpoint import CKPT_NAME
from orchestrator.evaluation.prune import markdown, metrics, open_prunable, prune_checkpoint, save_pruned
from orchestrator.sweep.checkpoints import resolve_target

LEVEL = 0.95
TITLE = "# Post-hoc top-p pruning of router weights"  # the summary's first line: an --out that is there is replaced


def _label(ref: str, path: Path, taken: set[str]) -> str:
    base = ref if not Path(ref).expanduser().exists() else (path.name if path.is_dir() else path.parent.name)
    label, i = base, 2
    while label in taken:
        label, i = f"{base}-{i}", i + 1
    return label


def paired_lines(changes: dict[str, float], margin: float | None) -> list[str]:
    """The paired interval and verdict of the loss change (after - before) over the targets."""
    d = np.array(list(changes.values()), np.float64)
    r = rule.decide(d, LEVEL, "min", margin, seeds=list(changes))  # the flag names the models
    iv, mean, v = r.interval, r.mean, r.verdict
    return ["## Loss change over the models (paired: each model before and after)", "",
            f"{len(d)} models; change after - before, median {np.median(d):+.4f}, {LEVEL:.0%} interval "
            f"[{iv.low:+.4f}, {iv.high:+.4f}] ({iv.method}); verdict (median) of the pruned model against the "
            f"unpruned: **{v.word}**" + (f" (margin +-{margin:g})" if margin else "") +
            (f" ({r.why})" if r.why else "") + f"; mean {d.mean():+.4f}, interval [{mean.low:+.4f}, "
            f"{mean.high:+.4f}] ({mean.method})" + (f"; flag: {r.flag}" if r.flag else "") +
            ". A verdict needs 6 or more models at 95% (the sign interval is the whole line below).", ""]


def cmd_prune(args) -> int:
    if not 0 < args.top_p < 1:
        raise ConfigError(f"--top-p: must be in (0, 1), got {args.top_p}")
    if args.margin is not None and not 0 < args.margin < math.inf:  # inf would call every change equivalent
        raise ConfigError(f"--margin: must be a finite number > 0 (nats of loss), got {args.margin}")
    if args.run_id and args.no_log:
        raise ConfigError("--run-id: names the run to log to, but --no-log logs nothing; drop one of them")
    if args.run_id and len(args.targets) > 1:
        raise ConfigError("--run-id: only with one target (each target logs to its own run)")
    out = args.out if args.out is not None else Path(os.environ.get("LIME_RESULTS") or "results") / "prune" / \
        f"top_p_{args.top_p:g}.md"
    out = check_out_file(out, "--out", own=("lime prune", TITLE))
    if args.save is not None:
        check_out_folder(args.save, "--save")
    # every target read and checked (a checkpoint with a prunable router, a run that is there, a
    # free --save folder) before any compute
    opened, taken = {}, set()
    for ref in args.targets:
        path, run_id = resolve_target(ref)
        target = open_prunable(path)
        label = _label(ref, target.file.parent, taken)
        taken.add(label)
        opened[label] = (target, args.run_id or run_id or target.ck.get("run_id"))
        if args.save:
            folder = Path(args.save) if len(args.targets) == 1 else Path(args.save) / label
            if (folder / CKPT_NAME).exists():
                raise ConfigError(f"--save: {str(folder)!r} holds a checkpoint already; choose a new folder")
    runs = sorted({run for _, run in opened.values() if run}) if not args.no_log else []
    if runs:
        cl = existing_client(f"run {runs[0]}")
        for run in runs:
            existing_run(run, cl)
    results = {}
    for label, (target, run) in opened.items():
        p = prune_checkpoint(target, args.top_p, renormalize=not args.no_renormalize)
        results[label] = (p, run)
        print(f"{label}: validation loss {p.loss_before:.4f} -> {p.loss_after:.4f} ({p.change:+.4f}); pruned "
              f"{sum(p.stats.pruned)} of {sum(p.stats.total)} router weights ({p.stats.fraction:.1%}), "
              f"{sum(map(len, p.stats.skipped))} source layers skipped")
        if args.save:
            folder = Path(args.save) if len(args.targets) == 1 else Path(args.save) / label
            print(f"{label}: pruned model saved to {save_pruned(p, folder)}")
    lines = [f"{TITLE} (top_p = {args.top_p:g})", "",
             "Per routed head the smallest set of weights whose share of the row's |weight| first exceeds top_p "
             "is kept (lime_arch/prune.py); validation loss on each trial's own validation batches.", ""]
    for label, (p, _) in results.items():
        lines += markdown(label, p)
    if len(results) >= 2:
        lines += paired_lines({k: p.change for k, (p, _) in results.items()}, args.margin)
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    if not args.no_log:
        for label, (p, run) in results.items():
            if run is None:
                continue
            log_to_run(run, metrics(p), step=p.step)
            with tempfile.TemporaryDirectory() as d:
                f = Path(d) / f"prune_top_p_{args.top_p:g}.md"
                f.write_text("\n".join(markdown(label, p)) + "\n")
                client().log_artifact(run, str(f))
            print(f"{label}: logged to MLflow run {run}")
    return 0
