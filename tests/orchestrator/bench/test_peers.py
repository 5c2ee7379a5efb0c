"""``lime bench --peers`` (``orchestrator.bench.peers``, ``peer_models``, ``peer_table``): the pairing, the
line when the extra is missing, the table on a tiny shape, and that each peer variant is what it says."""
import sys

import pytest
import torch

from lime_arch.accounting import flop_overhead
from lime_arch.errors import ConfigError
from lime_arch.model import build_model
from orchestrator.bench import peer_models as pm
from orchestrator.bench.peer_table import peers_markdown
from orchestrator.bench.peers import OURS, interleaved, run_peers
from orchestrator.bench.shapes import VOCAB, Shape
from orchestrator.bench.step import bench_cfg
from orchestrator.cli import bench as cli

CPU = torch.device("cpu")
TINY = Shape("L2-GQA", 2, 2, 1)
TINY_MHA = Shape("L2-MHA", 2, 8, 1)  # x-transformers 2.31.10's value residual cannot run with GQA
SEQ = 8


def test_interleaved_pairs_each_variant_with_its_own_groups_baseline():
    """Steps of known durations on a fake clock: every ratio is the variant's duration over its own
    group's baseline's, and each group's variants rotate round by round."""
    dur = {"a": 2.0, "a1": 3.0, "a2": 5.0, "b": 4.0, "b1": 6.0}
    now, order = [0.0], []

    def step(lab):
        order.append(lab)
        now[0] += dur[lab]

    times, ratios = interleaved(step, [("a", ["a1", "a2", "b"]), ("b", ["b1"])], 3, lambda: now[0])
    assert ratios == {"a1": [1.5] * 3, "a2": [2.5] * 3, "b": [2.0] * 3, "b1": [1.5] * 3}
    # round 0: a a1 a a2 a b a | b b1 b; round 1 starts group a with a2
    assert order[:10] == ["a", "a1", "a", "a2", "a", "b", "a", "b", "b1", "b"]
    assert order[10:16] == ["a", "a2", "a", "b", "a", "a1"]
    assert times["a"] == [2.0] * 12 and len(times["b"]) == 3 + 6  # b: a variant of a, and b1's baseline


def test_a_missing_extra_is_one_line_and_a_skip(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "x_transformers", None)  # `import x_transformers` raises ImportError
    monkeypatch.setitem(sys.modules, "hyper_connections", None)
    assert pm.missing() == ["x-transformers", "hyper-connections"]
    out = run_peers([TINY], CPU, 1, 1, SEQ, {TINY.name: 1})
    assert out["rows"] == []
    assert out["skipped"] == ("peers: x-transformers and hyper-connections not installed (pip install '.[peers]'): "
                              "no peers table")
    cli.print_summary({"paths": [], "checks": [], "machine": {"seconds": 0.0}, "peers": out})
    assert capsys.readouterr().out.splitlines()[-1] == out["skipped"]
    assert peers_markdown(out)[2] == out["skipped"]


def test_one_missing_library_skips_its_rows_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "hyper_connections", None)
    assert pm.missing() == ["hyper-connections"] or pm.missing() == ["x-transformers", "hyper-connections"]
    if "x-transformers" not in pm.missing():
        monkeypatch.setattr(pm, "VARIANTS", (pm.XT_BASE,))  # one build is enough here
        out = run_peers([TINY], CPU, 1, 1, SEQ, {TINY.name: 1}, warmup=0)
        assert out["skipped"].endswith("hyper-connections not installed (pip install '.[peers]'): its rows skipped")
        assert {r["library"] for r in out["rows"]} == {OURS, pm.XT}


def test_peers_option_checks():
    ap = cli.argparse.ArgumentParser()
    cli.add_arguments(ap)
    with pytest.raises(ConfigError, match=r"^bench\.peers: runs at shapes of at most 16 layers"):
        cli.options(ap.parse_args(["--peers", "--shapes", "L64-MHA"]))
    with pytest.raises(ConfigError, match=r"^bench\.peers: .*not with --profile"):
        cli.options(ap.parse_args(["--peers", "--profile"]))
    assert cli.options(ap.parse_args(["--peers", "--shapes", "L16-GQA,L64-MHA"]))["peers"] is True
    assert "peers" not in cli.options(ap.parse_args([]))  # the default bench never asks for the extra


needs_extra = pytest.mark.skipif(bool(pm.missing()), reason="the peers extra is not installed (pip install '.[peers]')")


def _variant(name: str) -> pm.Variant:
    return next(v for v in pm.VARIANTS if v.name == name)


