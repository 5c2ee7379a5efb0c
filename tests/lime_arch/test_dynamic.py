"""The dynamic routers (arXiv 2502.09245, Appendix E) beyond the registry-wide tests: the identity
init is the ``none`` model bit for bit, a gate strictly between 0 and 1 against the float64
reference (MHA and GQA), the per-token dense matrices against the mixer, and what a training
forward keeps for backward (no per-token weights: they are recomputed layer by layer)."""
import pytest
import torch
from kind_references import REFERENCES
from model_reference import reference_forward, saved_bytes
from routers_expected import expected_sources

from lime_arch import build_model, preset, routing_memory
from lime_arch.routers import build_router
from lime_arch.routing.kinds.dynamic import split
from lime_arch.routing.mixers import make_mixer

SPECS = ["dynamic", "dynamic-first-2", "dynamic-last-2"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", [4, 2, 1])
def test_identity_init_is_the_none_model_bit_for_bit(spec, kv):
    base = build_model(preset("tiny", router="none", n_kv_heads=kv))
    dyn = build_model(preset("tiny", router=spec, n_kv_heads=kv, router_init="identity"))
    missing, unexpected = dyn.load_state_dict(base.state_dict(), strict=False)
    assert unexpected == [] and missing and all(k.startswith("router.") for k in missing)
    idx = torch.randint(0, 256, (2, 16))
    assert torch.equal(dyn(idx), base(idx))
    paper = build_model(preset("tiny", router=spec, n_kv_heads=kv, router_init="paper"))
    paper.load_state_dict(base.state_dict(), strict=False)
    assert not torch.allclose(paper(idx), base(idx))  # the paper's mixing is no baseline
    # the gate's gradient is nonzero at the identity init, so the router starts learning
    dyn(idx).pow(2).mean().backward()
    gates = [split(w.grad, kv, dyn.cfg.head_dim)[1] for w in dyn.router.weights]
    assert all(g.abs().sum() > 0 for g in gates)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", [4, 2])
def test_gate_between_zero_and_one_against_the_reference(spec, kv):
    torch.set_default_dtype(torch.float64)
    try:
        model = build_model(preset("tiny", router=spec, n_kv_heads=kv))
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for w in model.router.weights:
                w.normal_(0.0, 1.0, generator=g)  # keys of unit scale: far from uniform weights
                w[:, -1].uniform_(0.2, 0.8, generator=g)
        idx = torch.randint(0, 256, (2, 10))
        target = torch.randn(2, 10, 256)
        out = model(idx)
        (out * target).sum().backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        ref = reference_forward(model, idx, lambda l: expected_sources(spec, l))
        (ref * target).sum().backward()
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        for n, p in model.named_parameters():
            torch.testing.assert_close(got[n], p.grad, rtol=1e-9, atol=1e-11, msg=n)
    finally:
        torch.set_default_dtype(torch.float32)


def _inputs(L, B, T, R, H, Hd, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = [(torch.randn(B, T, R, Hd, generator=g, dtype=torch.float64, requires_grad=True),
            torch.randn(B, T, R, Hd, generator=g, dtype=torch.float64, requires_grad=True)) for _ in range(L)]
    q = [torch.randn(B, T, H, Hd, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(L)]
    return raw, q


@pytest.mark.parametrize("R", [2, 1])
def test_token_mixing_is_what_the_mixer_applies(R):
    """Per token, routed K/V = token_mixing(l, q) @ [K/V of layers 0..l]; at a zero query it is dense(l)."""
    L, B, T, H, Hd = 4, 2, 3, 4, 8
    router = build_router("dynamic", n_layers=L, n_kv_heads=R, head_dim=Hd).double()
    with torch.no_grad():
        for w in router.weights:
            w[:, -1] = 0.7
    raw, q = _inputs(L, B, T, R, H, Hd)
    m = make_mixer(router)
    outs = [m.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
    for l in range(L):
        a = router.kind.token_mixing(router, l, q[l])  # (B, T, R, (l+1)R)
        assert a.shape == (B, T, R, (l + 1) * R)
        k_all = torch.cat([k for k, _ in raw[:l + 1]], dim=2)  # (B, T, (l+1)R, Hd)
        torch.testing.assert_close(outs[l][0], torch.einsum("btrc,btcd->brtd", a, k_all), rtol=1e-12, atol=1e-12)
        if l:  # the rows sum to 1 (a convex mix) and the zero query gives dense(l)
            torch.testing.assert_close(a.sum(-1), torch.ones(B, T, R, dtype=torch.float64))
            zero = router.kind.token_mixing(router, l, torch.zeros_like(q[l]))
            torch.testing.assert_close(zero[0, 0], router.dense(l))


def test_training_forward_keeps_no_per_token_weights():
    """What autograd saves for backward in a training forward: nothing shaped (B, T, R, n) (the
    per-token weights of a layer reading n source heads): every layer's weights are recomputed in
    backward, one layer at a time. The gradients are still the reference's (test above)."""
    L, B, T, R, H, Hd = 5, 2, 3, 2, 4, 16
    router = build_router("dynamic", n_layers=L, n_kv_heads=R, head_dim=Hd).double()
    raw, q = _inputs(L, B, T, R, H, Hd, seed=1)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m = make_mixer(router)
        outs = [m.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
    per_token = {(B, T, R, (l + 1) * R) for l in range(1, L)}
    assert shapes and not per_token & set(shapes), shapes
    sum(o.sum() for kv in outs for o in kv).backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in router.weights)


def test_parameters_and_macs_per_layer():
    """Layer l of dynamic over all of 0..l: R (l+1)R keys of Hd and R gates; (hand count) R=2,
    Hd=4, l=2: 2 * (6 * 4 + 1) = 50 parameters, 3 * 2 * 6 * 4 = 144 MACs per token."""
    r = build_router("dynamic", n_layers=4, n_kv_heads=2, head_dim=4)
    assert tuple(r.weight(2).shape) == (2, 25) and r.weight(2).numel() == 50
    assert r.macs_per_token(2) == 144 == REFERENCES["dynamic"].macs(3, 2, 4)


@pytest.mark.parametrize("spec", ["dynamic", "dynamic-first-2"])
@pytest.mark.parametrize("kv", [4, 2])
def test_kept_memory_is_the_accounted(spec, kv):
    """What a training forward saves for backward (distinct storages, through autograd's hooks),
    dynamic minus none, against ``routing_memory``'s ``kept`` (every layer's raw K/V and grouped
    query): within 5% (the router's own weights and layer 0's V, which none's attention saves too)."""
    cfg = preset("tiny", router=spec, n_kv_heads=kv, n_layers=6)
    idx = torch.randint(0, 256, (2, 32))

    got = saved_bytes(cfg, idx) - saved_bytes(cfg.replace(router="none"), idx)
    want = routing_memory(cfg, 2, 32)["kept"]
    assert abs(got - want) <= 0.05 * want, (got, want)
