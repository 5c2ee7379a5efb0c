import contextlib

import pytest
import torch
from kind_references import REFERENCES as KIND_REFERENCES
from routers_expected import expected_sources, router_specs

from lime_arch import ConfigError, build_model, param_counts, preset
from lime_arch.routers import (
    IDENTITY,
    LINEAR,
    MEAN,
    PER_DIM,
    ROUTERS,
    SAME_HEAD,
    FullRouter,
    Router,
    RouterArg,
    build_router,
    parse_router,
    register_router,
)
from lime_arch.routers import router_specs as registered_specs
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
    q = [torch.randn(B, T, 4, Hd) for _ in range(L)]  # the layers' queries (4 heads; token-dependent kinds)
    for target in range(L):
        mixer = make_mixer(router)
        routed = [mixer.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
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
    model = build_model(cfg)
    want = sum(KIND_REFERENCES[model.router.kind.name].params(n, R, Hd) for n in n_src)
    if spec == "full":
        assert want == R * R * sum(l + 1 for l in range(1, L))
    got = sum(p.numel() for p in model.router.parameters())
    assert got == want == param_counts(cfg)["router"]
    assert param_counts(cfg)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("spec", SPECS)
def test_dense_matrix_zero_outside_sources(spec):
    router = build_router(spec, n_layers=5, n_kv_heads=2, head_dim=4, init="paper")
    try:
        router.dense(1)
    except NotImplementedError as e:  # a token-dependent kind with no one matrix (depth attention)
        assert router.kind.token_dependent and "depends on the tokens" in str(e)
        return
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


# The paper's routers (arXiv 2502.09245, Appendix F/G) and the dynamic ones (Appendix E), in registration order:
# what the registry must hold at least. A router added by the documented recipe comes after them and
# changes none of the tests below.
PAPER_ROUTERS = ["none", "full", "average", "last", "first", "dilated", "no-head-mix", "per-dim", "depth-attention",
                 "dynamic", "dynamic-first", "dynamic-last"]


def _registered_forms() -> str:
    """The registry as the unknown-router error lists it, written here from the classes: a name, then
    '-<type>' per argument, joined by ', '."""
    return ", ".join(name + "".join(f"-<{a.type.__name__}>" for a in cls.arguments) for name, cls in ROUTERS.items())


REGISTERED = _registered_forms()


def test_the_registry_holds_the_paper_routers_first():
    assert list(ROUTERS)[:len(PAPER_ROUTERS)] == PAPER_ROUTERS
    assert REGISTERED.startswith("none, full, average, last-<int>, first-<int>, dilated-<int>, no-head-mix, "
                                 "per-dim, depth-attention, dynamic, dynamic-first-<int>, dynamic-last-<int>")


@pytest.mark.parametrize("spec,message", [
    ("first-0", "model.router: 'first-0' needs a positive integer after '-', got 0"),
    ("first", "model.router: 'first' needs an integer, e.g. first-4"),
    ("nope", f"model.router: unknown router 'nope'; registered: {REGISTERED}"),
    ("last-x", f"model.router: unknown router 'last-x'; registered: {REGISTERED}"),
    ("first--1", f"model.router: unknown router 'first--1'; registered: {REGISTERED}"),
    ("full-3", f"model.router: unknown router 'full-3'; registered: {REGISTERED}"),
    ("first-4-5", f"model.router: unknown router 'first-4-5'; registered: {REGISTERED}"),
    (5, f"model.router: must be a string, got 5; registered: {REGISTERED}"),
])
def test_parse_errors_are_exact(spec, message):
    with pytest.raises(ConfigError) as e:
        parse_router(spec)
    assert str(e.value) == message


def test_parse_and_spec_round_trip():
    cls, args = parse_router("dilated-8")
    assert (cls.name, args) == ("dilated", (8,))
    r = build_router("first-04", n_layers=6, n_kv_heads=2, head_dim=4)
    assert (r.spec, r.j, r.arg_values) == ("first-4", 4, (4,))
    assert r.sources(5) == [0, 1, 2, 3, 5]
    assert parse_router("no-head-mix") == (ROUTERS["no-head-mix"], ())


def test_router_specs_come_from_the_registry():
    n = len(PAPER_ROUTERS)
    assert registered_specs()[:n] == ["none", "full", "average", "last-4", "first-4", "dilated-8", "no-head-mix",
                                      "per-dim", "depth-attention", "dynamic", "dynamic-first-4", "dynamic-last-4"]
    assert registered_specs((2, 8))[:n + 5] == ["none", "full", "average", "last-2", "last-8", "first-2", "first-8",
                                                "dilated-2", "dilated-8", "no-head-mix", "per-dim",
                                                "depth-attention", "dynamic", "dynamic-first-2", "dynamic-first-8",
                                                "dynamic-last-2", "dynamic-last-8"]
    # every registered router, in registration order: a bare name, or one spec per given value
    expected = [spec for name, cls in ROUTERS.items()
                for spec in ([name] if not cls.arguments else
                             [name + f"-{v}" * len(cls.arguments) for v in (2, 8)])]
    assert registered_specs((2, 8)) == expected
    for spec in registered_specs((3,)):
        parse_router(spec)


@contextlib.contextmanager
def _registered(name: str, cls: type):
    register_router(name)(cls)
    try:
        yield cls
    finally:
        ROUTERS.pop(name)


class _Strided(Router):
    """Two typed arguments: every ``step``-th slot from ``start``, plus the current one."""

    kind = LINEAR
    arguments = (RouterArg("start", int, 1), RouterArg("step", int, 2))

    def sources(self, l):
        return sorted(set(range(min(self.start, l), l + 1, self.step)) | {l})


class _Scaled(Router):
    kind = MEAN
    arguments = (RouterArg("scale", float, 0.5),)


def test_two_typed_arguments():
    with _registered("strided", _Strided), _registered("scaled", _Scaled):
        r = build_router("strided-1-3", n_layers=8, n_kv_heads=2, head_dim=4)
        assert (r.start, r.step, r.spec) == (1, 3, "strided-1-3")
        assert r.sources(7) == [1, 4, 7] and r.weight(7).shape == (2, 6)
        assert parse_router("scaled-0.25") == (_Scaled, (0.25,))
        assert registered_specs()[-2:] == ["strided-1-2", "scaled-0.5"]
        assert registered_specs((3,))[-2:] == ["strided-3-3", "scaled-3.0"]
        for spec, message in [
            ("strided", "model.router: 'strided' needs 2 arguments (<start>-<step>), e.g. strided-1-2"),
            ("strided-0-2", "model.router: 'strided-0-2' needs a positive integer for start, got 0"),
            ("strided-1-0", "model.router: 'strided-1-0' needs a positive integer for step, got 0"),
            ("scaled-0.0", "model.router: 'scaled-0.0' needs a positive number after '-', got 0.0"),
            ("scaled", "model.router: 'scaled' needs a number, e.g. scaled-0.5"),
        ]:
            with pytest.raises(ConfigError) as e:
                parse_router(spec)
            assert str(e.value) == message
        with pytest.raises(ConfigError, match=r"unknown router 'strided-1'; registered: .*strided-<int>-<int>, "
                                              r"scaled-<float>$"):
            parse_router("strided-1")
        assert preset("tiny", router="strided-1-2").router == "strided-1-2"
    with pytest.raises(ConfigError, match="unknown router 'strided-1-2'"):
        parse_router("strided-1-2")


class _NoKind(Router):
    pass


class _StringKind(Router):
    kind = "linear"


class _BadArgType(Router):
    kind = LINEAR
    arguments = (RouterArg("j", str, "x"),)


class _ShadowingArg(Router):
    kind = LINEAR
    arguments = (RouterArg("R"),)


class _ArgsNotTuple(Router):
    kind = LINEAR
    arguments = [RouterArg("j")]


@pytest.mark.parametrize("name,cls,error,match", [
    ("no-kind", _NoKind, TypeError, "kind must be one of the registered router kinds .*identity.*, got None"),
    ("string-kind", _StringKind, TypeError, "kind must be one of .*got 'linear'"),
    ("bad-arg", _BadArgType, TypeError, "argument 'j' has type"),
    ("shadow", _ShadowingArg, ValueError, "argument name 'R' is not a free identifier"),
    ("arg-list", _ArgsNotTuple, TypeError, "arguments must be a tuple of RouterArg"),
    ("full", FullRouter, ValueError, "'full' is registered already"),
    ("first-4", FullRouter, ValueError, "none of them all digits"),
    ("Fancy", FullRouter, ValueError, "lowercase words"),
    ("plain", object, TypeError, "not a subclass of Router"),
])
def test_registration_checks_the_class(name, cls, error, match):
    before = dict(ROUTERS)
    with pytest.raises(error, match=match):
        register_router(name)(cls)
    assert dict(ROUTERS) == before


def test_kind_decides_operand_shape_and_macs():
    L, R, Hd = 4, 2, 3
    for spec, kind, shape, macs in [
        ("full", LINEAR, (R, 3 * R), 2 * R * 3 * R * Hd),
        ("no-head-mix", SAME_HEAD, (R, 3), 2 * R * 3 * Hd),
        ("per-dim", PER_DIM, (R, 3 * R, Hd), 2 * R * 3 * R * Hd),
        ("average", MEAN, None, 2 * R * 3 * Hd),
        ("none", IDENTITY, None, 0),
    ]:
        r = build_router(spec, n_layers=L, n_kv_heads=R, head_dim=Hd)
        assert r.kind is kind and r.macs_per_token(2) == macs
        w = r.weight(2)
        assert (None if w is None else tuple(w.shape)) == shape
        if shape is not None:
            assert w is r.weights[1]  # the parameter itself: the mixer memoises its views
