"""``lime bench``: the benchmark's options, their checks, the run and its MLflow record.

Importing this module loads no torch (``lime --help`` builds the parser from ``add_arguments``):
the router registry is read through ``lime_arch``'s lazy names and ``run_bench`` through
``orchestrator.bench``'s, both only when the command runs.
"""
from __future__ import annotations

import argparse

import lime_arch
import orchestrator.bench
from lime_arch.errors import ConfigError
from orchestrator.bench.shapes import (
    COMPILE_MODES,
    COMPILE_SHAPES,
    HEADLINE_CAPS,
    HEADLINE_MIX_SHAPES,
    HEADLINE_SHAPES,
    PEER_MAX_LAYERS,
    QUICK_SHAPES,
    SHAPES,
    SHAPES_BY_NAME,
    bench_routers,
    compile_shape_names,
)
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import RunLogger

PROFILE_SHAPES = ("L64-MHA", "L128-MHA")  # lime bench --profile's default shapes


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's options (``lime bench``)."""
    ap.add_argument("--out", default="results/bench", help="folder for bench.md, bench.csv, decode.csv")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one repetition (a smoke test)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (default 1, timed by the thread's CPU time; more threads by wall time)")
    ap.add_argument("--shapes", help="comma-separated subset of " + ",".join(SHAPES_BY_NAME))
    ap.add_argument("--routers", help="comma-separated router specs (default: every registered router, "
                    "those taking an integer as first-4, last-4, dilated-8, others <name>-4)")
    ap.add_argument("--depth-mixes", help="comma-separated depth mixes benchmarked over the none router, the "
                    "paper's peer architectures and the field (default: every registered depth mix; "
                    "'none' for none of them)")
    ap.add_argument("--compile", default="none", metavar="MODE",
                    help="add rows with the model's forward torch.compile'd in this mode beside the eager rows, "
                         "each paired against none compiled alike (the paper's Table 17 setting): "
                         + ", ".join(COMPILE_MODES) + " (default none: eager only)")
    ap.add_argument("--compile-shapes", metavar="SHAPES",
                    help="the shapes that get compiled rows: comma-separated, or 'all' (default "
                         + ",".join(COMPILE_SHAPES) + ", the paper's 16-layer Table 17 models; a cold whole-model "
                         "build of one L64 variant takes minutes on CPU)")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the benchmark: profile the routing alone, product by product, against "
                         "same-shaped reference GEMMs (profile.md in --out; default shapes L64-MHA,L128-MHA, "
                         "default routers every learned one)")
    ap.add_argument("--headline", action="store_true",
                    help="the headline table (make bench): " + ",".join(HEADLINE_SHAPES) + ", depth mixes at "
                    + ",".join(HEADLINE_MIX_SHAPES) + " only and eager only, round caps " + ",".join(
                        f"{k}:{v}" for k, v in HEADLINE_CAPS.items()) + ", peak memory of the eager rows only")
    ap.add_argument("--max-rounds", type=int, metavar="N",
                    help="at most N paired rounds per shape (rows stop earlier once their interval decides "
                         "their target or is narrow enough; default: each shape's own cap)")
    ap.add_argument("--fixed-rounds", action="store_true",
                    help="every row gets each shape's full rounds (fixed-n intervals), as before the stopping rule")
    ap.add_argument("--peers", action="store_true",
                    help="also time the implementations a user would pick instead, each against its own baseline "
                         "(x-transformers' decoder and its variants, the hyper-connections package; the optional "
                         f"extra: pip install '.[peers]') at the run's shapes of at most {PEER_MAX_LAYERS} layers: "
                         "a section of bench.md and peers.csv; without the extra, one line says so and the rest runs")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode timing")
    ap.add_argument("--no-track", action="store_true", help="do not log the results to MLflow")


def _routers(spec: str | None) -> tuple[str, ...] | None:
    if not spec:
        return None  # run_bench benchmarks every registered router
    routers = tuple(spec.split(","))
    for r in routers:
        try:
            lime_arch.parse_router(r)
        except ConfigError as e:
            raise ConfigError(str(e).replace("model.router", "bench.routers", 1)) from None
    return routers


