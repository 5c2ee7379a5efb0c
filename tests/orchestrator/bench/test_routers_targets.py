"""The benchmark's router list comes from the registry; its targets give hand-checkable verdicts."""
import subprocess
import sys
from pathlib import Path

import lime_arch.router_base as router_base
from lime_arch.routers import ROUTERS, FirstRouter, RouterArg, parse_router, register_router
from orchestrator.bench.shapes import QUICK_SHAPES, bench_depth_mixes, bench_routers
from orchestrator.bench.suite import run_bench
from orchestrator.bench.targets import checks

ROOT = Path(__file__).resolve().parents[3]


def test_every_registered_router_is_benchmarked_once_with_its_default_integer():
    specs = bench_routers()
    assert [parse_router(s)[0] for s in specs] == list(ROUTERS.values())
    assert {"first-4", "last-4", "dilated-8", "none", "full", "per-dim"} <= set(specs)


def test_a_newly_registered_router_is_benchmarked_without_naming_it(tmp_path, monkeypatch):
    few = ROUTERS.copy()  # a registry holding none and full only
    for name in [n for n in few if n not in ("none", "full")]:
        del few[name]
    monkeypatch.setattr(router_base, "ROUTERS", few)

    @register_router("early")
    class EarlyRouter(FirstRouter):
        arguments = (RouterArg("j", example=3),)

    out = run_bench(tmp_path, quick=True, shapes=(QUICK_SHAPES[1],), memory=False, decode=False)
    # then every registered depth mix over none (``test_stopping``: those come from their registry)
    assert [r["label"] for r in out["rows"]] == ["none", "full", "early-3", "full/concat",
                                                 *(f"none+{d}" for d in bench_depth_mixes())]
    assert "early" not in ROUTERS  # the real registry is untouched


def _row(router, overhead, flop, **kw):
    return {"router": router, "impl": kw.pop("impl", "buffer"), "shape": kw.pop("shape", "L16-MHA"),
            "n_layers": kw.pop("n_layers", 16), "overhead_pct": overhead, "flop_overhead_pct": flop, **kw}


def test_step_targets_and_verdicts_by_hand():
    rows = [_row("none", 0.0, 0.0), _row("full", 3.9, 2.0),  # target 1.5 * 2 + 1 = 4.0
            _row("first-4", 4.1, 2.0, alone_pct=4.5, bw_floor_pct=9.0),  # alone above target first
            _row("last-4", 4.1, 2.0, alone_pct=3.0, bw_floor_pct=4.2),
            _row("per-dim", 4.1, 2.0, alone_pct=None, bw_floor_pct=None),
            _row("full", 50.0, 2.0, impl="concat")]
    chk = checks(rows, [])
    assert [r["target_pct"] for r in rows] == [None, 4.0, 4.0, 4.0, 4.0, None]
    assert [r["verdict"] for r in rows] == ["baseline", "pass", "fail: kernel-bound", "fail: bandwidth-bound",
                                            "fail", "peer"]
    assert [(c["check"], c["ok"]) for c in chk] == [
        ("step time full @ L16-MHA", True), ("step time first-4 @ L16-MHA", False),
        ("step time last-4 @ L16-MHA", False), ("step time per-dim @ L16-MHA", False)]


def test_deep_and_decode_targets_by_hand():
    deep = dict(shape="L64-MHA", n_layers=64)
    rows = [_row("none", 0.0, 0.0, **deep), _row("full", 20.0, 10.0, mem_ratio=1.04, peak_mb=500.0, **deep),
            _row("full", 30.0, 10.0, impl="concat", **deep)]
    dec = [{"router": "none", "batch": 1, "ratio": 1.0, "tok_s": 100.0, "kv_bytes": 64},
           {"router": "full", "batch": 1, "ratio": 0.91, "tok_s": 91.0, "kv_bytes": 64},
           {"router": "first-4", "batch": 1, "ratio": 0.94, "tok_s": 94.0, "kv_bytes": 65}]
    got = {c["check"]: (c["value"], c["target"], c["ok"]) for c in checks(rows, dec)}
    assert got["full vs naive concat @ L64-MHA"] == (20.0, 15.0, False)  # 0.5 x the peer's 30%
    assert got["peak memory full @ L64-MHA"] == (1.04, 1.03, False)
    assert got["decode full batch 1"] == (0.91, 0.90, True)
    assert got["decode first-4 batch 1"] == (0.94, 0.95, False)
    assert got["KV-cache bytes full batch 1"][2] and not got["KV-cache bytes first-4 batch 1"][2]


def test_lime_help_and_bench_help_do_not_import_torch():
    code = ("import sys; from orchestrator.cli import main\n"
            "for argv in (['--help'], ['bench', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "import orchestrator.cli.bench, orchestrator.bench.targets, orchestrator.bench.outputs\n"
            "print('HEAVY', sorted(k for k in ('torch', 'mlflow', 'ray') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--no-track" in out.stdout and "L128-MHA" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"
