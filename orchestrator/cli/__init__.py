"""The ``lime`` command line: train, sweep, report, plan, bench, eval, export, analyze, prune.

Argument definitions live here (cheap to import); each command's work is imported lazily from
its module, so ``lime --help`` does not load Ray or MLflow. A ``ConfigError`` anywhere becomes
one line on stderr and exit code 2, before any compute starts.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from lime_arch import ConfigError
from orchestrator.cli import bench
from orchestrator.core import exposure
from orchestrator.core.outbox import TrackingUnavailable


def _lazy(target: str):
    mod, fn = target.rsplit(":", 1)
    return lambda args: getattr(importlib.import_module(mod), fn)(args)


def plan_arguments(p: argparse.ArgumentParser) -> None:
    """``lime plan``'s arguments (here, so that ``lime --help`` loads no sweep code)."""
    p.add_argument("file", help="sweep file")
    p.add_argument("--sigma", type=float,
                   help="the standard deviation of the per-seed paired differences variant - baseline, in the "
                        "metric's units (e.g. 0.02 nats of loss)")
    p.add_argument("--pilot", metavar="SWEEP",
                   help="read that spread (and the metric's level) from the finished MLflow runs of this sweep")
    p.add_argument("--effect", type=float,
                   help="the effect to detect, RELATIVE to the metric's level: 0.01 = a 1%% change "
                        "(default: the paper's change for each variant where the sweep mirrors a paper table, "
                        "else 0.01)")
    p.add_argument("--delta", type=float, help="the effect to detect as an ABSOLUTE difference in metric units "
                                               "(instead of --effect)")
    p.add_argument("--power", type=float, default=0.8, help="wanted power (default 0.8)")
    p.add_argument("--alpha", type=float, help="significance level (default: the file's report.alpha, else 0.05)")