def _depth_mixes(spec: str | None) -> tuple[str, ...] | None:
    if spec is None:
        return None  # run_bench's default: the paper's Table 17 peers
    mixes = tuple(d for d in spec.split(",") if d)
    for d in mixes:
        try:
            lime_arch.parse_depth_mix(d)
        except ConfigError as e:
            raise ConfigError(str(e).replace("model.depth_mix", "bench.depth_mixes", 1)) from None
    return tuple(d for d in mixes if d != "none")


def _compile_shapes(a: argparse.Namespace, shapes) -> tuple[str, ...] | None:
    """The shapes that get compiled rows (None: ``run_bench``'s default), checked before anything runs."""
    spec = getattr(a, "compile_shapes", None)
    if spec is None and (a.quick or a.compile == "none"):
        return None
    if a.compile == "none":
        raise ConfigError("bench.compile_shapes: needs a compile mode (--compile default or reduce-overhead)")
    return compile_shape_names(spec, [sh.name for sh in shapes or (QUICK_SHAPES if a.quick else SHAPES)], a.quick)


def options(a: argparse.Namespace) -> dict:
    """Checked keyword arguments of ``run_bench``; a bad value raises one ConfigError line (a cuda
    device torch cannot see is ``run_bench``'s first check)."""
    shapes = None
    if a.shapes:
        bad = [n for n in a.shapes.split(",") if n not in SHAPES_BY_NAME]
        if bad:
            raise ConfigError(f"bench.shapes: unknown {', '.join(bad)}; allowed: {', '.join(SHAPES_BY_NAME)}")
        shapes = tuple(SHAPES_BY_NAME[n] for n in a.shapes.split(","))
    routers = _routers(a.routers)
    if a.device not in (None, "cpu", "cuda"):
        raise ConfigError(f"bench.device: {a.device!r}; allowed: cpu, cuda")
    if a.threads is not None and a.threads < 1:
        raise ConfigError(f"bench.threads: must be >= 1, got {a.threads}")
    if a.compile not in COMPILE_MODES:
        raise ConfigError(f"bench.compile: {a.compile!r}; allowed: {', '.join(COMPILE_MODES)}")
    out = {"out_dir": a.out, "quick": a.quick, "device": a.device, "threads": a.threads, "shapes": shapes,
           "routers": routers, "memory": not a.no_memory, "decode": not a.no_decode,
           "compile": None if a.compile == "none" else a.compile, "compile_shapes": _compile_shapes(a, shapes)}
    out.update(_rounds(a, shapes))
    if getattr(a, "peers", False):
        out["peers"] = _peers(a, out["shapes"])
    mixes = _depth_mixes(getattr(a, "depth_mixes", None))
    return out if mixes is None else {**out, "depth_mixes": mixes}


def _peers(a: argparse.Namespace, shapes) -> bool:
    """``--peers``, checked: it needs a benchmark run with a shape it runs at."""
    if getattr(a, "profile", False):
        raise ConfigError("bench.peers: times whole training steps; not with --profile")
    if shapes and not any(sh.n_layers <= PEER_MAX_LAYERS for sh in shapes):
        raise ConfigError(f"bench.peers: runs at shapes of at most {PEER_MAX_LAYERS} layers; --shapes has none "
                          f"(e.g. L16-MHA,L16-GQA)")
    return True