@needs_extra
def test_peers_table_on_a_tiny_shape():
    torch.manual_seed(0)
    out = run_peers([TINY], CPU, 1, 1, SEQ, {TINY.name: 2}, warmup=0)
    assert out["skipped"] is None and set(out["versions"]) == {"x-transformers", "hyper-connections"}
    rows = {(r["library"], r["variant"]): r for r in out["rows"]}
    expected = {(OURS, "none")} | {(OURS, v.counterpart) for v in pm.VARIANTS} | \
        {(v.library, v.name) for v in pm.VARIANTS}
    assert set(rows) == expected
    timed = [r for r in rows.values() if r.get("ratio") is not None]
    assert all(r["reps"] == 2 and r["ratio_lo"] <= r["ratio"] <= r["ratio_hi"] for r in timed if r["baseline"] != "-")
    for r in timed:
        assert r["overhead_pct"] == pytest.approx(100 * (r["ratio"] - 1))
    # each library's baseline is timed against this project's none: its ratio is the ratio of baselines
    for base in (pm.XT_BASE, pm.HC_BASE):
        b = rows[(base.library, base.name)]
        assert b["baseline"] == f"{OURS}: none" and b["vs_ours"] == b["ratio"]
        for r in timed:
            if r["library"] == base.library and r is not b:
                assert r["baseline"] == f"{base.library}: {base.name}" and r["vs_ours"] == b["ratio"]
                assert r["saved_vs_ours"] == b["saved_vs_ours"]
                assert r["saved_ratio"] == pytest.approx(r["saved_mb"] / b["saved_mb"])
    # the package's plain Residual on this project's body is the none model: same saved bytes, same FLOPs
    hc_base = rows[(pm.HC, pm.HC_BASE.name)]
    assert hc_base["saved_vs_ours"] == 1.0 and hc_base["flop_overhead_pct"] == 0.0
    assert hc_base["params"] == rows[(OURS, "none")]["params"]
    # FLOPs counted alike for every implementation: the counter finds the dynamic router's products, as many
    # as lime_arch.accounting's formula says; the learned value mix is elementwise, invisible to it: the formula
    assert rows[(OURS, "none")]["flop_overhead_pct"] == 0.0 and rows[(OURS, "dynamic")]["flops"] == "counted"
    cfg = bench_cfg(TINY, "dynamic", CPU, SEQ)
    assert rows[(OURS, "dynamic")]["flop_overhead_pct"] == pytest.approx(100 * flop_overhead(cfg, SEQ), rel=1e-9)
    vr = rows[(OURS, "none+value-residual-learned")]
    assert vr["flops"] == "analytic" and vr["flop_overhead_pct"] > 0
    assert rows[(pm.XT, "integrate_layers")]["flops"] == "counted"
    assert rows[(pm.XT, "integrate_layers")]["flop_overhead_pct"] > 0
    # x-transformers 2.31.10 mixes the first layer's values into a layer's without matching KV heads to heads
    assert rows[(pm.XT, "add_value_residual")]["note"].startswith("not comparable: RuntimeError: The size of tensor")
    md = "\n".join(peers_markdown(out))
    assert md.count(f"| {TINY.name} |") == len(rows)


@needs_extra
def test_the_package_baseline_is_the_none_model_exactly():
    """x + f(x) and the package's f(x) + x are the same float sums: the same logits bit for bit."""
    idx = torch.randint(0, VOCAB, (1, SEQ))
    torch.manual_seed(0)
    ours = build_model(bench_cfg(TINY, "none", CPU, SEQ))
    theirs = pm.build(TINY, pm.HC_BASE, VOCAB, SEQ, CPU)
    assert torch.equal(ours(idx), theirs(idx))


def _logits_differ(model, base, idx) -> bool:
    with torch.no_grad():
        return not torch.allclose(model(idx), base(idx))


@needs_extra
def test_each_peer_variant_is_what_it_says():
    idx = torch.randint(0, VOCAB, (1, SEQ))
    kinds = lambda m: {type(x).__name__ for x in m.modules()}  # noqa: E731
    xt_base = pm.build(TINY_MHA, pm.XT_BASE, VOCAB, SEQ, CPU)
    L, C, F = TINY_MHA.n_layers, 256, 1024
    ours_none = build_model(bench_cfg(TINY_MHA, "none", CPU, SEQ))
    # the same shape as the none model: only the GLU input projection's bias (2F per layer) is extra
    n_xt, n_ours = (sum(p.numel() for p in m.parameters()) for m in (xt_base, ours_none))
    assert n_xt - n_ours == L * 2 * F
    for name, cls in [("integrate_layers", "DynamicLIMe"), (f"num_residual_streams={pm.STREAMS}", "HyperConnection"),
                      (f"gated_multi_residual x{pm.STREAMS}", "GatedMultiResidual")]:
        v = _variant(name)
        if pm.unsupported(v):
            continue
        m = pm.build(TINY_MHA, v, VOCAB, SEQ, CPU)
        assert cls in kinds(m) and cls not in kinds(xt_base), name
    vr = pm.build(TINY_MHA, _variant("add_value_residual"), VOCAB, SEQ, CPU)
    assert any("value_residual" in n for n, _ in vr.named_parameters())
    assert not any("value_residual" in n for n, _ in xt_base.named_parameters())
    assert vr.attn_layers.add_value_residual and not xt_base.attn_layers.add_value_residual
    assert _logits_differ(vr, xt_base, idx)
    # the package: HC and mHC per sublayer, the plain Residual in the baseline
    hc_base = pm.build(TINY_MHA, pm.HC_BASE, VOCAB, SEQ, CPU)
    hc = pm.build(TINY_MHA, _variant(f"HyperConnections x{pm.STREAMS}"), VOCAB, SEQ, CPU)
    mhc = pm.build(TINY_MHA, _variant(f"mHC x{pm.STREAMS}"), VOCAB, SEQ, CPU)
    assert [type(c).__name__ for c in hc_base.depth_mix.conns] == ["Residual"] * 2 * L
    assert [type(c).__name__ for c in hc.depth_mix.conns] == ["HyperConnections"] * 2 * L
    assert [type(c).__name__ for c in mhc.depth_mix.conns] == ["ManifoldConstrainedHyperConnections"] * 2 * L
    # HC (arXiv 2409.19606, Algorithm 2) per sublayer with n streams: the norm's gain C, static alpha
    # n x (n + 1), dynamic alpha C x (n + 1) and its scale, static beta n, dynamic beta C and its scale
    n = pm.STREAMS
    per = C + n * (n + 1) + C * (n + 1) + 1 + n + C + 1
    assert sum(p.numel() for p in hc.parameters()) - sum(p.numel() for p in hc_base.parameters()) == 2 * L * per
    assert _logits_differ(hc, hc_base, idx)