def eval_arguments(p: argparse.ArgumentParser) -> None:
    """``lime eval``'s arguments (here, so that ``lime --help`` loads neither torch nor the harness)."""
    p.add_argument("target", help="MLflow run id, or checkpoint file or folder")
    p.add_argument("--tasks", required=True,
                   help="comma-separated harness tasks and suites (paper-table-1, paper-glue, paper-qa, paper-360m, "
                        "lime-local), e.g. arc_easy,lime_kv")
    p.add_argument("--num-fewshot", type=int, help="shots for every task (default: the suite's, else the task's)")
    p.add_argument("--limit", help="at most N examples per task, or a fraction in (0, 1)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default 16)")
    p.add_argument("--include", action="append", metavar="DIR",
                   help="a folder of harness task YAML files (local task definitions); repeatable")
    p.add_argument("--no-gold-loss", action="store_true",
                   help="skip the gold answer's bits per byte and loss of multiple-choice tasks (<task>_bpb)")
    p.add_argument("--max-length", type=int, help="context in tokens (default: the model's max_seq_len)")
    p.add_argument("--max-gen-toks", type=int, default=256, help="generation budget of tasks that set none")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--run-id", help="MLflow run to log to (default: the checkpoint's)")
    p.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    p.add_argument("--out", help="folder for the harness's results.json (default $LIME_RESULTS/eval/<run>)")


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's error format: one ``error:`` line naming the command, exit code 2
    (argparse prints its usage block first; ``lime <command> --help`` shows it)."""

    def error(self, message: str):
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="lime", description="LIMe architecture ablations and sweeps")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    t = sub.add_parser("train", help="train one trial")
    t.add_argument("--config", help="trial YAML (preset, model, data, optim, train sections)")
    t.add_argument("--preset")
    t.add_argument("--router")
    t.add_argument("--data", help="data source: builtin, text, hf, arithmetic, prosqa, kv-recall")
    t.add_argument("--steps", type=int)
    t.add_argument("--seed", type=int)
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any field, e.g. optim.lr=3e-3 model.n_layers=8 data.paths=[a.txt]")
    t.add_argument("--experiment", default="lime-train", help="MLflow experiment name")
    t.add_argument("--resume", help="checkpoint file or folder to continue from")
    t.add_argument("--no-track", action="store_true", help="do not log to MLflow")
    t.set_defaults(func=_lazy("orchestrator.cli.train:cmd_train"))

    s = sub.add_parser("sweep", help="run or inspect a sweep")
    ssub = s.add_subparsers(dest="sweep_command", required=True, parser_class=Parser)
    sr = ssub.add_parser("run", help="run (or resume) a sweep file with Ray Tune")
    sr.add_argument("file")
    sr.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    sr.add_argument("--dry-run", action="store_true", help="print the trials and compute; start nothing")
    sr.add_argument("--add-seeds", metavar="N", help="grow the sweep by N seeds after its largest one: only the new "
                    "trials run, under the same MLflow parent run (the file is not rewritten)")
    sr.add_argument("--until-decided", action="store_true",
                    help="add seeds in waves until every comparison with the baseline is decided (anytime-valid "
                    "confidence sequences; the same as a decide: block in the file)")
    sr.add_argument("--max-seeds", metavar="N", help="with --until-decided: seeds per arm at most (default: the "
                    "file's decide.max_seeds, else 32)")
    sr.add_argument("--margin", metavar="M", help="with --until-decided: the equivalence margin, absolute (0.01) or "
                    "a percentage of the baseline's mean (1%%); default: the file's decide.margin or report.margin")
    sr.add_argument("--budget", metavar="B", help="with --until-decided: what the waves may cost at most, trials=60, "
                    "core_hours=2 or gpu_hours=1 (several joined by ','); a comparison the budget cannot pay for ends "
                    "\"inconclusive at budget\"; default: the file's decide.budget, else none")
    sr.add_argument("--connect-timeout", type=float, metavar="SECONDS",
                    help="give up connecting to --address after this long (default: $LIME_CONNECT_TIMEOUT, else 30)")
    sr.set_defaults(func=_lazy("orchestrator.cli.sweep:cmd_run"))
    ss = ssub.add_parser("status", help="trials of a sweep by state, with their MLflow run ids")
    ss.add_argument("name")
    ss.set_defaults(func=_lazy("orchestrator.cli.sweep:cmd_status"))

    r = sub.add_parser("report", help="statistics, tables and plots of a finished sweep")
    r.add_argument("sweep", nargs="?", help="sweep name (or a sweep file path)")
    r.add_argument("--out", default=os.environ.get("LIME_RESULTS") or "results",
                   help="reports go to OUT/<sweep>/ (default: $LIME_RESULTS, else results)")
    r.add_argument("--metric", help="metric to compare (default: the sweep file's, else final/val_loss)")
    r.add_argument("--axis", help="axis to compare (default: the sweep file's, else router)")
    r.add_argument("--baseline", help="baseline value of the axis (default: the sweep file's, else none)")
    r.add_argument("--pool", metavar="A,B,...", help="pool the pre-registered comparisons of these sweeps (each "
                   "compared as its own report compares it; all on one metric) into one report with one correction; "
                   "written to OUT/pool-A-B")
    r.add_argument("--throughput", action="store_true",
                   help="measure each variant's training throughput against the baseline's at the sweep's shape, in "
                   "one process (interleaved paired rounds, as lime bench), for the wall-clock speedup; saved as "
                   "OUT/<sweep>/throughput.json, which later reports read while it matches the sweep")
    r.add_argument("--throughput-rounds", metavar="N",
                   help="with --throughput: paired rounds per variant (default: 12, or the fewest that give a finite "
                   "interval at the speedup's level; at most 200)")
    r.set_defaults(func=_lazy("orchestrator.cli.report:cmd_report"))

    pl = sub.add_parser("plan", help="what a sweep design can show, and the seeds per arm it needs")
    plan_arguments(pl)
    pl.set_defaults(func=_lazy("orchestrator.cli.plan:cmd_plan"))

    b = sub.add_parser("bench", help="step time, memory, FLOPs and decode speed of every router")
    bench.add_arguments(b)  # torch-free: the benchmark itself loads when the command runs
    b.set_defaults(func=bench.cmd_bench)

    e = sub.add_parser("eval", help="downstream tasks (LM Evaluation Harness) of a trained run or checkpoint")
    eval_arguments(e)
    e.set_defaults(func=_lazy("orchestrator.cli.eval:cmd_eval"))

    x = sub.add_parser("export", help="a trained run or checkpoint as a Hugging Face transformers folder")
    x.add_argument("target", help="MLflow run id, or checkpoint file or folder")
    x.add_argument("--to", required=True, metavar="DIR", help="the folder to write (must be empty or new)")
    x.set_defaults(func=_lazy("orchestrator.cli.export:cmd_export"))

    a = sub.add_parser("analyze", help="entropy, separability probe and router maps of checkpoints")
    a.add_argument("checkpoints", nargs="+", help="checkpoint files or folders (label=path to name them)")
    a.add_argument("--out", default="results/analysis")
    a.add_argument("--alpha", type=float, default=0.5, help="Renyi entropy order")
    a.add_argument("--sequences", type=int, default=16, help="evaluation sequences")
    a.add_argument("--words", default="is,are,was,were", help="near-synonym words for the probe")
    a.add_argument("--routes", type=int, default=10,
                   help="strongest routes to list per checkpoint, with the tokens where a dynamic router's fire "
                        "(default 10)")
    a.add_argument("--run-id", help="MLflow run to log the metrics to (default: the checkpoint's)")
    a.add_argument("--ablate", action="store_true",
                   help="each route's causal effect: the validation loss change with it zeroed, beside its mass; over "
                        "the seeds of a variant with a paired interval (ablation.md, ablation.csv)")
    a.add_argument("--renormalize", action=argparse.BooleanOptionalAction, default=None,
                   help="with --ablate: scale each routed head's remaining weights back to its |weight| mass, as lime "
                        "prune does (default: --no-renormalize, the route alone removed)")
    a.add_argument("--ablate-heads", action="store_true",
                   help="with --ablate: one route per routed KV head (layer, head, source), not per (layer, source)")
    a.add_argument("--ablate-max-routes", type=int, metavar="N",
                   help="with --ablate: at most N routes per variant, the N/2 of highest mass and a random sample of "
                        "the rest (default 64)")
    a.set_defaults(func=_lazy("orchestrator.cli.analyze:cmd_analyze"))

    pr = sub.add_parser("prune", help="post-hoc top-p pruning of trained routers: loss before/after, pruned counts")
    pr.add_argument("targets", nargs="+", help="MLflow run ids or checkpoint files or folders (several: the seeds "
                                               "of one variant, with a paired interval of the loss change)")
    pr.add_argument("--top-p", type=float, required=True, help="the |weight| share kept per routed head, e.g. 0.9")
    pr.add_argument("--no-renormalize", action="store_true",
                    help="mask only: do not rescale a row's kept weights to its |weight| mass (the paper's default)")
    pr.add_argument("--save", metavar="DIR", help="write the pruned model(s) as checkpoints (several: DIR/<label>)")
    pr.add_argument("--out", help="the markdown summary (default $LIME_RESULTS/prune/top_p_<p>.md)")
    pr.add_argument("--margin", type=float, help="equivalence margin of the loss change, in nats")
    pr.add_argument("--run-id", help="MLflow run to log to (one target; default: the target's)")
    pr.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    pr.set_defaults(func=_lazy("orchestrator.cli.prune:cmd_prune"))
    return p


def main(argv: list[str] | None = None) -> int:
    exposure.quiet_telemetry()  # Ray's usage stats and MLflow's telemetry off (LIME_TELEMETRY=1: on)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("alembic", "mlflow", "urllib3", "filelock", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrackingUnavailable as e:  # the MLflow server stayed away longer than $LIME_TRACKING_WAIT_S
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
