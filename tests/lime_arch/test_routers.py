import pytest
import torch
from routers_expected import expected_sources, router_specs

from lime_arch import ConfigError, build_model, param_counts, preset
from lime_arch.routers import build_router
from lime_arch.routing.mixers import make_mixer

SPECS = router_specs()
KV = [4, 2]  # MHA and GQA on the tiny preset (4 heads)


def tiny(router, kv, **kw):
    return preset("tiny", router=router, n_kv_heads=kv, **kw)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", KV)
def test_shapes_and_causality(spec, kv):
    model = build_model(tiny(spec, kv)).eval()
    x = torch.randint(0, 256, (2, 12))
    y = model(x)
    assert y.shape == (2, 12, 256)
    x2 = x.clone()
    x2[:, 7:] = torch.randint(0, 256, (2, 5))
    y2 = model(x2)
    torch.testing.assert_close(y[:, :7], y2[:, :7])
    assert not torch.allclose(y[:, 7:], y2[:, 7:])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", KV)
def test_gradients_reach_exactly_the_source_slots(spec, kv):
    L, Hd, B, T = 5, 4, 2, 3
    router = build_router(spec, n_layers=L, n_kv_heads=kv, head_dim=Hd, init="paper")
    raw = [(torch.randn(B, T, kv, Hd, requires_grad=True), torch.randn(B, T, kv, Hd, requires_grad=True))
           for _ in range(L)]
    for target in range(L):
        mixer = make_mixer(router)
        routed = [mixer.route(l, k, v) for l, (k, v) in enumerate(raw)]
        k_t, v_t = routed[target]
        (k_t * torch.randn_like(k_t)).sum().add((v_t * torch.randn_like(v_t)).sum()).backward()
        reached = {s for s, (k, v) in enumerate(raw) if k.grad is not None and k.grad.abs().sum() > 0}
        reached_v = {s for s, (k, v) in enumerate(raw) if v.grad is not None and v.grad.abs().sum() > 0}
        assert reached == expected_sources(spec, target), f"layer {target}"
        assert reached_v == expected_sources(spec, target)
        for k, v in raw:
            k.grad = v.grad = None
        router.zero_grad(set_to_none=True)


def test_no_head_mix_reads_only_the_same_head():
    L, R, Hd = 4, 2, 4
    router = build_router("no-head-mix", n_layers=L, n_kv_heads=R, head_dim=Hd, init="paper")
    raw = [(torch.randn(1, 3, R, Hd, requires_grad=True), torch.randn(1, 3, R, Hd)) for _ in range(L)]
    mixer = make_mixer(router)
    out = [mixer.route(l, k, v) for l, (k, v) in enumerate(raw)]
    out[3][0][:, 0].sum().backward()  # routed head 0 of layer 3
    for k, _ in raw:
        assert k.grad[:, :, 1].abs().sum() == 0 and k.grad[:, :, 0].abs().sum() > 0


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", KV)
def test_router_parameter_counts(spec, kv):
    cfg = tiny(spec, kv)
    L, R, Hd = cfg.n_layers, kv, cfg.head_dim
    n_src = [len(expected_sources(spec, l)) for l in range(1, L)]
    name = spec.rsplit("-", 1)[0] if spec[-1].isdigit() else spec
    expected = {"none": 0, "average": 0, "no-head-mix": R * sum(n_src), "per-dim": Hd * R * R * sum(n_src)}
    want = expected.get(name, R * R * sum(n_src))
    if name == "full":
        assert want == R * R * sum(l + 1 for l in range(1, L))
    model = build_model(cfg)
    got = sum(p.numel() for p in model.router.parameters())
    assert got == want == param_counts(cfg)["router"]
    assert param_counts(cfg)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("spec", SPECS)
def test_dense_matrix_zero_outside_sources(spec):
    router = build_router(spec, n_layers=5, n_kv_heads=2, head_dim=4, init="paper")
    for l in range(5):
        d = router.dense(l)
        assert d.shape[:2] == (2, (l + 1) * 2)
        for s in range(l + 1):
            block = d[:, 2 * s:2 * s + 2]
            assert (block.abs().sum() > 0) == (s in expected_sources(spec, l)), (l, s)


def test_paper_init_identity_on_current_block():
    router = build_router("full", n_layers=4, n_kv_heads=3, head_dim=4, init="paper")
    for l in range(1, 4):
        w = router.weight(l)
        torch.testing.assert_close(w[:, -3:], torch.eye(3))
        b = (3.0 / ((l + 1) * 3)) ** 0.5
        assert w[:, :-3].abs().max() <= b
    ident = build_router("full", n_layers=4, n_kv_heads=3, head_dim=4, init="identity")
    assert ident.weight(2)[:, :-3].abs().sum() == 0


@pytest.mark.parametrize("bad,field", [
    (dict(router="nope"), "model.router"),
    (dict(router="first-0"), "model.router"),
    (dict(router="first"), "model.router"),
    (dict(router="last-x"), "model.router"),
    (dict(n_heads=3), "model.n_heads"),
    (dict(n_kv_heads=3), "model.n_kv_heads"),
    (dict(d_model=-4), "model.d_model"),
    (dict(router_init="zeros"), "model.router_init"),
    (dict(attn_impl="xformers"), "model.attn_impl"),
    (dict(colour="red"), "model.colour"),
])
def test_bad_configs_raise_config_error(bad, field):
    with pytest.raises(ConfigError) as e:
        preset("tiny", **bad)
    assert str(e.value).startswith(field)
    assert "\n" not in str(e.value)


def test_unknown_router_lists_registered():
    with pytest.raises(ConfigError, match="full.*first-<int>"):
        preset("tiny", router="fancy")
