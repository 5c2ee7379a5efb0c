"""Qwen's gated residual streams (``gated-residual[-<rate>[-<rank>]]``, lime_arch/depth_mix/gated.py): the whole
model against the float64 reference written from the equations (tests/lime_arch/gated_reference.py) at 1e-12,
logits and every gradient, MHA and GQA, composed with LIMe routers; the plain pre-norm residual model at step
0; the init and the step-0 read by hand; which weights get a gradient at step 0 (why D starts random);
parameters and FLOPs by hand formulas; fp32 coefficients under bf16 autocast; bad arguments."""
import math
import re

import pytest
import torch

from lime_arch import ConfigError, build_model, flops_per_token, param_counts, preset
from lime_arch.size import depth_mix_params
from tests.lime_arch.gated_reference import GatedResidualSteps
from tests.lime_arch.test_peer_reference import Ref

S1 = 1 / (1 + math.exp(-1))  # sigmoid(1): the static read logit on stream k mod n


def tiny(depth_mix, router="none", kv=4, **kw):
    return preset("tiny", depth_mix=depth_mix, router=router, n_kv_heads=kv, **kw)


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


class GatedRef(GatedResidualSteps, Ref):
    pass


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("spec", ["gated-residual", "gated-residual-2-3", "gated-residual-3-1"])
@pytest.mark.parametrize("kv", [4, 2])
@pytest.mark.parametrize("router", ["none", "full"])
def test_matches_the_float64_reference_to_1e_12(spec, kv, router, f64):
    model = build_model(preset("tiny", router=router, n_kv_heads=kv, n_layers=5, depth_mix=spec)).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # away from the init (U = J = gamma = 0 would hide most of the read and the write)
        for p in [*model.depth_mix.parameters(), *model.router.parameters()]:
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    idx = torch.randint(0, 256, (2, 9))
    target = torch.randn(2, 9, 256)
    out = model(idx)
    (out * target).sum().backward()
    got = _grads(model)
    model.zero_grad(set_to_none=True)
    ref = GatedRef(model, idx).run()
    (ref * target).sum().backward()
    want = _grads(model)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert got.keys() == want.keys() and any(n.startswith("depth_mix.proj.") for n in want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-12, atol=1e-12, msg=n)


def _block_outputs(model, idx):
    outs = []
    hooks = [b.register_forward_hook(lambda _m, _i, o: outs.append(o.detach())) for b in model.blocks]
    logits = model(idx)
    for h in hooks:
        h.remove()
    return logits, outs


@pytest.mark.parametrize("router,kv", [("none", 4), ("full", 2), ("per-dim", 2)])
def test_step_zero_is_the_plain_pre_norm_residual_model(router, kv, f64):
    """Same seed, float64, a negligible norm eps: every stream after every block is the baseline's residual
    stream, and the logits are the none model's (the block's pre-norm and the final norm undo the read's scale
    c = (sigmoid(1) + (n - 1)/2) / n)."""
    idx = torch.randint(0, 256, (2, 10))
    torch.manual_seed(3)
    base = build_model(tiny("none", router, kv, norm_eps=1e-30))
    torch.manual_seed(3)
    peer = build_model(tiny("gated-residual", router, kv, norm_eps=1e-30))
    lb, hb = _block_outputs(base, idx)
    lp, hp = _block_outputs(peer, idx)
    torch.testing.assert_close(lp, lb, rtol=1e-12, atol=1e-12)
    for l, (xb, H) in enumerate(zip(hb, hp)):
        assert H.shape == (2, 10, 4, 64)
        for i in range(4):
            torch.testing.assert_close(H[:, :, i], xb, rtol=1e-12, atol=1e-12, msg=f"block {l} stream {i}")
        torch.testing.assert_close(peer.depth_mix.hidden(H), xb, rtol=1e-12, atol=1e-12)


def test_init_and_the_step_zero_read_by_hand():
    """gamma = 0, U = 0, J = 0, S = 1 on stream k mod n (every channel), D ~ N(0, std^2): read k of any streams is
    h = (1/n) sum_i c_i H_i / rms(H_i) with c_i = sigmoid(1) on stream k mod n and 1/2 elsewhere, w = 1."""
    model = build_model(tiny("gated-residual", n_layers=6))
    mix, n, C, r, K = model.depth_mix, 4, 64, 8, 12
    assert (mix.rate, mix.rank) == (4, 8) and len(mix.proj) == K + 1
    assert torch.equal(mix.gain, torch.zeros(K + 1, n, C))
    assert torch.equal(mix.read_logit, torch.eye(n)[[k % n for k in range(K + 1)]][..., None].expand(K + 1, n, C))
    for k, p in enumerate(mix.proj):
        assert p.down.shape == (n * C, r) and torch.equal(p.up, torch.zeros(r, n * C))
        assert torch.equal(p.inject, torch.zeros(n * C, n)) if k < K else not hasattr(p, "inject")
    down = torch.cat([p.down.flatten() for p in mix.proj])
    assert abs(down.std().item() - C ** -0.5) < 0.01 and abs(down.mean().item()) < 0.01  # the model's std
    H = torch.randn(2, 3, n, C) * torch.tensor([0.5, 1.0, 2.0, 3.0])[:, None]  # distinct streams
    for k in (0, 5, K):
        h, w = mix.read(k, H)
        c = torch.full((n,), 0.5)
        c[k % n] = S1
        Hn = H / torch.sqrt(H.pow(2).mean(-1, keepdim=True) + model.cfg.norm_eps)
        torch.testing.assert_close(h, (c[:, None] * Hn).sum(-2) / n)
        if k < K:
            assert torch.equal(w, torch.ones(2, 3, n))  # 2 sigmoid(0): exactly 1
        else:
            assert w is None


