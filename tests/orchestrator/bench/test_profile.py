"""``lime bench --profile``: the products it finds are the routing's, counted right. No test asserts a speed."""
import pytest
import torch

from lime_arch.accounting import flops_per_token
from orchestrator.bench.profile import run_profile
from orchestrator.bench.shapes import QUICK_SHAPES
from orchestrator.bench.step import bench_cfg
from orchestrator.cli import main


def test_profile_counts_every_routing_flop(tmp_path):
    """Full routing over 3 layers runs in one block (layers 1 and 2; layer 0 has no weight). In
    units of one slot's product (R x R rows by the slot's columns) layer l reads l+1 slots:
    forward W_l @ buf[0..l] is 2 + 3 = 5 units, the slot gradients W^T @ grad_out 5 more, and dW
    is the block leader's one product of both layers' grad_out rows with slots 0..2, 2 x 3 = 6
    units (one of them, layer 1's dW on slot 2, is computed and not wanted: one product beats two
    where at least half of it is wanted). So the products found add up to 16/5 x the analytic
    forward routing FLOPs (lime_arch.accounting)."""
    sh = QUICK_SHAPES[0]
    assert sh.n_layers == 3
    out = run_profile(tmp_path, ["full", "average"], [sh], runs=2, ref_reps=3, batch=2, seq=16)
    full, average = out["results"]
    flops = sum(2 * r["batch"] * r["M"] * r["K"] * r["N"] * r["calls"] for r in full["rows"])
    analytic = flops_per_token(bench_cfg(sh, "full", torch.device("cpu"), 16), 16)["routing"] * 2 * 16
    assert flops == pytest.approx((5 + 5 + 6) / 5 * analytic, rel=1e-12)
    assert all(r["ref_gflops"] > 0 and r["gflops"] > 0 for r in full["rows"])
    assert average["rows"] == []  # the running mean multiplies nothing
    assert set(full["split"]) == {"products", "copies", "other ops", "python, autograd (the rest)"}
    md = (tmp_path / "profile.md").read_text()
    assert "## full @ L3-MHA" in md and "(no products)" in md and "ref GFLOP/s" in md


def test_cli_profile_writes_its_file(tmp_path, capsys):
    assert main(["bench", "--profile", "--shapes", "L3-GQA", "--routers", "first-4", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "profile.md").exists() and "large GEMM" in capsys.readouterr().out
