"""Router kinds: every registered kind against its float64 reference (``kind_references.py``),
through every mixer path, with routers of the registry and, per buffered kind, a router with
non-contiguous sources; the kinds' counts (parameters, FLOPs); the kind registry's checks; and a
token-dependent kind defined in this file alone (one class, one router), which trains, decodes
from the KV cache and is counted without any other code knowing it."""
import contextlib

import pytest
import torch
from kind_references import REFERENCES
from model_reference import reference_forward
from routers_expected import expected_sources, router_specs

from lime_arch import build_model, flops_per_token, param_counts, preset
from lime_arch.generate import generate
from lime_arch.model import KVCache
from lime_arch.routers import LINEAR, ROUTER_KINDS, ROUTERS, Router, RouterKind, build_router, register_router
from lime_arch.routing import mixers
from lime_arch.routing.kinds.base import register_kind
from lime_arch.routing.kinds.linear import LinearKind
from lime_arch.routing.mixers import make_mixer

L, HD, B, T, H = 6, 4, 2, 3, 4


@pytest.fixture(autouse=True)
def _f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


@contextlib.contextmanager
def _registered(name: str, cls: type):
    register_router(name)(cls)
    try:
        yield cls
    finally:
        ROUTERS.pop(name)


def _every_other(l: int) -> set[int]:
    """Slots 0, 2, 4, ... and the current one: several runs of the buffer per layer."""
    return set(range(0, l + 1, 2)) | {l}


def _sparse_router(kind: RouterKind) -> type:
    class Sparse(Router):
        def sources(self, l):
            return sorted(_every_other(l))

    Sparse.kind = kind
    return Sparse


LEARNED = [k.name for k in ROUTER_KINDS.values() if k.learned]
# every registered router, and per buffered kind a router reading non-contiguous slots (the mean
# kind's running sum reads all of 0..l, as every registered mean router does)
# kind: each its own name (the compile ops cache a router's structure by its spec)
CASES = [(spec, None) for spec in router_specs()] + [(f"sparse-{name}-test", name) for name in LEARNED]


def test_every_registered_kind_has_a_reference():
    assert set(REFERENCES) == set(ROUTER_KINDS), "add the new kind's reference to kind_references.py"


def _inputs(R: int):
    g = torch.Generator().manual_seed(0)
    raw = [(torch.randn(B, T, R, HD, generator=g, requires_grad=True),
            torch.randn(B, T, R, HD, generator=g, requires_grad=True)) for _ in range(L)]
    q = [torch.randn(B, T, H, HD, generator=g) for _ in range(L)]  # pre-RoPE queries (B, T, H, Hd)
    grad_out = [(torch.randn(B, R, T, HD, generator=g), torch.randn(B, R, T, HD, generator=g)) for _ in range(L)]
    return raw, q, grad_out


def _grads(router, raw, outs, grad_out):
    loss = sum((k * gk).sum() + (v * gv).sum() for (k, v), (gk, gv) in zip(outs, grad_out))
    params = list(router.parameters()) + [t for kv in raw for t in kv]
    return [torch.zeros_like(p) if g is None else g
            for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))]


def _reference(router, raw, q, sources):
    kbuf = [k.transpose(1, 2) for k, _ in raw]  # raw (B, R, T, Hd)
    vbuf = [v.transpose(1, 2) for _, v in raw]
    ref = REFERENCES[router.kind.name].route
    return [ref(router.weight(l), sorted(sources(l)), kbuf[:l + 1], vbuf[:l + 1], l, q[l].transpose(1, 2))
            for l in range(L)]


def _close(got, want, what):
    for l, (a, b) in enumerate(zip(got, want)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10, msg=f"{what}, layer {l}")


@pytest.mark.parametrize("spec,kind", CASES)
@pytest.mark.parametrize("R", [2, 1])
def test_every_mixer_path_matches_the_kind_reference(spec, kind, R, monkeypatch):
    """Outputs and gradients (inputs and router weights) of the buffer mixer at several block
    sizes, its compile ops run eagerly, and the concatenation; outputs of both no-grad paths."""
    ctx = _registered(spec, _sparse_router(ROUTER_KINDS[kind])) if kind else contextlib.nullcontext()
    with ctx:
        router = build_router(spec, n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
        sources = _every_other if kind else (lambda l: expected_sources(spec, l))
        raw, q, grad_out = _inputs(R)
        want = _reference(router, raw, q, sources)
        want_grads = _grads(router, raw, want, grad_out)
        paths = [("concat", {"routing_impl": "concat"})]
        paths += [(f"buffer block={b}", {"block": b}) for b in (None, 1, 2, 3)]
        if router.kind.learned:
            paths += [(f"ops block={b}", {"block": b, "use_ops": True}) for b in (None, 2)]
        for what, kw in paths:
            m = make_mixer(router, **kw)
            outs = [m.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
            _close(outs, want, what)
            for a, b in zip(_grads(router, raw, outs, grad_out), want_grads):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"{what}: gradient")
        with torch.no_grad():
            for small in (10**9, 0):  # the few-token path and the buffer without autograd
                monkeypatch.setattr(mixers, "SMALL_N", small)
                m = make_mixer(router)
                _close([m.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)], want, f"no-grad SMALL_N={small}")


