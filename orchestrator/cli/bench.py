"""``lime bench``: run the benchmark and log its results to MLflow."""
from __future__ import annotations

from orchestrator.bench.run import options, print_summary, run_bench
from orchestrator.core.tracking import RunLogger


def cmd_bench(args) -> int:
    kw = options(args)  # ConfigError -> one line, exit 2, before anything runs
    out = run_bench(**kw)
    print_summary(out)
    paths = out["paths"]
    if not args.no_track:
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