def test_at_step_zero_D_has_no_gradient_and_U_needs_D_random():
    """U = 0 cuts every path through the bottleneck a, so dD = 0 at step 0 while U, J and gamma get gradients
    (U's is dG outer a, with a = SiLU(vec(u) D / n) != 0); had D started at zero too, a = 0 and U would never
    get a gradient either. The static logits break the streams' symmetry: stream i's gradient is weighted by
    its gate G_i, so J's columns (the streams' write scalars) get different gradients from step 0."""
    idx = torch.randint(0, 256, (2, 8))
    model = build_model(tiny("gated-residual", "full", 2))
    model(idx).square().mean().backward()
    mix = model.depth_mix
    assert all(torch.equal(p.down.grad, torch.zeros_like(p.down)) for p in mix.proj)
    assert all(p.up.grad.abs().sum() > 0 for p in mix.proj)
    assert all(mix.proj[k].inject.grad.abs().sum() > 0 for k in range(8))
    assert mix.gain.grad.abs().sum() > 0 and mix.read_logit.grad.abs().sum() > 0
    g = mix.proj[0].inject.grad  # (nC, n)
    assert (g[:, 0] - g[:, 1]).abs().max() > 1e-2 * g.abs().max()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p in mix.proj:
            p.down.zero_()
    model(idx).square().mean().backward()
    assert all(torch.equal(p.up.grad, torch.zeros_like(p.up)) for p in mix.proj)


L, C = 4, 64  # the tiny preset


def _read_params(n, r):  # gamma (n, C), S (n, C), D (nC, r), U (r, nC)
    return n * C + n * C + n * C * r + r * n * C


@pytest.mark.parametrize("spec,n,r", [("gated-residual", 4, 8), ("gated-residual-2", 2, 8),
                                      ("gated-residual-3-5", 3, 5), ("gated-residual-1-1", 1, 1)])
def test_parameters_and_flops_by_hand(spec, n, r):
    count = 2 * L * (_read_params(n, r) + n * C * n) + _read_params(n, r)  # J (nC, n) per sublayer; the mixer
    # per sublayer: vec(u) D nCr, a U rnC, the gated mean nC, vec(u) J nCn, the write nC; the mixer: the read
    macs = 2 * L * (n * C * r + r * n * C + n * C + n * C * n + n * C) + (n * C * r + r * n * C + n * C)
    for kw in ({}, {"router": "full", "n_kv_heads": 2}):
        cfg, base = preset("tiny", depth_mix=spec, **kw), preset("tiny", **kw)
        assert sum(p.numel() for p in build_model(cfg).depth_mix.parameters()) == count
        assert param_counts(cfg)["depth_mix"] == count == depth_mix_params(cfg)
        assert param_counts(cfg)["total"] - param_counts(base)["total"] == count
        f, f0 = flops_per_token(cfg, 64), flops_per_token(base, 64)
        assert f["depth_mix"] == 2 * macs and f["base"] == f0["base"] and f["total"] == f0["total"] + 2 * macs


def test_coefficients_are_fp32_under_bf16_autocast(monkeypatch):
    model = build_model(tiny("gated-residual", "full", 2))
    mix, seen = model.depth_mix, []
    original = type(mix).read

    def spy(self, k, H):
        h, w = original(self, k, H)
        seen.append((H.dtype, h.dtype, None if w is None else w.dtype))
        return h, w

    monkeypatch.setattr(type(mix), "read", spy)
    streams = []
    model.blocks[1].register_forward_hook(lambda _m, _i, o: streams.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, 256, (2, 12)))
    assert logits.dtype == torch.bfloat16  # the LM head ran under autocast
    f32 = torch.float32
    assert seen == [(f32, f32, f32)] * 8 + [(f32, f32, None)] and streams == [f32]
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in mix.parameters() if p.grad is not None)


@pytest.mark.parametrize("spec,msg", [
    ("gated-residual-0", "'gated-residual-0' needs a positive integer for rate, got 0"),
    ("gated-residual-4-0", "'gated-residual-4-0' needs a positive integer for rank, got 0"),
    ("gated-residual-2.5", "'gated-residual-2.5' needs a positive integer for rate, got 2.5"),
    ("gated-residual-4-8-1", "gated-residual takes at most 2 argument(s), gated-residual[-<rate>[-<rank>]]"),
])
def test_bad_arguments_are_one_line_config_errors(spec, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)) as e:
        tiny(spec)
    assert str(e.value).startswith("model.depth_mix: ") and "\n" not in str(e.value)
