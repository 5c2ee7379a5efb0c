"""The benchmark in reduced form (tiny shapes, seconds): outputs, pairing, intervals. No test asserts
a speed."""
import csv

import pytest
import torch

from orchestrator.bench import step
from orchestrator.bench.shapes import DECODE_ROUTERS, PEER, QUICK_SHAPES, Shape, bench_depth_mixes, bench_routers
from orchestrator.bench.suite import run_bench
from orchestrator.bench.timing import median_ci, paired_times


def test_quick_bench_end_to_end(tmp_path):
    torch.set_default_dtype(torch.float32)
    out = run_bench(out_dir=tmp_path, quick=True)
    paths = out["paths"]
    assert {p.rsplit("/", 1)[-1] for p in paths} == {"bench.md", "bench.csv", "decode.csv"}
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    want = {(r.split("/")[0], "concat" if r == PEER else "buffer", s.name)
            for r in ("none", *bench_routers(), PEER) for s in QUICK_SHAPES}
    assert {(r["router"], r["impl"], r["shape"]) for r in rows} == want
    # the paper's peer architectures (Table 17): a depth mix over the none router, no target
    peers = [r for r in rows if r["depth_mix"] != "none"]
    mixes = bench_depth_mixes()  # every registered one
    assert {(r["depth_mix"], r["shape"]) for r in peers} == {(d, s.name) for d in mixes for s in QUICK_SHAPES}
    assert {"denseformer", "hyper-connections", "mhc", "attn-res", "attn-res-block", "mudd"} <= set(mixes)
    for r in peers:
        assert r["router"] == "none" and r["verdict"] == "peer" and r["target_pct"] == ""
        assert float(r["flop_overhead_pct"]) > 0 and float(r["mem_ratio"]) > 0 and float(r["step_ms"]) > 0
    for r in rows:
        assert float(r["step_ms"]) > 0 and float(r["ratio"]) > 0 and float(r["peak_mb"]) > 0
        assert int(r["flops_per_token"]) > 0 and 0 < float(r["mem_ratio"]) < 10
        assert float(r["flop_overhead_pct"]) >= 0
        if r["depth_mix"] != "none":
            continue  # the peers, above
        if r["router"] == "none":
            assert float(r["ratio"]) == 1.0 and r["verdict"] == "baseline"
        elif r["impl"] == "buffer":
            assert r["verdict"].startswith(("pass", "fail")) and float(r["target_pct"]) >= 1.0
    with open(tmp_path / "decode.csv") as f:
        dec = list(csv.DictReader(f))
    assert {(d["router"], d["batch"]) for d in dec} == {(r, b) for r in DECODE_ROUTERS for b in ("1", "8")}
    assert {"none", "full", "first-4", "dynamic"} <= set(DECODE_ROUTERS)
    for d in dec:
        assert float(d["tok_s"]) > 0
        base = next(x for x in dec if x["router"] == "none" and x["batch"] == d["batch"])
        assert d["kv_bytes"] == base["kv_bytes"]
    md = (tmp_path / "bench.md").read_text()
    for needle in ("torch", "threads", "cpu", "Table 17", "Decode", "checks pass"):
        assert needle in md
    assert len(out["rows"]) == len(rows) and out["checks"]
    # the dynamic routers beside the static router of the same sources
    twins = {(r["router"], r["static_twin"]) for r in rows if r["static_twin"]}
    assert twins == {("dynamic", "full"), ("dynamic-first-4", "first-4"), ("dynamic-last-4", "last-4"),
                     ("depth-attention", "full")}
    assert "| dynamic | full | L3-MHA | eager |" in md and "| dynamic-first-4 | first-4 | L3-GQA | eager |" in md
    for r in rows:  # the analytic routing memory: the dynamic kind keeps its queries on top of the K/V
        if r["static_twin"]:
            twin = next(t for t in rows if t["router"] == r["static_twin"] and t["shape"] == r["shape"]
                        and t["impl"] == "buffer" and t["depth_mix"] == "none")
            assert float(r["kept_mb"]) > float(twin["kept_mb"]) > 0


def test_median_ci_is_the_sign_test_interval():
    """Order statistics from the binomial table: n=20 -> 6th and 15th, n=10 -> 2nd and 9th, n=5 -> range."""
    xs = [float(i) for i in range(1, 21)]
    assert median_ci(xs[::-1]) == (6.0, 15.0)
    assert median_ci(xs[:10]) == (2.0, 9.0)
    assert median_ci(xs[:5]) == (1.0, 5.0)


