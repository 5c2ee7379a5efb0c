"""The 2026 field's depth mixes beyond their float64 references (test_peer_reference.py): the
statements their docstrings make, checked against hand-computed values. mHC: H_res is doubly
stochastic, its init values, the named port choices (post gain, positive map), fp32 coefficients
under bf16 autocast. AttnRes: what a sublayer reads at step 0, the block partition. MUDDFormer:
the baseline bit for bit at step 0, the authors' hidden widths. The LIMe authors' HC: its init."""
import math
import re

import pytest
import torch

from lime_arch import ConfigError, build_model, preset
from lime_arch.depth_mix.mhc import sinkhorn_knopp
from lime_arch.depth_mix.mudd import hidden_width


def tiny(depth_mix, router="none", **kw):
    return preset("tiny", depth_mix=depth_mix, router=router, n_kv_heads=2, **kw)


def _randomise(mix, scale=0.3, seed=2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mix.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


# -- mHC --------------------------------------------------------------------------------------
def test_sinkhorn_knopp_makes_positive_matrices_doubly_stochastic(f64):
    M = torch.rand(50, 4, 4) * 5 + 0.01
    one = sinkhorn_knopp(M, 1)
    torch.testing.assert_close(one.sum(-1), torch.ones(50, 4), rtol=0, atol=1e-15)  # rows last (Eq. 9): exact
    assert (one.sum(-2) - 1).abs().max() > 1e-3  # columns not yet
    errs = [(sinkhorn_knopp(M, t).sum(-2) - 1).abs().max().item() for t in (1, 5, 20, 100)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-12
    # a matrix with constant row sums (symmetric, constant diagonal) is fixed after one round
    S = torch.full((4, 4), 1.0) + (math.e - 1) * torch.eye(4)  # exp(I)
    torch.testing.assert_close(sinkhorn_knopp(S, 20), S / (math.e + 3), rtol=0, atol=1e-15)


@pytest.mark.parametrize("spec,iters", [("mhc", 20), ("mhc-4-5", 5), ("mhc-sigmoid-2-20-1", 20)])
def test_mhc_res_is_doubly_stochastic_per_token(spec, iters, f64):
    model = build_model(tiny(spec))
    _randomise(model.depth_mix, 0.1)  # larger logits give near-degenerate matrices, where Sinkhorn is slow
    mix, n = model.depth_mix, model.depth_mix.rate
    assert mix.iters == iters
    H = torch.randn(2, 7, n, 64)
    for k in (0, 3, 7):
        pre, post, res = mix.coefficients(k, H)
        assert pre.shape == post.shape == (2, 7, n) and res.shape == (2, 7, n, n)
        assert (res > 0).all() and (pre > 0).all() and (pre < 1).all()
        assert (post > 0).all() and (post < mix.post_gain).all()
        torch.testing.assert_close(res.sum(-1), torch.ones(2, 7, n), rtol=0, atol=1e-12)  # rows last: exact
        # columns are not exact: measured (seed 0) 2e-4 off at 5 rounds, 2e-14 at 20
        assert (res.sum(-2) - 1).abs().max() < (1e-3 if iters == 5 else 1e-10)


def test_mhc_init_values_by_hand():
    """phi = 0: H_pre = sigmoid(e_{k mod n}), H_post = g sigmoid(0), H_res = Sinkhorn(exp(I)) = exp(I) / (e + n - 1)
    (constant row sums); the sigmoid map: sigmoid(I) / (sigmoid(1) + (n - 1) / 2)."""
    H = torch.randn(1, 3, 4, 64)
    s1 = 1 / (1 + math.exp(-1))
    for spec, gain, diag, off in (("mhc", 2.0, math.e / (math.e + 3), 1 / (math.e + 3)),
                                  ("mhc-4-20-1", 1.0, math.e / (math.e + 3), 1 / (math.e + 3)),
                                  ("mhc-sigmoid", 2.0, s1 / (s1 + 1.5), 0.5 / (s1 + 1.5))):
        mix = build_model(tiny(spec)).depth_mix
        for k in (0, 5):
            pre, post, res = mix.coefficients(k, H)
            want_pre = torch.full((4,), 0.5)
            want_pre[k % 4] = s1
            torch.testing.assert_close(pre[0, 0], want_pre)
            torch.testing.assert_close(post[0, 0], torch.full((4,), gain / 2))
            torch.testing.assert_close(res[0, 0], off + (diag - off) * torch.eye(4))


def test_mhc_without_the_factor_2_is_not_the_baseline_at_init(f64):
    """H_post = g/2 at init: g = 2 (the paper) gives the baseline, g = 1 (the ports without the 2) halves every
    sublayer's contribution."""
    idx = torch.randint(0, 256, (2, 9))
    out = {}
    for spec in ("none", "mhc", "mhc-4-20-1"):
        torch.manual_seed(3)
        out[spec] = build_model(tiny(spec, norm_eps=1e-30))(idx)
    torch.testing.assert_close(out["mhc"], out["none"], rtol=1e-12, atol=1e-12)
    assert (out["mhc-4-20-1"] - out["none"]).abs().max() > 1e-2


def test_mhc_coefficients_are_fp32_under_bf16_autocast(monkeypatch):
    model = build_model(tiny("mhc", "full"))
    mix, seen = model.depth_mix, []
    original = type(mix).coefficients

    def spy(self, k, H):
        out = original(self, k, H)
        seen.append((H.dtype, *(c.dtype for c in out)))
        return out

    monkeypatch.setattr(type(mix), "coefficients", spy)
    streams = []
    model.blocks[1].register_forward_hook(lambda _m, _i, o: streams.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, 256, (2, 12)))
    assert logits.dtype == torch.bfloat16  # the LM head ran under autocast
    assert len(seen) == 8 and set(seen) == {(torch.float32,) * 4}
    assert streams == [torch.float32]  # the streams keep the residual stream's dtype
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in mix.parameters() if p.grad is not None)


