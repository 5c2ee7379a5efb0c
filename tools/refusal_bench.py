"""How fast the CLI says no (``make refusal-bench``): malformed sweep files and trial configs
against ``lime --help``.

A malformed file must be refused with one line on stderr and exit code 2, before torch, Ray or
MLflow are imported. This script writes its malformed files to a temp folder (``cases``: an
unknown key, router, depth mix or preset, a bad number or argument, a missing data file, an
``extends`` cycle, a key given twice, a file that is not UTF-8, an empty grid, ...), then runs,
interleaved in rounds as subprocesses of this one process, ``lime --help`` and each refusal
(``lime sweep run FILE --dry-run``, ``lime train --config FILE``), checks every refusal (exit 2,
nothing on stdout, one ``error: ...`` line on stderr, naming what ``cases`` expects) and prints
the median time of a refusal relative to the ``--help`` run beside it, with a distribution-free
confidence interval (order statistics of the binomial), and the absolute medians.

Timing is wall-clock: run it alone on the machine. Stdlib only (and PyYAML for the files).
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

# A valid sweep and a valid trial: each case changes one thing.
TRIAL = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
         "data": {"source": "builtin"}, "optim": {"lr": 3.0e-3, "min_lr": 3.0e-4, "warmup_steps": 2},
         "train": {"steps": 20, "batch_size": 4, "seq_len": 32}}


def _sweep(name: str, changes: dict) -> dict:
    doc = {"name": name, "description": "a malformed sweep", "base": yaml.safe_load(yaml.safe_dump(TRIAL)),
           "grid": {"router": ["none", "full"], "seed": [0, 1]}, "resources": {"cpu": 1}}
    for key, value in changes.items():  # "base.optim.lr" -> doc["base"]["optim"]["lr"]; "grid.optim.lr": an axis
        parts = key.split(".", 1) if key.startswith("grid.") else key.split(".")
        cur = doc
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    return doc


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # the lime command line
    expect: str  # a fragment the one error line must contain (the key path, mostly)


# name -> (sweep changes or raw text, the fragment the error names)
SWEEP_CASES: dict[str, tuple[dict | str | bytes, str]] = {
    "unknown-top-key": ({"grd": {"router": ["full"]}}, "grd: unknown key"),
    "unknown-base-key": ({"base.optim.lrr": 0.1}, "base.optim.lrr: unknown key"),
    "unknown-router": ({"grid.router": ["none", "fulll"]}, "grid.router[1]: unknown router 'fulll'"),
    "router-arg-zero": ({"grid.router": ["first-0"]}, "grid.router[0]: 'first-0' needs a positive integer"),
    "router-arg-missing": ({"grid.router": ["first"]}, "needs an integer"),
    "router-arg-not-a-number": ({"grid.router": ["first-x"]}, "unknown router 'first-x'"),
    "unknown-depth-mix": ({"base.model.depth_mix": "denseform"}, "unknown depth mix 'denseform'"),
    "depth-mix-arg-zero": ({"base.model.depth_mix": "denseformer-0"}, "needs a positive integer for dilation"),
    "depth-mix-too-many-args": ({"base.model.depth_mix": "hyper-connections-2-2"}, "takes at most 1"),
    "depth-mix-period-too-long": ({"base.model.depth_mix": "denseformer-1-9"}, "period 9 exceeds model.n_layers=2"),
    "depth-mix-giant": ({"base.model.depth_mix": "mhc-100000"}, "depth_mix mhc-100000 (128P of them)"),
    "sinkhorn-rounds": ({"base.model.depth_mix": "mhc-4-1000000000"}, "at most 1000 Sinkhorn-Knopp rounds"),
    "prune-never-starts": ({"base.model.router": "full", "base.model.router_prune": {"top_p": 0.9, "start": 500}},
                           "base.model.router_prune.start: 500 is beyond train.steps=20"),
    "router-beyond-depth": ({"grid.router": ["none", "first-20"]},
                            "grid.router[1]: 'first-20': j 20 is beyond the model's depth; allowed: 1 to 2"),
    "margin-unknown-metric": ({"report": {"margin": {"final/nope": "1%"}}},
                              "report.margin: 'final/nope' is not a metric this sweep's trials log"),
    "margin-too-wide": ({"report": {"margin": "500%"}}, "report.margin: a percentage must be above 0 and below 100%"),
    "max-seeds-no-wave": ({"decide": {"max_seeds": 2}}, "decide.max_seeds: 2 equals the 2 seeds of grid.seed"),
    "negative-lr": ({"base.optim.lr": -1.0}, "base.optim.lr: must be > 0"),
    "steps-not-a-number": ({"base.train.steps": "many"}, "base.train.steps: must be an integer"),
    "batch-size-bool": ({"base.train.batch_size": True}, "base.train.batch_size: must be an integer"),
    "min-lr-above-lr": ({"base.optim.min_lr": 0.1}, "base.optim.min_lr: 0.1 is above"),
    "seq-len-too-long": ({"base.train.seq_len": 4096}, "base.train.seq_len: 4096 is longer"),
    "missing-data-file": ({"base.data": {"source": "text", "paths": ["/nonexistent/corpus.txt"]}},
                          "base.data.paths: no file matches"),
    "text-without-paths": ({"base.data": {"source": "text"}}, "base.data.paths: the text source needs"),
    "unknown-data-source": ({"base.data.source": "wiki"}, "unknown source 'wiki'"),
    "bad-tokenizer": ({"base.data.tokenizer": "wordpiece"}, "base.data.tokenizer: 'wordpiece' is not one of"),
    "bad-task-parameter": ({"base.data": {"source": "arithmetic", "task": {"n_ops": 99}}},
                           "base.data.task.n_ops: task 'arithmetic'"),
    "unknown-preset": ({"base.preset": "7b"}, "unknown preset '7b'"),
    "unknown-model-field": ({"base.model.n_headz": 2}, "base.model.n_headz: unknown key"),
    "heads-do-not-divide": ({"base.model.n_heads": 3}, "base.model.n_heads: 3 does not divide"),
    "empty-grid-axis": ({"grid.router": []}, "grid.router: empty list"),
    "grid-axis-unknown-key": ({"grid.optim.lrr": [0.1]}, "grid.optim.lrr: unknown key"),
    "name-not-file-name": ({"name": "another"}, "must equal the file name"),
    "reserved-name": ("name: ray\ndescription: x\nbase: {preset: tiny}\n", "name: 'ray' is reserved"),
    "bad-search-bounds": ({"grid": {"seed": [0]}, "search": {"space": {"lr": {"loguniform": [0, 0.01]}}}},
                          "search.space.lr.loguniform"),
    "workers-split-batch": ({"resources": {"cpu": 1, "workers": 3}}, "resources.workers: 3 workers split"),
    "duplicated-key": ("name: duplicated-key\ndescription: x\nbase: {preset: tiny}\nbase: {preset: tiny}\n",
                       "duplicate key 'base'"),
    "not-utf8": (b"name: not-utf8\ndescription: caf\xe9\n", "is not UTF-8"),
    "yaml-syntax": ("name: yaml-syntax\ndescription: [unclosed\n", "not valid YAML"),
    "not-a-mapping": ("- name\n- description\n", "(top level): must be a mapping"),
    "empty-file": ("", "(top level): must be a mapping"),
}
EXTENDS = {  # files that extend each other: a cycle, and a missing parent
    "cycle-a": "name: cycle-a\ndescription: x\nextends: cycle-b\n",
    "cycle-b": "name: cycle-b\ndescription: x\nextends: cycle-a\n",
    "missing-parent": "name: missing-parent\ndescription: x\nextends: no-such-sweep\n",
}
TRAIN_CASES: dict[str, tuple[dict | str | bytes, str]] = {
    "train-unknown-key": ({**TRIAL, "optimizer": {}}, "optimizer: unknown key"),
    "train-unknown-router": ({**TRIAL, "model": {**TRIAL["model"], "router": "fulll"}}, "unknown router 'fulll'"),
    "train-bad-depth-mix": ({**TRIAL, "model": {**TRIAL["model"], "depth_mix": "denseformer-0"}},
                            "model.depth_mix: 'denseformer-0' needs"),
    "train-bad-number": ({**TRIAL, "optim": {"lr": "fast"}}, "optim.lr: must be a number"),
    "train-missing-data-file": ({**TRIAL, "data": {"source": "text", "paths": ["/nonexistent/a.txt"]}},
                                "data.paths: no file matches"),
    "train-unknown-preset": ({**TRIAL, "preset": "7b"}, "unknown preset '7b'"),
    "train-duplicated-key": ("preset: tiny\npreset: tiny\n", "duplicate key 'preset'"),
    "train-not-utf8": (b"preset: tin\xff\n", "is not UTF-8"),
    "train-not-a-mapping": ("[1, 2]\n", "must hold a mapping"),
}


def _write(path: Path, content: dict | str | bytes) -> None:
    if isinstance(content, dict):
        content = yaml.safe_dump(content, sort_keys=False)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def cases(folder: Path) -> list[Case]:
    """Write every malformed file to ``folder`` and return the command line of each refusal."""
    out = []
    for name, (content, expect) in SWEEP_CASES.items():
        path = folder / f"{name}.yaml"
        _write(path, _sweep(name, content) if isinstance(content, dict) else content)
        out.append(Case(name, ("sweep", "run", str(path), "--dry-run"), expect))
    for name, content in EXTENDS.items():
        _write(folder / f"{name}.yaml", content)
    out.append(Case("extends-cycle", ("sweep", "run", str(folder / "cycle-a.yaml"), "--dry-run"), "extends: a cycle"))
    out.append(Case("extends-missing", ("sweep", "run", str(folder / "missing-parent.yaml"), "--dry-run"),
                    "extends: no file"))
    out.append(Case("no-such-file", ("sweep", "run", str(folder / "nowhere.yaml"), "--dry-run"), "no such sweep"))
    base = folder / "_shared.yaml"
    _write(base, _sweep("_shared", {}))
    out.append(Case("shared-base-run", ("sweep", "run", str(base), "--dry-run"), "a shared base"))
    out.append(Case("bad-add-seeds", ("sweep", "run", str(folder / "unknown-router.yaml"), "--add-seeds", "x"),
                    "--add-seeds"))
    waves = folder / "waves.yaml"  # a valid sweep: the flags of --until-decided are what is wrong
    _write(waves, _sweep("waves", {}))
    out.append(Case("max-seeds-above-limit", ("sweep", "run", str(waves), "--until-decided", "--max-seeds", "100000"),
                    "--max-seeds: must be an integer in [2, 1000]"))
    out.append(Case("empty-margin", ("sweep", "run", str(waves), "--until-decided", "--margin", ""), "--margin: empty"))
    out.append(Case("bad-budget", ("sweep", "run", str(waves), "--until-decided", "--budget", "hours=2"),
                    "--budget: must be KEY=VALUE"))
    empty_budget = folder / "empty-budget.yaml"
    _write(empty_budget, _sweep("empty-budget", {"decide.budget": {}}))
    out.append(Case("empty-budget", ("sweep", "run", str(empty_budget), "--dry-run"), "decide.budget: empty"))
    out.append(Case("plan-unknown-router", ("plan", str(folder / "unknown-router.yaml")), "unknown router"))
    out.append(Case("report-missing-file", ("report", str(folder / "nowhere.yaml")), "does not exist"))
    rounds = ("report", "some-sweep", "--throughput", "--throughput-rounds")
    out.append(Case("report-throughput-rounds-zero", (*rounds, "0"),
                    "report --throughput-rounds: must be an integer between 1 and 200, got '0'"))
    out.append(Case("report-throughput-rounds-many", (*rounds, "201"),
                    "must be an integer between 1 and 200, got '201'"))
    out.append(Case("report-throughput-rounds-text", (*rounds, "x"), "must be an integer between 1 and 200, got 'x'"))
    out.append(Case("report-rounds-without-throughput", ("report", "some-sweep", "--throughput-rounds", "8"),
                    "report --throughput-rounds: only with --throughput"))
    out.append(Case("report-pool-throughput", ("report", "--pool", "a,b", "--throughput"),
                    "report --pool: no --throughput"))
    for name, (content, expect) in TRAIN_CASES.items():
        path = folder / f"{name}.yaml"
        _write(path, content)
        out.append(Case(name, ("train", "--config", str(path)), expect))
    out.append(Case("train-no-such-config", ("train", "--config", str(folder / "nowhere.yaml")), "does not exist"))
    return out


def lime_command() -> list[str]:
    """The ``lime`` script beside this interpreter (a virtual environment's), else the module."""
    script = Path(sys.executable).parent / "lime"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "orchestrator.cli"]


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120)
    return time.perf_counter() - t0, out


