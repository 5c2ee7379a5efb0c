"""The fast routing paths (buffer mixer) against the paper's concatenation.

Every registered router (``lime_arch.routers.router_specs``, so new routers are covered), MHA,
GQA and one KV head, several layer-block sizes of the buffer mixer (including none and one per
layer), with autograd and without (the blocked path and the few-token path), and routers whose
``weight(l)`` is computed rather than a parameter. No test asserts a speed."""
import contextlib

import pytest
import torch

from lime_arch import build_model, preset
from lime_arch.routers import (
    ROUTERS,
    FullRouter,
    NoHeadMixRouter,
    PerDimRouter,
    build_router,
    register_router,
    router_specs,
)
from lime_arch.routing import mixers
from lime_arch.routing import plan as routing_plan
from lime_arch.routing.mixers import make_mixer

L, HD, B, T = 9, 4, 2, 3
SPECS = router_specs((2, 4))
BLOCKS = [None, 1, 2, 3, L]


@pytest.fixture(autouse=True)
def _f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


H = 4  # query heads of the layers' queries (read by token-dependent kinds)


def _raw(R, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, T, R, HD, generator=g, requires_grad=True),
             torch.randn(B, T, R, HD, generator=g, requires_grad=True)) for _ in range(L)]


def _query(k: torch.Tensor, l: int) -> torch.Tensor:
    """Layer l's query (B, T, H = R, Hd) for raw K/V like ``k``: the same for every path of a test
    (token-dependent kinds read it; static ones ignore it)."""
    return torch.randn(k.shape, generator=torch.Generator().manual_seed(100 + l), dtype=k.dtype)


def _queries(seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, H, HD, generator=g) for _ in range(L)]


def _run(router, impl, raw, weights, block=None, layers=None):
    """Route all layers; loss = sum of <routed, weight> over ``layers``; gradients of everything."""
    m = make_mixer(router, impl, block=block) if impl == "buffer" else make_mixer(router, impl)
    q = _queries()
    outs = [m.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
    layers = range(L) if layers is None else layers
    loss = sum((outs[l][0] * weights[l][0]).sum() + (outs[l][1] * weights[l][1]).sum() for l in layers)
    params = list(router.parameters()) + [t for kv in raw for t in kv]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    zero = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    return [o.detach() for kv in outs for o in kv], zero


def _weights(R, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, R, T, HD, generator=g), torch.randn(B, R, T, HD, generator=g)) for _ in range(L)]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("R", [4, 2, 1])
def test_buffer_matches_concat_forward_and_gradients(spec, R):
    router = build_router(spec, n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
    raw, w = _raw(R), _weights(R)
    ref_out, ref_grads = _run(router, "concat", raw, w)
    for block in BLOCKS:
        out, grads = _run(router, "buffer", raw, w, block=block)
        for a, b in zip(out, ref_out):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"{spec} block={block}")
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"{spec} block={block}")