def test_mhc_bad_arguments():
    for spec, msg in (("mhc-4-0", "needs a positive integer for iters, got 0"),
                      ("mhc-4-20-0", "needs a positive number for post_gain, got 0"),
                      ("mhc-4-20-2-1", "mhc takes at most 3 argument(s), mhc[-<rate>[-<iters>[-<post_gain>]]]")):
        with pytest.raises(ConfigError, match=re.escape(msg)):
            tiny(spec)


# -- Attention Residuals ----------------------------------------------------------------------
def _sublayer_inputs(model, idx):
    """What each sublayer's pre-norm reads: [(B, T, C)] * 2L, attention and MLP of each layer."""
    seen = []
    hooks = [norm.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach()))
             for b in model.blocks for norm in (b.attn_norm, b.mlp_norm)]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return seen


def test_attn_res_at_init_reads_the_baseline_stream_divided_by_the_count_of_sources(f64):
    """Zero pseudo-queries: sublayer k reads the uniform mean of the embedding and the k outputs before it,
    which is x_k / (k + 1), x_k the baseline's residual stream (float64, a negligible eps so the two models'
    sublayers compute the same outputs); the block variant divides by its number of sources instead."""
    idx = torch.randint(0, 256, (2, 9))
    torch.manual_seed(4)
    base = _sublayer_inputs(build_model(tiny("none", "full", norm_eps=1e-30)), idx)
    for spec, count in (("attn-res", [1, 2, 3, 4, 5, 6, 7, 8]),
                        ("attn-res-block-3", [1, 2, 2, 2, 3, 3, 3, 4])):  # blocks {0,1,2}, {3,4,5}, {6,7}
        torch.manual_seed(4)
        got = _sublayer_inputs(build_model(tiny(spec, "full", norm_eps=1e-30)), idx)
        assert len(got) == len(base) == 8
        for k, (x, h, c) in enumerate(zip(base, got, count)):
            torch.testing.assert_close(h, x / c, rtol=1e-12, atol=1e-14, msg=f"{spec} sublayer {k}")


def test_attn_res_block_with_one_block_per_sublayer_is_full_attn_res(f64):
    idx = torch.randint(0, 256, (2, 9))
    out = []
    for spec in ("attn-res", "attn-res-block-1"):
        torch.manual_seed(5)
        model = build_model(tiny(spec, "full"))
        _randomise(model.depth_mix)
        out.append(model(idx))
    torch.testing.assert_close(out[1], out[0], rtol=1e-13, atol=1e-13)


def test_attn_res_block_partition_by_hand():
    """Sources per reader (k = 8: the final norm): blocks of 3 sublayers at 4 layers are {0,1,2}, {3,4,5}, {6,7};
    the default, 4, is two layers per block (8 blocks at 16 layers, the paper's 1B depth); 8 or more is one block."""
    specs = ("attn-res-block-3", "attn-res-block", "attn-res-block-9")
    sources = {s: [build_model(tiny(s)).depth_mix.sources(k) for k in range(9)] for s in specs}
    assert sources == {"attn-res-block-3": [1, 2, 2, 2, 3, 3, 3, 4, 4], "attn-res-block": [1, 2, 2, 2, 2, 3, 3, 3, 3],
                       "attn-res-block-9": [1, 2, 2, 2, 2, 2, 2, 2, 2]}
    assert build_model(preset("tiny", n_layers=16, depth_mix="attn-res-block")).depth_mix.n_blocks == 8
    with pytest.raises(ConfigError, match="needs a positive integer for size, got 0"):
        tiny("attn-res-block-0")


