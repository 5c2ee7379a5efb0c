"""mHC against the paper's equations where a port can silently differ (issue 36): the Sinkhorn-Knopp
order of Eq. 9 (each round normalises the columns, then the rows, so the returned H_res has exact
row sums), checked against a float64 loop written from the equation at few rounds, where the order
matters most; and DeepSeek-V4's learned readout (``mhc-readout``): its init by hand, the baseline
at step 0, and its weights in the optimizer. The whole model against a float64 reference, readout
included, is in test_peer_reference.py."""
import numpy as np
import pytest
import torch

import lime_arch.depth_mix.mhc as mhc_mod
from lime_arch import build_model, param_groups, preset
from lime_arch.depth_mix.mhc import sinkhorn_knopp


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def paper_sinkhorn(M: np.ndarray, iters: int) -> np.ndarray:
    """Eq. 9 of arXiv 2512.24880, M(t) = T_r(T_c(M(t-1))), entry by entry in float64: T_c divides
    every entry by its column's sum, T_r by its row's sum."""
    M = np.array(M, dtype=np.float64)
    n = M.shape[0]
    for _ in range(iters):
        col = [sum(M[i, j] for i in range(n)) for j in range(n)]
        M = np.array([[M[i, j] / col[j] for j in range(n)] for i in range(n)])
        row = [sum(M[i, j] for j in range(n)) for i in range(n)]
        M = np.array([[M[i, j] / row[i] for j in range(n)] for i in range(n)])
    return M


def _row_first(M, iters):
    """The order this project used before issue 36 (rows, then columns)."""
    for _ in range(iters):
        M = M / M.sum(-1, keepdim=True)
        M = M / M.sum(-2, keepdim=True)
    return M


@pytest.mark.parametrize("iters", [1, 2, 3, 20])
@pytest.mark.parametrize("n", [2, 4])
def test_sinkhorn_is_the_papers_eq_9(iters, n):
    rng = np.random.default_rng(iters * 10 + n)
    logits = rng.normal(0.0, 1.5, size=(30, n, n))
    got = sinkhorn_knopp(torch.tensor(np.exp(logits)), iters).numpy()
    for g, z in zip(got, logits):
        np.testing.assert_allclose(g, paper_sinkhorn(np.exp(z), iters), rtol=1e-13, atol=0)
        np.testing.assert_allclose(g.sum(1), np.ones(n), rtol=0, atol=1e-15)  # rows last: exact


@pytest.mark.parametrize("spec", ["mhc-4-1", "mhc-4-3", "mhc", "mhc-sigmoid-3-2", "mhc-readout-4-2"])
def test_every_new_stream_is_an_exact_convex_combination(spec, f64):
    model = build_model(preset("tiny", depth_mix=spec))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.depth_mix.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    H = torch.randn(2, 5, model.depth_mix.rate, 64, generator=g)
    for k in (0, 3, 6):
        res = model.depth_mix.coefficients(k, H)[2]
        torch.testing.assert_close(res.sum(-1), torch.ones(res.shape[:-1]), rtol=0, atol=1e-15)
        assert (res > 0).all()


def test_the_order_matters_at_few_rounds(f64, monkeypatch):
    """The reference comparison (test_peer_reference.py, mhc-4-1 and mhc-3-2) can tell the orders apart:
    at one round the logits of the two orders differ far above its 1e-9 tolerance."""
    torch.manual_seed(4)
    model = build_model(preset("tiny", depth_mix="mhc-4-1", n_layers=5))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.depth_mix.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    idx = torch.randint(0, 256, (2, 9), generator=g)
    with torch.no_grad():
        paper = model(idx)
        monkeypatch.setattr(mhc_mod, "sinkhorn_knopp", _row_first)
        old = model(idx)
    assert (paper - old).abs().max().item() > 1e-3


def test_readout_init_by_hand(f64):
    """phi_out = 0, a_out = 0.01, b_out = 0: w = sigmoid(0) = 1/2 for every stream and token."""
    mix = build_model(preset("tiny", depth_mix="mhc-readout")).depth_mix
    assert mix.readout_proj.shape == (4 * 64, 4) and not mix.readout_proj.any()
    assert mix.readout_gate.tolist() == [0.01] and mix.readout_bias.tolist() == [0.0] * 4
    H = torch.randn(2, 3, 4, 64)
    torch.testing.assert_close(mix.hidden(H), 0.5 * H.sum(-2), rtol=1e-15, atol=1e-14)
    with torch.no_grad():
        mix.readout_bias.copy_(torch.tensor([0.0, 1.0, -2.0, 3.0]))
    w = 1 / (1 + np.exp(-np.array([0.0, 1.0, -2.0, 3.0])))
    torch.testing.assert_close(mix.hidden(H), sum(float(w[i]) * H[..., i, :] for i in range(4)), rtol=1e-14,
                               atol=1e-14)


def test_readout_is_the_baseline_at_init(f64):
    """With the norm eps out of the way (1e-30), step 0 computes the ``none`` model's logits; the readout
    is a sum, not the streams' sum (w = 1/2), and the final norm undoes the scale."""
    idx = torch.randint(0, 256, (2, 9))
    out = {}
    for spec in ("none", "mhc-readout"):
        torch.manual_seed(3)
        out[spec] = build_model(preset("tiny", depth_mix=spec, norm_eps=1e-30))(idx)
    torch.testing.assert_close(out["mhc-readout"], out["none"], rtol=1e-12, atol=1e-12)


def test_readout_weights_train_and_phi_out_decays():
    model = build_model(preset("tiny", depth_mix="mhc-readout"))
    groups = {g["name"]: {id(p) for p in g["params"]} for g in param_groups(model, lr=1e-3, weight_decay=0.1)}
    mix = model.depth_mix
    assert id(mix.readout_proj) in groups["decay"]
    assert {id(mix.readout_gate), id(mix.readout_bias)} <= groups["depth_mix"]
    model(torch.randint(0, 256, (2, 8))).sum().backward()
    assert mix.readout_bias.grad.abs().sum() > 0 and mix.readout_gate.grad is not None
