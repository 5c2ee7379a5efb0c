"""The decoder against references written here from the paper's equations (arXiv 2502.09245)."""
import math

import pytest
import torch
from routers_expected import expected_sources, router_specs

from lime_arch import build_model, preset
from lime_arch.generate import generate
from lime_arch.model import KVCache


@pytest.fixture(autouse=True)
def _f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # x: (B, H, T, Hd), rotate-half convention
    T, Hd = x.shape[-2:]
    inv = 1.0 / theta ** (torch.arange(0, Hd, 2, dtype=torch.float64) / Hd)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : Hd // 2], x[..., Hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def router_weight_dense(model, spec, l, R, Hd):
    """The paper's Eq. 4 weights as a dense (R, (l+1)R[, Hd]) matrix, built from the raw params."""
    name = spec.rsplit("-", 1)[0] if spec[-1].isdigit() else spec
    src = sorted(expected_sources(spec, l))
    per_dim = name == "per-dim"
    dense = torch.zeros((R, (l + 1) * R) + ((Hd,) if per_dim else ()))
    if name == "none" or l == 0:
        dense[:, l * R:(l + 1) * R] = torch.eye(R) if not per_dim else torch.eye(R)[..., None]
        return dense
    if name == "average":
        for s in src:
            dense[:, s * R:(s + 1) * R] = torch.eye(R) / len(src)
        return dense
    w = model.router.weights[l - 1]
    for i, s in enumerate(src):
        if name == "no-head-mix":
            dense[:, s * R:(s + 1) * R] = torch.diag(w[:, i])
        else:
            dense[:, s * R:(s + 1) * R] = w[:, i * R:(i + 1) * R]
    return dense


def reference_forward(model, idx, spec):
    """Straight from the paper: keep a growing buffer of raw K/V, concatenate, multiply."""
    cfg = model.cfg
    H, R, Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    B, T = idx.shape
    x = model.embed.weight[idx]
    buf_k, buf_v = [], []
    for l, blk in enumerate(model.blocks):
        a = blk.attn
        h = rms(x, blk.attn_norm.weight, cfg.norm_eps)
        q = (h @ a.wq.weight.T).view(B, T, H, Hd).transpose(1, 2)
        buf_k.append((h @ a.wk.weight.T).view(B, T, R, Hd))
        buf_v.append((h @ a.wv.weight.T).view(B, T, R, Hd))
        K, V = torch.cat(buf_k, 2), torch.cat(buf_v, 2)  # (B, T, (l+1)R, Hd)
        W = router_weight_dense(model, spec, l, R, Hd)
        eq = "hc,btcd->bhtd" if W.dim() == 2 else "hcd,btcd->bhtd"
        k, v = torch.einsum(eq, W, K), torch.einsum(eq, W, V)
        q, k = rope(q, cfg.rope_theta), rope(k, cfg.rope_theta)
        k, v = k.repeat_interleave(H // R, 1), v.repeat_interleave(H // R, 1)
        att = q @ k.transpose(-1, -2) / math.sqrt(Hd)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, H * Hd) @ a.wo.weight.T
        m = blk.mlp
        h = rms(x, blk.mlp_norm.weight, cfg.norm_eps)
        x = x + (torch.nn.functional.silu(h @ m.w1.weight.T) * (h @ m.w3.weight.T)) @ m.w2.weight.T
    return rms(x, model.norm.weight, cfg.norm_eps) @ model.embed.weight.T


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("spec", router_specs())
@pytest.mark.parametrize("kv", [4, 2])
def test_matches_paper_reference_forward_and_gradients(spec, kv):
    model = build_model(preset("tiny", router=spec, n_kv_heads=kv)).double()
    idx = torch.randint(0, 256, (2, 10))
    target = torch.randn(2, 10, 256)
    out = model(idx)
    (out * target).sum().backward()
    g_fast = _grads(model)
    model.zero_grad(set_to_none=True)
    ref = reference_forward(model, idx, spec)
    (ref * target).sum().backward()
    g_ref = _grads(model)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    assert g_fast.keys() == g_ref.keys()
    for n in g_ref:
        torch.testing.assert_close(g_fast[n], g_ref[n], rtol=1e-8, atol=1e-10, msg=n)


@pytest.mark.parametrize("spec", router_specs())
def test_concat_mixer_equals_buffer(spec):
    m1 = build_model(preset("tiny", router=spec, n_kv_heads=2)).double()
    m2 = build_model(preset("tiny", router=spec, n_kv_heads=2, routing_impl="concat")).double()
    m2.load_state_dict(m1.state_dict())
    idx = torch.randint(0, 256, (2, 9))
    m1(idx).pow(2).sum().backward()
    m2(idx).pow(2).sum().backward()
    for (n, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-8, atol=1e-10, msg=n)


def test_full_identity_init_equals_none():
    base = build_model(preset("tiny", router="none"))
    full = build_model(preset("tiny", router="full", router_init="identity"))
    missing, unexpected = full.load_state_dict(base.state_dict(), strict=False)
    assert unexpected == [] and all(k.startswith("router.") for k in missing)
    idx = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(full(idx), base(idx))
    paper = build_model(preset("tiny", router="full", router_init="paper"))
    paper.load_state_dict(base.state_dict(), strict=False)
    assert not torch.allclose(paper(idx), base(idx))  # the paper's init is not the baseline


def test_eager_attention_agrees_with_sdpa():
    a = build_model(preset("tiny", router="full", n_kv_heads=2))
    b = build_model(preset("tiny", router="full", n_kv_heads=2, attn_impl="eager"))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 256, (2, 11))
    torch.testing.assert_close(a(idx), b(idx))


def test_flash_on_cpu_falls_back_to_sdpa_exactly():
    """flash-attn needs CUDA and bf16/fp16: on CPU `attn_impl: flash` is SDPA itself (the same
    numbers, not merely close). The flash-attn kernel is checked on CUDA by the gpu tests
    (tests/orchestrator/cluster/test_gpu.py) and `make gpu-check`."""
    a = build_model(preset("tiny", router="full", n_kv_heads=2))
    b = build_model(preset("tiny", router="full", n_kv_heads=2, attn_impl="flash"))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 256, (2, 11))
    assert torch.equal(a(idx), b(idx))


@pytest.mark.parametrize("spec", router_specs())
@pytest.mark.parametrize("kv", [4, 2])
def test_cached_decoding_reproduces_full_forward(spec, kv):
    model = build_model(preset("tiny", router=spec, n_kv_heads=kv)).eval()
    idx = torch.randint(0, 256, (3, 14))
    full = model(idx)
    cache = KVCache(model.cfg, 3, 14, idx.device, torch.float64)
    steps = [model(idx[:, :6], cache)]
    for t in range(6, 14):
        steps.append(model(idx[:, t:t + 1], cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)
    assert cache.nbytes() == 2 * 4 * 3 * kv * 14 * 16 * 8  # same as the baseline's cache


def test_generate_greedy_matches_argmax_rollout():
    model = build_model(preset("tiny", router="first-2")).eval()
    idx = torch.randint(0, 256, (2, 5))
    out = generate(model, idx, 6)
    seq = idx
    for _ in range(6):
        seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], 1)
    assert torch.equal(out, seq)
    g = torch.Generator().manual_seed(3)
    s1 = generate(model, idx, 6, temperature=1.0, top_k=5, generator=g)
    g = torch.Generator().manual_seed(3)
    assert torch.equal(s1, generate(model, idx, 6, temperature=1.0, top_k=5, generator=g))