def test_paired_times_put_every_variant_between_two_baseline_steps():
    seq = []
    cost = {"none": 2.0, "a": 3.0, "b": 1.0}
    t = [0.0]

    def step(lab):
        seq.append(lab)
        t[0] += cost[lab]

    times, _, ratios = paired_times(step, ["none", "a", "b"], "none", 3, lambda: t[0])
    assert seq[:5] == ["none", "a", "none", "b", "none"] and seq[5:10] == ["none", "b", "none", "a", "none"]
    assert ratios["a"] == [1.5] * 3 and ratios["b"] == [0.5] * 3 and ratios["none"] == [1.0] * 3
    assert len(times["none"]) == 9 and times["a"] == [3.0] * 3


def _compiled_quick_run(tmp_path, compile_mode="default", shapes=(QUICK_SHAPES[1],)):
    out = run_bench(out_dir=tmp_path, quick=True, shapes=shapes, routers=("first-4",), decode=False,
                    compile=compile_mode)
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    labels = {(r["router"], r["impl"], r["compile"]) for r in rows}
    assert labels == {(r, i, c) for r, i in (("none", "buffer"), ("first-4", "buffer"), ("full", "concat"))
                      for c in ("eager", compile_mode)}
    for r in rows:
        assert float(r["step_ms"]) > 0 and float(r["peak_mb"]) > 0
        if r["router"] == "none" and r["depth_mix"] == "none":
            assert float(r["ratio"]) == 1.0 and float(r["mem_ratio"]) == 1.0  # each against its own none
    checks = [c["check"] for c in out["checks"]]
    assert f"step time first-4 @ L3-GQA compiled ({compile_mode})" in checks and "step time first-4 @ L3-GQA" in checks
    assert out["machine"]["compile"] == compile_mode
    assert "| first-4 | none | L3-GQA | buffer | default |" in (tmp_path / "bench.md").read_text()
    return rows


@pytest.mark.slow  # two minutes of Inductor builds; test_compiled_rows_only_at_the_compile_shapes covers the path
def test_quick_bench_with_compiled_rows(tmp_path, monkeypatch):
    """Compiled rows beside the eager ones, each paired against none compiled alike. Inductor's
    C++ build takes minutes here, so this run compiles with Dynamo and AOTAutograd only (the
    graphs Inductor would get); the slow test below runs Inductor."""
    real = torch.compile
    monkeypatch.setattr(step.torch, "compile", lambda model, mode=None: real(model, backend="aot_eager"))
    # Three shapes: Dynamo counts recompiles of Decoder.forward across every model of the process,
    # and a limit reached would run the later shapes' variants eagerly under "compiled" labels
    # (the full bench hit it at its third shape). Reaching the limit raises here.
    shapes = (*QUICK_SHAPES, Shape("L2-MHA", 2, 8, 1))
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):  # restored after
        rows = _compiled_quick_run(tmp_path, shapes=shapes)
    assert {r["shape"] for r in rows} == {s.name for s in shapes}


@pytest.mark.slow
def test_quick_bench_compiled_with_inductor(tmp_path):
    _compiled_quick_run(tmp_path)


def test_compiled_rows_only_at_the_compile_shapes(tmp_path, monkeypatch):
    """``compile_shapes`` picks the shapes that get compiled rows; the others stay eager only."""
    real = torch.compile
    monkeypatch.setattr(step.torch, "compile", lambda model, mode=None: real(model, backend="aot_eager"))
    out = run_bench(out_dir=tmp_path, quick=True, shapes=QUICK_SHAPES, routers=("first-4",), decode=False,
                    memory=False, depth_mixes=(), compile="default", compile_shapes=("L3-GQA",))
    got = {(r["shape"], r["compile"]) for r in out["rows"]}
    assert got == {("L3-MHA", "eager"), ("L3-GQA", "eager"), ("L3-GQA", "default")}
    assert out["machine"]["compile_shapes"] == "L3-GQA"


def test_depth_mixes_eager_only_when_asked(tmp_path, monkeypatch):
    """``compile_depth_mixes=False`` (the headline run): the depth mixes' rows are eager only, the
    routers' are eager and compiled."""
    real = torch.compile
    monkeypatch.setattr(step.torch, "compile", lambda model, mode=None: real(model, backend="aot_eager"))
    out = run_bench(out_dir=tmp_path, quick=True, shapes=QUICK_SHAPES[1:], routers=("first-4",), decode=False,
                    memory=False, depth_mixes=("denseformer",), compile="default", compile_depth_mixes=False)
    got = {(r["label"], r["compile"]) for r in out["rows"]}
    assert got == {(lab, mode) for lab in ("none", "first-4", PEER) for mode in ("eager", "default")} | \
        {("none+denseformer", "eager")}