# -- MUDDFormer -------------------------------------------------------------------------------
@pytest.mark.parametrize("router", ["none", "full", "per-dim"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mudd_at_init_is_the_baseline_bit_for_bit(router, dtype):
    """The default eps: current-only biases and W2 = 0 make every mixture the latest block output exactly
    (0 * X_j adds nothing) and the K/V gains are 1, so the logits are the baseline's bit for bit. The
    gradients agree to rounding only: the Q, K and V inputs go through the attention norm separately, so
    its backward runs three times and is summed after, where the baseline sums before it."""
    grads = baseline_at_init(tiny, "mudd", router, dtype)
    assert grads["depth_mix.proj.0.w2"].abs().sum() > 0 and grads["depth_mix.kv_gain"].abs().sum() > 0


def baseline_at_init(make, spec: str, router: str, dtype) -> dict:
    """The baseline and ``spec`` built by ``make`` from one seed (5 layers): the logits equal bit for bit,
    every shared weight's gradient to rounding; returns the peer's gradients by name."""
    torch.manual_seed(4)
    base = build_model(make("none", router, n_layers=5)).to(dtype)
    torch.manual_seed(4)
    peer = build_model(make(spec, router, n_layers=5)).to(dtype)
    idx = torch.randint(0, 256, (2, 10))
    out_b, out_p = base(idx), peer(idx)
    assert torch.equal(out_b, out_p)
    out_b.square().sum().backward()
    out_p.square().sum().backward()
    grads = {n: p.grad for n, p in peer.named_parameters()}
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for n, p in base.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=tol, atol=tol * p.grad.abs().max().item(), msg=n)
    return grads


def test_mudd_widths_and_shapes_by_hand():
    """ways * (i + 2) sources' weights (4 ways; 1 after the last block, hidden x 4), rounded (h // 64 + 1) * 64."""
    assert [hidden_width(4, s, False) for s in (2, 15, 16, 17)] == [64, 64, 128, 128]
    assert hidden_width(1, 17, True) == 128 and hidden_width(1, 5, True) == 64
    mix = build_model(tiny("mudd")).depth_mix
    assert mix.ways == [4, 4, 4, 1]
    assert [tuple(p.w1.shape) + tuple(p.w2.shape) for p in mix.proj] == [(64, 64, 64, 8), (64, 64, 64, 12),
                                                                         (64, 64, 64, 16), (64, 64, 64, 5)]
    assert [tuple(b.shape) for b in mix.bias] == [(4, 2), (4, 3), (4, 4), (1, 5)]
    assert all(torch.equal(b, torch.eye(b.shape[1])[-1].expand_as(b)) for b in mix.bias)
    assert torch.equal(mix.kv_gain, torch.ones(3, 2, 64))
    w1 = torch.cat([p.w1.flatten() for p in mix.proj])
    assert abs(w1.std().item() - 64 ** -0.5) < 0.01 and all(p.w2.abs().sum() == 0 for p in mix.proj)


def test_mudd_one_layer_model():
    """One block: no K/V streams at all, its single mixture (over X_0, X_1) feeds the final norm."""
    model = build_model(tiny("mudd", n_layers=1))
    assert model.depth_mix.ways == [1] and model.depth_mix.kv_gain.numel() == 0
    assert model(torch.randint(0, 256, (1, 5))).shape == (1, 5, 256)


# -- the LIMe authors' Hyper-Connections --------------------------------------------------------
def test_corl_hyper_connections_index_the_layer_not_the_sublayer():
    """a_m = e_{l mod n} for both sublayers of layer l (corl-team/lime, hc.py); the HC paper: e_{k mod n}."""
    L, n = 6, 4
    corl = build_model(tiny("hyper-connections-corl", n_layers=L)).depth_mix
    paper = build_model(tiny("hyper-connections", n_layers=L)).depth_mix
    for k in range(2 * L):
        assert torch.equal(corl.static_alpha[k, :, 0], torch.eye(n)[(k // 2) % n]), k
        assert torch.equal(paper.static_alpha[k, :, 0], torch.eye(n)[k % n]), k
        assert torch.equal(corl.static_alpha[k, :, 1:], torch.eye(n))
    H = torch.randn(2, 3, n, 64) * 3 + 5
    ln = (H - H.mean(-1, keepdim=True)) / torch.sqrt(H.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(corl.norm(H), ln)
    torch.testing.assert_close(corl.norm(H + 7.0), ln)  # LayerNorm removes the mean; the RMSNorm does not
    assert (paper.norm(H + 7.0) - paper.norm(H)).abs().max() > 0.1