def _rounds(a: argparse.Namespace, shapes) -> dict:
    """The stopping options of ``run_bench`` (``--headline``, ``--max-rounds``, ``--fixed-rounds``), checked."""
    headline, cap = getattr(a, "headline", False), getattr(a, "max_rounds", None)
    fixed = getattr(a, "fixed_rounds", False)
    if headline and (a.shapes or a.quick):
        raise ConfigError("bench.headline: picks its own shapes; drop --shapes and --quick")
    if cap is not None and (cap < 1 or fixed):
        raise ConfigError(f"bench.max_rounds: must be >= 1 and without --fixed-rounds, got {cap}")
    out: dict = {"fixed_rounds": fixed}
    if headline:
        out.update(shapes=tuple(SHAPES_BY_NAME[n] for n in HEADLINE_SHAPES), caps=dict(HEADLINE_CAPS),
                   depth_mix_shapes=HEADLINE_MIX_SHAPES, memory_compiled=False, compile_depth_mixes=False)
    if cap is not None:
        names = HEADLINE_SHAPES if headline else [sh.name for sh in shapes or SHAPES_BY_NAME.values()]
        out["caps"] = {n: cap for n in names}
    return out


def print_summary(out: dict) -> None:
    """The files written and the count of passed checks."""
    for p in out["paths"]:
        print(f"wrote {p}")
    n_ok = sum(c["ok"] for c in out["checks"])
    print(f"{n_ok}/{len(out['checks'])} checks pass; {out['machine']['seconds']:.0f} s")
    if out.get("peers", {}).get("skipped"):
        print(out["peers"]["skipped"])


def _metrics(out: dict) -> dict[str, float]:
    """Every ratio of every row and decode batch, keyed ``bench/<metric>/<router>.<impl>.<shape>`` (a peer
    architecture's row: ``...<shape>.<depth mix>``; compiled rows: ``....<mode>``)."""
    metrics = {}
    for r in out["rows"]:
        key = f"{r['router']}.{r['impl']}.{r['shape']}"
        if r.get("depth_mix", "none") != "none":  # the peer architectures' rows (no '+' in MLflow names)
            key += f".{r['depth_mix']}"
        mode = r.get("compile", "eager")
        key += "" if mode == "eager" else f".{mode}"
        for m in ("ratio", "overhead_pct", "flop_overhead_pct", "mem_ratio", "alone_pct"):
            if r.get(m) is not None:
                metrics[f"bench/{m}/{key}"] = float(r[m])
    for d in out["decode"]:
        metrics[f"bench/decode_ratio/{d['router']}.b{d['batch']}"] = float(d["ratio"])
        metrics[f"bench/decode_tok_s/{d['router']}.b{d['batch']}"] = float(d["tok_s"])
    metrics["bench/checks_passed"] = float(sum(c["ok"] for c in out["checks"]))
    return metrics


def _track(out: dict, quick: bool) -> None:
    """One MLflow run in experiment ``lime-bench``: the machine as params, the ratios, the files."""
    log = RunLogger("lime-bench", run_name="bench-quick" if quick else "bench", tags={"kind": "bench"})
    log.log_params({k: v for k, v in out["machine"].items() if isinstance(v, (str, int, float, bool))})
    log.log_metrics(_metrics(out), step=0, flush=True)
    for p in out["paths"]:
        log.log_artifact(p)
    log.end(TrialStatus.FINISHED)
    print(f"MLflow run: {log.run_id} (experiment 'lime-bench')")


def cmd_profile(kw: dict) -> int:
    """``lime bench --profile``: the routing's products against reference GEMMs (CPU)."""
    if kw["device"] == "cuda":
        raise ConfigError("bench.profile: profiles the CPU routing; drop --device cuda")
    shapes = kw["shapes"] or tuple(SHAPES_BY_NAME[n] for n in PROFILE_SHAPES)
    routers = kw["routers"] or tuple(r for r in bench_routers() if r != "none")
    out = orchestrator.bench.run_profile(kw["out_dir"], routers, shapes, threads=kw["threads"] or 1)
    print(f"wrote {out['path']} (large GEMM {out['large_gflops']:.1f} GFLOP/s)")
    return 0


def cmd_bench(args) -> int:
    kw = options(args)  # ConfigError -> one line, exit 2, before anything runs
    if args.profile:
        return cmd_profile(kw)
    out = orchestrator.bench.run_bench(**kw, steady_heap=True)  # this process ends with the run
    print_summary(out)
    if not args.no_track:
        _track(out, args.quick)
    return 0