@pytest.mark.parametrize("spec", router_specs())
@pytest.mark.parametrize("kv", [4, 2])
def test_routing_flops_are_the_kinds(spec, kv):
    """(Parameters: ``test_routers.test_router_parameter_counts``.)"""
    cfg = preset("tiny", router=spec, n_kv_heads=kv, n_layers=5)
    ref = REFERENCES[build_model(cfg).router.kind.name]
    n = [len(expected_sources(spec, l)) for l in range(1, cfg.n_layers)]
    assert flops_per_token(cfg)["routing"] == 2 * sum(ref.macs(k, kv, cfg.head_dim) for k in n)


def test_kind_registration_checks():
    with pytest.raises(TypeError, match="not a RouterKind instance"):
        register_kind(object())
    with pytest.raises(ValueError, match="'linear' is registered already"):
        register_kind(LinearKind())
    before = dict(ROUTERS)

    class Unregistered(Router):
        kind = LinearKind()  # a second instance, not the registered LINEAR

    with pytest.raises(TypeError, match=r"kind must be one of the registered router kinds \(.*identity, .*\), got"):
        register_router("unregistered-kind")(Unregistered)
    assert dict(ROUTERS) == before and ROUTER_KINDS["linear"] is LINEAR


# -- a token-dependent kind, defined here alone -----------------------------------------------------
def _gate(k, v, q):
    """K/V (B, T, R, Hd) scaled per token by sigmoid(mean of the query (B, T, H, Hd)) -> (B, R, T, Hd)."""
    g = torch.sigmoid(q.mean(dim=(2, 3)))[:, :, None, None]  # (B, T, 1, 1)
    return (k * g).transpose(1, 2), (v * g).transpose(1, 2)


class _GateMixer:
    def route(self, l, k, v, q=None, x=None):  # x: the layer's normed input, which this kind ignores
        return (k.transpose(1, 2), v.transpose(1, 2)) if l == 0 else _gate(k, v, q)


class QueryGateKind(RouterKind):
    """Layer l >= 1 reads its own K/V scaled per token by a function of the layer's query: the
    smallest kind whose routing depends on the tokens (layer 0 reads its own K/V, as under every
    kind). Weightless; ``dense`` does not exist for it."""

    name = "query-gate-test"

    def dense(self, router, l):
        raise NotImplementedError("query-gate-test: the mixing depends on the tokens")

    def macs_per_token(self, router, l):
        return 0 if l == 0 else 2 * router.R * router.head_dim  # scaling K and V

    def make_mixer(self, router, *, block=None, use_ops=None):
        return _GateMixer()

    def concat_route(self, router, l, k, v, k_all, v_all, q, x=None):
        return _gate(k, v, q)

    def traffic_slots(self, router, block):
        return 0


def _gate_reference(w, sources, kbuf, vbuf, l, q):  # q: (B, H, T, Hd)
    if l == 0:
        return kbuf[l], vbuf[l]
    g = torch.sigmoid(q.mean(dim=(1, 3)))[:, None, :, None]  # (B, 1, T, 1)
    return kbuf[l] * g, vbuf[l] * g


@pytest.fixture
def query_gate():
    kind = register_kind(QueryGateKind())

    class QueryGate(Router):
        def sources(self, l):
            return [l]

    QueryGate.kind = kind
    try:
        with _registered("query-gate-test", QueryGate):
            yield "query-gate-test"
    finally:
        ROUTER_KINDS.pop(kind.name)


@pytest.mark.parametrize("depth_mix", ["none", "value-residual"])
def test_a_token_dependent_kind_is_one_class(query_gate, depth_mix):
    cfg = preset("tiny", router=query_gate, n_kv_heads=2, depth_mix=depth_mix)
    model = build_model(cfg).double()
    idx = torch.randint(0, 256, (2, 9))
    out = model(idx)
    if depth_mix == "none":  # the layer's pre-RoPE query reaches the mixer
        ref = reference_forward(model, idx, lambda l: [l], route=_gate_reference)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    concat = build_model(cfg.replace(routing_impl="concat")).double()
    concat.load_state_dict(model.state_dict())
    torch.testing.assert_close(concat(idx), out, rtol=1e-12, atol=1e-12)
    out.pow(2).mean().backward()  # trains: gradients reach the query projections through the gate
    assert all(b.attn.wq.weight.grad.abs().sum() > 0 for b in model.blocks)
    model.eval()
    with torch.no_grad():
        cache = KVCache(cfg, 2, 9, idx.device, torch.float64)
        steps = [model(idx[:, :4], cache)] + [model(idx[:, t:t + 1], cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), model(idx), rtol=1e-9, atol=1e-9)
        assert generate(model, idx[:, :3], 4).shape == (2, 7)
    assert param_counts(cfg)["router"] == 0
    assert flops_per_token(cfg)["routing"] == 2 * (cfg.n_layers - 1) * 2 * 2 * cfg.head_dim
