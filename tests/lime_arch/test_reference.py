"""The decoder against references written here from the paper's equations (arXiv 2502.09245):
``model_reference.py``, whose routing is the router kind's reference (``kind_references.py``)."""
import pytest
import torch
from model_reference import reference_forward
from routers_expected import expected_sources, router_specs

from lime_arch import build_model, preset
from lime_arch.generate import generate
from lime_arch.model import KVCache


@pytest.fixture(autouse=True)
def _f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


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
    ref = reference_forward(model, idx, lambda l: expected_sources(spec, l))
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