def problem(case: Case, out: subprocess.CompletedProcess) -> str | None:
    """What is wrong with a refusal (None: exit 2, no stdout, one error line naming ``expect``)."""
    lines = out.stderr.splitlines()
    if out.returncode != 2 or out.stdout or len(lines) != 1 or not lines[0].startswith("error: "):
        return f"exit {out.returncode}, stdout {out.stdout[:200]!r}, stderr {out.stderr[-400:]!r}"
    if case.expect not in lines[0]:
        return f"the error does not name {case.expect!r}: {lines[0]}"
    return None


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """(median, low, high, coverage): the interval between order statistics k and n + 1 - k that
    covers the population median with probability >= ``level`` whatever the distribution
    (Binomial(n, 1/2) tails); the whole range when n is too small for that level."""
    s, n = sorted(xs), len(xs)
    tail = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    k, below = 0, 0.0  # the largest k with P(B <= k - 1) <= (1 - level) / 2
    while k < n // 2 and below + tail[k] <= (1 - level) / 2:
        below += tail[k]
        k += 1
    if k == 0:
        return statistics.median(s), s[0], s[-1], 1 - 2 * tail[0]
    return statistics.median(s), s[k - 1], s[n - k], 1 - 2 * below


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds over every case (default 5)")
    ap.add_argument("--limit", type=float, default=1.0, help="the refusal budget in seconds (default 1)")
    args = ap.parse_args(argv)
    lime = lime_command()
    folder = Path(tempfile.mkdtemp(prefix="lime-refusals-"))
    try:
        all_cases = cases(folder)
        help_t, ref_t, ratios, bad = [], [], [], []
        per_case: dict[str, list[float]] = {c.name: [] for c in all_cases}
        for _ in range(args.rounds):
            for case in all_cases:  # interleaved: each refusal beside its own --help run
                th, out = timed([*lime, "--help"])
                if out.returncode != 0:
                    raise SystemExit(f"lime --help failed: {out.stderr[-400:]}")
                tr, out = timed([*lime, *case.argv])
                why = problem(case, out)
                if why:
                    bad.append(f"{case.name}: {why}")
                help_t.append(th)
                ref_t.append(tr)
                ratios.append(tr / th)
                per_case[case.name].append(tr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{len(all_cases)} malformed inputs x {args.rounds} rounds, each beside a `lime --help` run "
          f"({' '.join(lime)})")
    m, lo, hi, cov = median_interval(ratios)
    print(f"refusal / --help: median {m:.2f} ({cov:.1%} interval {lo:.2f} .. {hi:.2f}), n={len(ratios)}")
    for label, xs in (("--help", help_t), ("refusal", ref_t)):
        m, lo, hi, cov = median_interval(xs)
        print(f"{label:>8}: median {m * 1000:.0f} ms ({cov:.1%} interval {lo * 1000:.0f} .. {hi * 1000:.0f} ms), "
              f"max {max(xs) * 1000:.0f} ms")
    slowest = sorted(per_case.items(), key=lambda kv: -statistics.median(kv[1]))[:5]
    print("slowest refusals (median ms): " + ", ".join(f"{k} {statistics.median(v) * 1000:.0f}" for k, v in slowest))
    over = [k for k, v in per_case.items() if statistics.median(v) >= args.limit]
    if bad or over:
        for line in bad:
            print(f"BAD {line}", file=sys.stderr)
        if over:
            print(f"OVER {args.limit:g} s (median): {', '.join(over)}", file=sys.stderr)
        return 1
    print(f"every refusal: exit 2 and one error line; every median under {args.limit:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
