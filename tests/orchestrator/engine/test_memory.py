"""The memory metrics (``orchestrator.engine.memory``) against byte counts worked out by hand."""
import pytest
import torch
from torch import nn

from lime_arch import param_counts
from lime_arch.routers import build_router
from lime_arch.routing.mixers import make_mixer
from lime_arch.routing.state import held_bytes
from orchestrator.engine.memory import MB, SavedBytes, model_state_bytes, saved_activation_bytes
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig


@pytest.mark.parametrize("dtype, size", [(torch.float32, 4), (torch.float64, 8)])
def test_saved_bytes_of_a_known_graph(dtype, size):
    """h = x @ W saves x and W; relu saves its output r; x.t() @ r saves a view of x and r;
    r * r saves r twice. Unique storages, the parameter W left out: x (4x5) and r (4x3)."""
    x = torch.randn(4, 5, dtype=dtype, requires_grad=True)
    w = nn.Parameter(torch.randn(5, 3, dtype=dtype))
    counter = SavedBytes(exclude=[w])
    with counter.track():
        r = (x @ w).relu()
        loss = (x.t() @ r).sum() + (r * r).sum()
    assert counter.nbytes == (4 * 5 + 4 * 3) * size
    loss.backward()  # the hooks hand the tensors back unchanged
    assert w.grad is not None and x.grad.shape == (4, 5)
    with torch.no_grad(), counter.track():
        (x @ w).relu()
    assert counter.nbytes == 0  # nothing is saved without autograd


def test_model_state_of_a_tiny_model_with_adamw():
    """Linear(3, 4) with bias (16 parameters) and Linear(4, 2) without (8), the second's weight
    tied to a third module (counted once), one frozen Linear(2, 2) (4 parameters, no gradient,
    not in the optimizer). After one AdamW step: parameters 28 x 4 bytes, gradients 24 x 4,
    optimizer 2 x 24 x 4 (two moments) + 3 x 4 (a float32 step counter per tensor)."""
    torch.manual_seed(0)
    a, b, frozen = nn.Linear(3, 4), nn.Linear(4, 2, bias=False), nn.Linear(2, 2, bias=False)
    frozen.weight.requires_grad_(False)
    tied = nn.Linear(4, 2, bias=False)
    tied.weight = b.weight
    model = nn.ModuleList([a, b, frozen, tied])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    assert model_state_bytes(model, opt) == {"params": 28 * 4, "grads": 24 * 4, "optimizer": 0}
    frozen(b(a(torch.randn(5, 3)))).sum().backward()
    opt.step()
    assert model_state_bytes(model, opt) == {"params": 28 * 4, "grads": 24 * 4, "optimizer": 2 * 24 * 4 + 3 * 4}


def test_routing_buffer_counts_until_backward():
    """The buffer mixer's K/V buffer is held for backward outside autograd's saved tensors: full
    routing over L=5 layers, R=2 KV heads, B=2, T=3, Hd=4 in float64 holds one copy of every
    layer's K and V, 5 x 2 x (2 x 2 x 3 x 4) x 8 bytes, until its backward ran."""
    L, R, B, T, HD = 5, 2, 2, 3, 4
    router = build_router("full", n_layers=L, n_kv_heads=R, head_dim=HD, init="paper").double()
    kv = [torch.randn(B, T, R, HD, dtype=torch.float64, requires_grad=True) for _ in range(2 * L)]
    base = held_bytes()

    def route():
        mixer = make_mixer(router, "buffer")
        return [o for l in range(L) for o in mixer.route(l, kv[2 * l], kv[2 * l + 1])]

    outs, nbytes = saved_activation_bytes(route, exclude=router.parameters())
    buffer = L * R * (2 * B * T * HD) * 8
    assert held_bytes() - base == buffer
    assert nbytes >= buffer
    sum(o.sum() for o in outs).backward()
    assert held_bytes() == base


def _trial(router: str, **train) -> TrialConfig:
    return TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": router, "n_layers": 3, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "log_interval": 2, "eval_interval": 4,
                  "eval_batches": 1, **train}})


def test_a_trial_logs_the_memory_metrics():
    """Every log point carries the metrics; the model state is 4 floats per parameter (itself, its
    gradient, AdamW's two moments) plus a 4-byte step counter per parameter tensor; the routed
    model keeps at least its K/V buffer more than ``none`` for backward."""
    res = {r: run_trial(_trial(r), tracking=Tracking(enabled=False)) for r in ("none", "full")}
    for router, out in res.items():
        logs = [h for h in out.history if "train/loss" in h]
        assert len(logs) == 2
        model = TrialConfig.from_dict(_trial(router).to_dict()).model_config(vocab_size=257)
        n_params = param_counts(model)["total"]
        n_tensors = 3 * 9 + 2 + (2 if router == "full" else 0)  # per layer 9; embed (tied head), norm; router 2
        for h in logs:
            assert h["perf/model_state_mb"] * MB == 4 * 4 * n_params + 4 * n_tensors
            assert h["perf/train_mem_mb"] == pytest.approx(h["perf/model_state_mb"] + h["perf/saved_activations_mb"])
            assert h["perf/rss_peak_mb"] > 0 and "perf/cuda_peak_mb" not in h
    saved = {r: out.history[-2]["perf/saved_activations_mb"] * MB for r, out in res.items()}
    buffer = 3 * 2 * (2 * 2 * 16 * 16) * 4  # L x R x (2 B T Hd) x fp32
    assert saved["full"] >= saved["none"] + buffer
