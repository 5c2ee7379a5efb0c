"""``lime report --throughput``'s measurement (``orchestrator.bench.throughput``): a step with the trials'
gradient accumulation, the paired rounds of tiny models, and the settings one process cannot measure."""
from __future__ import annotations

import pytest
import torch

from lime_arch.config import preset
from lime_arch.errors import ConfigError
from lime_arch.model import build_model
from orchestrator.bench.step import make_step, train_step
from orchestrator.bench.throughput import device_for, measure


def tiny(router: str) -> dict:
    model = preset("tiny", router=router, n_layers=2, d_model=32, n_heads=2, ffn_dim=64).to_dict()
    return {"model": {k: v for k, v in model.items() if k not in ("init_std", "router_init")}, "batch_size": 2,
            "seq_len": 16, "grad_accum": 1, "device": "cpu", "compile": False, "threads": 1}


class Counting(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def test_accumulation_runs_each_micro_batch_and_one_optimizer_step():
    # the same tokens in each of 3 micro-batches, each loss / 3: the gradient is one micro-batch's
    torch.manual_seed(0)
    cfg = preset("tiny", n_layers=2, d_model=32, n_heads=2, ffn_dim=64)
    idx = torch.randint(0, cfg.vocab_size, (2, 17))
    grads = {}
    for accum in (1, 3):
        torch.manual_seed(0)
        model = Counting(build_model(cfg))
        steps = []
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        opt.step = lambda steps=steps: steps.append(1)  # count; keep the gradient to compare
        train_step(model, opt, idx, torch.device("cpu"), False, accum)
        grads[accum] = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert (model.calls, len(steps)) == (accum, 1)
    torch.testing.assert_close(grads[3], grads[1], rtol=1e-5, atol=1e-7)
    make_step(cfg, 2, 16, torch.device("cpu"), False, accum=2)()  # the standalone step takes it too


def test_paired_rounds_of_two_tiny_models():
    torch.set_num_threads(1)  # conftest puts it back
    shapes = {"b": tiny("none"), "v": tiny("full")}
    got = measure(shapes, [("b", "v")], rounds=3)
    (pair,) = got["pairs"]
    assert (pair["baseline"], pair["variant"]) == ("b", "v") and len(pair["ratios"]) == 3
    assert all(r > 0 for r in pair["ratios"]) and pair["step_ms"]["baseline"] > 0
    assert (got["threads"], got["clock"], got["rounds"], got["warmup"]) == (1, "thread CPU time", 3, 2)
    assert got["machine"]["device"] == "cpu" and got["machine"]["dtype"] == "fp32" and len(got["load_before"]) == 3


def test_what_one_process_cannot_measure_is_one_line():
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^report.throughput: the trials ran on cuda .train.device. and torch "
                                              "sees no CUDA device here; measure on a machine like theirs$"):
            device_for("cuda")
    assert device_for("cpu").type == "cpu"
    with pytest.raises(ConfigError, match="the compared trials differ in train.device"):
        measure({"b": tiny("none"), "v": {**tiny("full"), "device": "auto"}}, [("b", "v")], rounds=1)
    bad = {**tiny("full"), "model": {**tiny("full")["model"], "no_such_field": 1}}
    with pytest.raises(ConfigError, match="^report.throughput: the trials' resolved model does not build with this "
                                          "code .model.no_such_field: unknown key"):
        measure({"b": tiny("none"), "v": bad}, [("b", "v")], rounds=1)
