"""The bench's stopping rule on synthetic ratio streams, its efficiency columns by hand, the
registry-derived depth-mix rows and the headline options. Fake clocks only: no test times anything."""
import numpy as np
import pytest
import torch

import lime_arch
from lime_arch.depth_mix import DEPTH_MIXES, DepthMix, register_depth_mix
from lime_arch.depth_mix import registry as registry_mod
from lime_arch.errors import ConfigError
from orchestrator.bench.shapes import HEADLINE_CAPS, Shape, bench_depth_mixes, depth_mix_labels
from orchestrator.bench.stopping import Stopping, ratio_target
from orchestrator.bench.timing import paired_times


def _stream(ratio: float, sd: float, seed: int):
    """A fake machine: ``none`` takes 100 ms x drift, every variant ``ratio`` times that x noise;
    the clock advances by what each step takes."""
    rng = np.random.default_rng(seed)
    now = [0.0]

    def step(lab):
        drift = 1.0 + 0.1 * np.sin(now[0])  # slow drift: the pairing cancels it
        now[0] += 0.1 * drift * (1.0 if lab == "none" else ratio * float(np.exp(rng.normal(0, sd))))
    return step, lambda: now[0]


def _run(ratio, target, cap, sd=0.02, seed=0):
    rule = Stopping(cap)
    step, clock = _stream(ratio, sd, seed)
    _, _, ratios = paired_times(step, ["none", "v"], "none", cap, clock, done=lambda lab, rs: rule.done(rs, target))
    return rule, ratios["v"]


def test_rows_far_from_their_target_stop_at_the_first_finite_interval():
    assert Stopping(30).min_rounds == 7  # 2 * 2^-7 < 5% < 2 * 2^-6 ... for the mixture sequence at 95%
    for ratio, target, side in ((1.20, 1.05, "misses"), (1.00, 1.10, "meets")):
        rule, rs = _run(ratio, target, cap=30)
        assert len(rs) == 7 and rule.side(rs, target) == side
        lo, hi = rule.interval(rs)  # n = 7, depth 1: the sequence is [min, max]
        assert (lo, hi) == (min(rs), max(rs))


def test_a_row_on_its_target_goes_to_the_cap_undecided():
    rule, rs = _run(1.05, 1.05, cap=25, seed=3)
    assert len(rs) == 25 and rule.side(rs, 1.05) == "undecided"


def test_rows_without_target_stop_when_narrow_enough():
    rule, rs = _run(1.3, None, cap=40, sd=0.002)
    lo, hi = rule.interval(rs)
    assert len(rs) == 7 and hi - lo <= 0.04
    rule, rs = _run(1.3, None, cap=15, sd=0.2)  # +-20% noise: never 4 points wide by 15 rounds
    assert len(rs) == 15


def test_meets_target_error_at_the_target_stays_below_alpha():
    """True median ratio = target (lognormal, skewed noise); looked at after every round up to 40:
    the share of runs that end 'meets' stays <= 1 - level, the sequence's guarantee."""
    rng = np.random.default_rng(7)
    rule, target, sims = Stopping(40), 1.05, 1000
    meets = 0
    for _ in range(sims):
        rs = []
        while not rule.done(rs, target):
            rs.append(target * float(np.exp(rng.normal(0, 0.05))))
        meets += rule.side(rs, target) == "meets"
    assert meets / sims <= 1 - rule.level


def test_paired_times_drop_decided_variants_from_the_rotation():
    log = []
    now = [0.0]

    def step(lab):
        log.append(lab)
        now[0] += {"none": 1.0, "a": 2.0, "b": 3.0}[lab]

    # a stops after 2 rounds, b goes to the cap of 4
    _, _, ratios = paired_times(step, ["none", "a", "b"], "none", 4, lambda: now[0],
                                done=lambda lab, rs: lab == "a" and len(rs) >= 2)
    assert ratios["a"] == [2.0, 2.0] and ratios["b"] == [3.0] * 4 and ratios["none"] == [1.0] * 4
    assert log == ["none", "a", "none", "b", "none", "none", "b", "none", "a", "none",
                   "none", "b", "none", "none", "b", "none"]


def test_ratio_target():
    assert ratio_target(None) is None and ratio_target(5.0) == pytest.approx(1.05)