@pytest.mark.parametrize("spec", SPECS)
def test_partial_loss_gradients_match(spec):
    """Only some layers' outputs reach the loss: the others' gradient rows stay exactly zero."""
    R = 2
    router = build_router(spec, n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
    raw, w = _raw(R, 3), _weights(R, 4)
    for layers in ([L - 1], [2, 5], [0]):
        _, ref = _run(router, "concat", raw, w, layers=layers)
        for block in (None, 2, 3):
            _, got = _run(router, "buffer", raw, w, block=block, layers=layers)
            for a, b in zip(got, ref):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"{spec} {layers} block={block}")


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("small", [True, False])
def test_no_grad_paths_match(spec, small, monkeypatch):
    """Without autograd: the few-token list path and the blocked buffer path."""
    monkeypatch.setattr(mixers, "SMALL_N", 10**9 if small else 0)
    R = 2
    router = build_router(spec, n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
    raw, q = _raw(R, 5), _queries()
    with torch.no_grad():
        cm = make_mixer(router, "concat")
        ref = [cm.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
        for block in BLOCKS:
            bm = make_mixer(router, block=block)
            got = [bm.route(l, k, v, q=q[l]) for l, (k, v) in enumerate(raw)]
            for (a, b), (c, d) in zip(got, ref):
                torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)
                torch.testing.assert_close(b, d, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", [4, 2])
def test_model_buffer_equals_concat(spec, kv):
    """Whole decoder, 9 layers (so the automatic block size blocks), forward and all gradients."""
    cfg = preset("tiny", router=spec, n_kv_heads=kv, n_layers=L)
    m1 = build_model(cfg).double()
    m2 = build_model(cfg.replace(routing_impl="concat")).double()
    m2.load_state_dict(m1.state_dict())
    idx = torch.randint(0, 256, (2, 7))
    o1, o2 = m1(idx), m2(idx)
    torch.testing.assert_close(o1, o2, rtol=1e-9, atol=1e-9)
    o1.pow(2).sum().backward()
    o2.pow(2).sum().backward()
    for (n, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-8, atol=1e-10, msg=n)


def test_pooled_buffers_never_alias_results():
    """Buffers are reused across passes: earlier outputs and gradients must not change, and two
    graphs alive at once (forward A, forward B, backward B, backward A) must not share them."""
    R = 2
    router = build_router("full", n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
    raw1, raw2, w = _raw(R, 7), _raw(R, 8), _weights(R, 9)
    out1, g1 = _run(router, "buffer", raw1, w, block=3)
    keep = [t.clone() for t in out1 + g1]
    _run(router, "buffer", raw2, w, block=3)
    for a, b in zip(out1 + g1, keep):
        assert torch.equal(a, b)
    _, ref1 = _run(router, "concat", raw1, w)
    _, ref2 = _run(router, "concat", raw2, w)
    ma, mb = make_mixer(router, block=3), make_mixer(router, block=3)
    oa = [ma.route(l, k, v, q=_query(k, l)) for l, (k, v) in enumerate(raw1)]
    ob = [mb.route(l, k, v, q=_query(k, l)) for l, (k, v) in enumerate(raw2)]
    params = lambda raw: list(router.parameters()) + [t for kv in raw for t in kv]  # noqa: E731
    loss = lambda outs: sum((o[0] * x[0]).sum() + (o[1] * x[1]).sum() for o, x in zip(outs, w))  # noqa: E731
    gb = torch.autograd.grad(loss(ob), params(raw2))
    ga = torch.autograd.grad(loss(oa), params(raw1))
    for got, ref in ((ga, ref1), (gb, ref2)):
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_block_choice():
    for spec in ("full", "first-4", "last-4", "dilated-8", "no-head-mix", "per-dim"):
        r = build_router(spec, n_layers=64, n_kv_heads=8, head_dim=32)
        lay = routing_plan.layout_for(r)
        plan = routing_plan.plan_for(r, lay, None)
        assert 1 <= plan.block <= 64 and (plan.block * lay.out_rows <= routing_plan.MAX_BLOCK_ROWS or plan.block == 64)
    full = build_router("full", n_layers=64, n_kv_heads=8, head_dim=32)
    assert 1 < routing_plan.plan_for(full, routing_plan.layout_for(full), None).block < 64  # blocked: about sqrt(L)
    last = build_router("last-4", n_layers=64, n_kv_heads=8, head_dim=32)
    assert routing_plan.plan_for(last, routing_plan.layout_for(last), None).block == 64  # nothing to share


def test_traffic_by_hand():
    """full, 4 layers, sources {0}, {0,1}, {0,1,2}, {0,1,2,3}; counted by hand below.

    Every plan: K/V writes 2 per layer (8), grad_out zero fill 1 per layer (4), per layer >= 1 its
    output, grad_out store (2) and dW (4 each: 12), per slot its gradient (4): 28 fixed slots.
    block 4 (one block, no old slots): in-block sources 2 + 3 + 4 = 9, three reads each: 27.
    block 2: layer 1 has 2 in-block sources; block [2, 3] has members 2 and 3 over old slots
      {0, 1}, with 1 and 2 in-block sources: in-block 3 * 5 = 15, old-slot products
      4 * (2 old slots + 2 members) = 16, and the K/V gradient buffer 2 * 4 = 8.
    block 1: in-block 3 * 3 = 9; members 1, 2, 3 over 1, 2, 3 old slots: 4 * (2 + 3 + 4) = 36; 8."""
    router = build_router("full", n_layers=4, n_kv_heads=2, head_dim=4)
    slot_bytes = 2 * 2 * 3 * 2 * 4 * 4  # K and V of batch 2, 3 tokens, 2 heads of 4, float32
    for block, slots, cost in ((4, 28 + 27, 27 / 2), (2, 28 + 15 + 16 + 8, 15 / 2 + 16 + 2),
                               (1, 28 + 9 + 36 + 8, 9 / 2 + 36 + 3 * 2)):
        plan = routing_plan.plan_for(router, routing_plan.layout_for(router), block)
        assert plan.traffic().slots == slots, block
        assert plan.traffic().block_cost() == cost, block
        assert routing_plan.step_traffic(router, 2, 3, 4, block=block) == (slots, slots * slot_bytes)
    # the chooser takes the least cost among 1, 2, 3, 4; block 3 costs 6 * 1.5 + 4 * (3 + 1) + 2 = 27
    assert routing_plan.plan_for(router, routing_plan.layout_for(router), None).block == 4
    assert routing_plan.step_traffic(router, 2, 3, 4) == (55, 55 * slot_bytes)
    per_dim = build_router("per-dim", n_layers=4, n_kv_heads=2, head_dim=4)  # + 4 layout copies per layer >= 1
    assert routing_plan.step_traffic(per_dim, 2, 3, 4, block=4) == (55 + 12, (55 + 12) * slot_bytes)
    same_head = build_router("no-head-mix", n_layers=4, n_kv_heads=2, head_dim=4)  # same slots, other layout
    assert routing_plan.step_traffic(same_head, 2, 3, 2, block=2) == (67, 67 * slot_bytes // 2)
    assert routing_plan.step_traffic(build_router("none", n_layers=4, n_kv_heads=2, head_dim=4), 2, 3) == (0, 0)
    mean = build_router("average", n_layers=4, n_kv_heads=2, head_dim=4)
    assert routing_plan.step_traffic(mean, 2, 3) == (40, 40 * slot_bytes)


@contextlib.contextmanager
def _registered(name: str, cls: type):
    register_router(name)(cls)
    try:
        yield cls
    finally:
        ROUTERS.pop(name)


def _softmax_router(base: type) -> type:
    """A router of ``base``'s kind whose weight is computed: a softmax over the sources' columns."""

    class Softmax(base):
        def weight(self, l):
            w = super().weight(l)
            return None if w is None else torch.softmax(w, dim=1)

    return Softmax


@pytest.mark.parametrize("base", [FullRouter, NoHeadMixRouter, PerDimRouter])
@pytest.mark.parametrize("R", [2, 1])
def test_computed_weight_routes_through_weight(base, R, monkeypatch):
    """A router that overrides ``weight`` with a computed tensor: the buffer mixer (every block
    size, with and without autograd) matches the concatenation reference, which multiplies
    ``dense(l)`` built from the same ``weight(l)``; and the result is not the raw parameter's."""
    with _registered("softmax-test", _softmax_router(base)):
        router = build_router("softmax-test", n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
        raw, w = _raw(R, 11), _weights(R, 12)
        ref_out, ref_grads = _run(router, "concat", raw, w)
        for block in BLOCKS:
            out, grads = _run(router, "buffer", raw, w, block=block)
            for a, b in zip(out, ref_out):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"block={block}")
            for a, b in zip(grads, ref_grads):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"block={block}")
        with torch.no_grad():
            for small in (10**9, 0):  # the few-token path and the blocked buffer
                monkeypatch.setattr(mixers, "SMALL_N", small)
                m = make_mixer(router)
                got = [m.route(l, k, v, q=_query(k, l))[0] for l, (k, v) in enumerate(raw)]
                for a, b in zip(got, ref_out[0::2]):
                    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    plain = base(n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
    plain.load_state_dict(router.state_dict())
    plain_out, _ = _run(plain, "buffer", raw, w)
    assert not torch.allclose(plain_out[-1], ref_out[-1])


def test_weight_of_the_wrong_shape_is_refused():
    class Wide(FullRouter):
        def weight(self, l):
            w = super().weight(l)
            return None if w is None else torch.cat((w, w), dim=1)

    with _registered("wide-test", Wide):
        router = build_router("wide-test", n_layers=3, n_kv_heads=2, head_dim=HD)
        with pytest.raises(ValueError, match=r"weight\(1\) has shape \(2, 8\); kind linear multiplies \(2, 4\)"):
            make_mixer(router)


@pytest.mark.parametrize("spec", ["full", "no-head-mix", "per-dim"])
def test_weight_updates_and_dtype_changes_are_seen(spec):
    """Memoised weight views follow in-place updates (optimizer steps) and ``.data`` swaps."""
    cfg = preset("tiny", router=spec, n_kv_heads=2, n_layers=L)
    m1 = build_model(cfg).float()
    idx = torch.randint(0, 256, (2, 5))
    m1(idx).sum().backward()  # memoises float views
    m1 = m1.double()  # replaces every parameter's .data
    m2 = build_model(cfg.replace(routing_impl="concat")).double()
    m2.load_state_dict(m1.state_dict())
    torch.testing.assert_close(m1(idx), m2(idx), rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(m1(idx), m2(idx), rtol=1e-9, atol=1e-9)  # few-token path, memoised
        for p1, p2 in zip(m1.router.parameters(), m2.router.parameters()):
            p1.add_(0.5)
            p2.add_(0.5)
    torch.testing.assert_close(m1(idx), m2(idx), rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(m1(idx), m2(idx), rtol=1e-9, atol=1e-9)


def test_decoding_routers_alternately_share_no_state():
    """The few-token path pools its slot tensor across passes: two routers with the same shapes,
    decoding in turns, each still match their concatenation reference."""
    idx = torch.randint(0, 256, (3, 1))
    pairs = []
    for spec in ("full", "first-2", "last-2"):
        cfg = preset("tiny", router=spec, n_layers=L)
        a = build_model(cfg).double()
        b = build_model(cfg.replace(routing_impl="concat")).double()
        b.load_state_dict(a.state_dict())
        pairs.append((a, b))
    with torch.no_grad():
        for _ in range(2):
            for a, b in pairs:
                torch.testing.assert_close(a(idx), b(idx), rtol=1e-9, atol=1e-9)




def test_dtype_casts_keep_the_rope_tables_exact():
    """.to(bf16)/.float() cast floating buffers; the RoPE angles must stay float64 (cast per use).
    Before this, a float model moved to float64 differed from a float64 one by ~1e-7 relative."""
    from lime_arch.model import rope_cache

    cfg = preset("tiny")
    cos, sin = rope_cache(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.float(), lambda m: m.float().double()):
        m = cast(build_model(cfg))
        assert m.rope_cos.dtype == torch.float64 and torch.equal(m.rope_cos, cos) and torch.equal(m.rope_sin, sin)