def test_routing_gflops_columns_by_hand():
    """full at 3 layers, R = 8 KV heads of 32 dims: layer l's R routed heads each mix the (l + 1) R heads
    of the layers so far, R * (l + 1) R * Hd MACs per token for K and as many for V, for l = 1, 2."""
    from orchestrator.bench.step import bench_cfg
    from orchestrator.bench.suite import _row, _Setup

    sh = Shape("L3-MHA", 3, 8, 1)
    cfg = bench_cfg(sh, "full", torch.device("cpu"), 16)
    R, Hd = cfg.kv_heads, cfg.head_dim
    assert (R, Hd) == (8, 32)
    macs = sum(2 * R * (l + 1) * R * Hd for l in (1, 2))  # K and V
    fwd_flops = 2 * macs
    s = _Setup(torch.device("cpu"), 1, False, True, 2, 16, bw=10.0, gemm=50.0)
    timed = {"none": {"step_ms": 100.0, "ratio": 1.0}, "full": {"step_ms": 110.0, "ratio": 1.1}}
    tokens = 2 * 16
    row = _row(s, sh, "full", cfg, timed, alone_s=0.001)
    train = 3 * fwd_flops * tokens
    assert row["routing_gflops"] == pytest.approx(train / 0.001 / 1e9)
    assert row["gemm_pct"] == pytest.approx(100 * train / 0.001 / 1e9 / 50.0)
    assert row["step_gflops"] == pytest.approx(train / (0.100 * 0.1) / 1e9)  # none's step x (ratio - 1)
    assert row["roofline_gflops"] <= 50.0
    none_row = _row(s, sh, "none", bench_cfg(sh, "none", torch.device("cpu"), 16), timed, alone_s=0.0)
    assert none_row["routing_gflops"] is None and none_row["step_gflops"] is None


def test_depth_mix_rows_come_from_the_registry(monkeypatch):
    assert bench_depth_mixes() == tuple(d for d in lime_arch.depth_mix_specs() if d != "none")
    assert {"denseformer", "hyper-connections", "mhc", "attn-res", "attn-res-block", "mudd",
            "gated-residual"} <= set(bench_depth_mixes())
    monkeypatch.setattr(registry_mod, "DEPTH_MIXES", DEPTH_MIXES.copy())
    register_depth_mix("scaled-residual")(type("ScaledResidual", (DepthMix,), {}))
    assert bench_depth_mixes()[-1] == "scaled-residual"
    assert depth_mix_labels(bench_depth_mixes())[-1] == "none+scaled-residual"


def test_headline_options():
    from orchestrator.cli import build_parser
    from orchestrator.cli.bench import options

    def kw(*argv):
        return options(build_parser().parse_args(["bench", *argv]))

    h = kw("--headline", "--compile", "default")
    assert [sh.name for sh in h["shapes"]] == ["L16-MHA", "L16-GQA", "L64-MHA"]
    assert h["caps"] == HEADLINE_CAPS and h["depth_mix_shapes"] == ("L16-MHA", "L16-GQA")
    assert h["memory_compiled"] is False and h["compile_shapes"] == ("L16-MHA", "L16-GQA")
    assert h["compile_depth_mixes"] is False
    assert kw("--max-rounds", "9", "--shapes", "L64-MHA")["caps"] == {"L64-MHA": 9}
    assert kw("--fixed-rounds")["fixed_rounds"] is True and "caps" not in kw()
    for bad, field in ((("--headline", "--shapes", "L16-MHA"), "bench.headline"),
                       (("--max-rounds", "0"), "bench.max_rounds")):
        with pytest.raises(ConfigError, match=field):
            kw(*bad)


def test_a_small_adaptive_run_reports_its_rounds_sides_and_gemm_rate(tmp_path):
    """Not quick (so the stopping rule runs), but two layers, three variants, no memory or decode:
    seconds. The cap is the rule's 7: every variant runs 7 rounds; depth mixes only at other shapes."""
    from orchestrator.bench.suite import run_bench

    torch.set_default_dtype(torch.float32)
    sh = Shape("L2-MHA", 2, 8, 3)
    out = run_bench(tmp_path, shapes=(sh,), routers=("full",), depth_mixes=("denseformer",), memory=False,
                    decode=False, caps={"L2-MHA": 2}, depth_mix_shapes=())
    rows = {r["label"]: r for r in out["rows"]}
    assert set(rows) == {"none", "full", "full/concat"}  # no depth-mix rows at this shape
    assert rows["full"]["reps"] == rows["full/concat"]["reps"] == 7  # a cap below 7 is raised to 7
    f, t = rows["full"], 1 + rows["full"]["target_pct"] / 100  # real timings: any side, but the right one
    want = "meets" if f["ratio_hi"] <= t else "misses" if f["ratio_lo"] > t else "undecided"
    assert f["decided"] == want and rows["full/concat"]["decided"] == "-"
    lo, hi = Stopping(7).interval([1.0] * 7)
    assert rows["full"]["ratio_lo"] <= rows["full"]["ratio"] <= rows["full"]["ratio_hi"] and lo == hi == 1.0
    assert out["machine"]["gemm_gflops"] > 0 and out["machine"]["rounds"] == "L2-MHA <= 7"
    md = (tmp_path / "bench.md").read_text()
    assert "large GEMM (512^3" in md and "% GEMM" in md
