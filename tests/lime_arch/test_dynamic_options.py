"""The dynamic router's forms (``model.router_dynamic``: scores from the query or the normed hidden
state, a softmax over layers x heads or over layers, the gate on or off, weight decay): every form
against the float64 reference of ``dynamic_reference.py`` (logits and every gradient, MHA and
GQA), the per-token mixing against the mixer, the KV cache and the concatenation peer, the
optimizer groups, the parameter/FLOP/memory accounting by hand, and the config's one-line errors."""
import pytest
import torch
from dynamic_reference import DEFAULT, FORMS, PAPER, V1, counts, options, route
from model_reference import reference_forward, saved_bytes
from routers_expected import expected_sources

from lime_arch import ConfigError, build_model, flops_per_token, param_counts, param_groups, preset, routing_memory
from lime_arch.model import KVCache
from lime_arch.routers import build_router
from lime_arch.routing.mixers import make_mixer
from lime_arch.routing.options import DynamicRouting

SPECS = ["dynamic", "dynamic-first-2"]  # all of 0..l, and non-contiguous sources {0, 1, l}


def _ids(form):
    return "-".join([form[0], form[1], "gate" if form[2] else "nogate"])


def _cfg(spec, form, kv, **kw):
    return preset("tiny", router=spec, n_kv_heads=kv, router_dynamic=options(form), **kw)


def _randomise(router, form, seed=3):
    """Keys of unit scale (weights far from uniform) and gates strictly inside (0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in router.weights:
            w.normal_(0.0, 1.0 if form[0] == "query" else 0.3, generator=g)
            if form[2]:
                w[:, -1].uniform_(0.2, 0.8, generator=g)


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("form", FORMS, ids=_ids)
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", [4, 2])
def test_every_form_against_the_reference(f64, form, spec, kv):
    model = build_model(_cfg(spec, form, kv))
    _randomise(model.router, form)
    idx = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(1))
    target = torch.randn(2, 10, 256, generator=torch.Generator().manual_seed(2))
    out = model(idx)
    (out * target).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ref = reference_forward(model, idx, lambda l: expected_sources(spec, l), route=route(form))
    (ref * target).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-11, atol=1e-12, msg=n)


@pytest.mark.parametrize("form", FORMS, ids=_ids)
def test_cached_decoding_and_concat_equal_the_full_forward(f64, form):
    cfg = _cfg("dynamic-last-2", form, 2)
    model = build_model(cfg)
    _randomise(model.router, form)
    model.eval()
    idx = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(cfg, 2, 9, idx.device, torch.float64)
        steps = [model(idx[:, :4], cache)] + [model(idx[:, t:t + 1], cache) for t in range(4, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-12, atol=1e-12)
        concat = build_model(cfg.replace(routing_impl="concat"))
        concat.load_state_dict(model.state_dict())
        torch.testing.assert_close(concat(idx), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS, ids=_ids)
@pytest.mark.parametrize("R", [2, 1])
def test_token_mixing_is_what_the_mixer_applies(f64, form, R):
    """Per token, routed K/V = token_mixing(l, q, x) @ [K/V of layers 0..l], rows summing to 1; at a
    zero score input it is dense(l), which reads only the sources (layers: head h of each)."""
    L, B, T, H, Hd, D = 4, 2, 3, 4, 8, 12
    router = build_router("dynamic-first-2", n_layers=L, n_kv_heads=R, head_dim=Hd, init="paper",
                          options=DynamicRouting(**options(form)), d_model=D)
    _randomise(router, form)
    g = torch.Generator().manual_seed(0)
    raw = [(torch.randn(B, T, R, Hd, generator=g), torch.randn(B, T, R, Hd, generator=g)) for _ in range(L)]
    q = [torch.randn(B, T, H, Hd, generator=g) for _ in range(L)]
    x = [torch.randn(B, T, D, generator=g) for _ in range(L)]
    m = make_mixer(router)
    outs = [m.route(l, k, v, q=q[l], x=x[l]) for l, (k, v) in enumerate(raw)]
    for l in range(L):
        a = router.kind.token_mixing(router, l, q[l], x=x[l])  # (B, T, R, (l+1)R)
        k_all = torch.cat([k for k, _ in raw[:l + 1]], dim=2)
        v_all = torch.cat([v for _, v in raw[:l + 1]], dim=2)
        torch.testing.assert_close(outs[l][0], torch.einsum("btrc,btcd->brtd", a, k_all), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(outs[l][1], torch.einsum("btrc,btcd->brtd", a, v_all), rtol=1e-12, atol=1e-12)
        if l:
            torch.testing.assert_close(a.sum(-1), torch.ones(B, T, R))
            zero = router.kind.token_mixing(router, l, torch.zeros_like(q[l]), x=torch.zeros_like(x[l]))
            d = router.dense(l)
            torch.testing.assert_close(zero[0, 0], d)
            read = {s for s in range(l + 1) if d[:, s * R:(s + 1) * R].abs().sum() > 0}
            assert read <= set(router.sources(l))
            if form[1] == "layers":  # head h reads head h only: a diagonal per source
                for s in router.sources(l):
                    blk = d[:, s * R:(s + 1) * R]
                    torch.testing.assert_close(blk, torch.diag(torch.diagonal(blk)))


@pytest.mark.parametrize("form", FORMS, ids=_ids)
@pytest.mark.parametrize("kv", [4, 2])
def test_parameters_and_flops_by_hand(form, kv):
    """Per layer l >= 1 (reading l + 1 slots): R (m E + gate) parameters and R m E + 2 R m Hd MACs,
    m = (l+1)R (layers x heads) or l+1 (layers), E = Hd (query) or D (hidden)."""
    cfg = _cfg("dynamic", form, kv)
    R, Hd, D, L = cfg.kv_heads, cfg.head_dim, cfg.d_model, cfg.n_layers
    per_layer = [counts(form, l + 1, R, Hd, D) for l in range(1, L)]
    assert param_counts(cfg)["router"] == sum(p for p, _ in per_layer)
    assert flops_per_token(cfg)["routing"] == 2 * sum(m for _, m in per_layer)
    assert sum(p.numel() for p in build_model(cfg).router.parameters()) == param_counts(cfg)["router"]


def test_v1_counts_pinned():
    """The v1 form at the tiny preset (D 64, 4 layers, Hd 16) with 2 KV heads, by hand: layer l has
    one key of D per routed head and source layer, 2 (l+1) 64 parameters: 2*64*(2+3+4) = 1152; MACs
    2 (l+1) 64 for the scores and 2*2 (l+1) 16 for K and V: 192 * 9 = 1728 per token, 3456 FLOPs.
    Today's default at the same shape: 2 ((l+1) 2 16 + 1) per layer = 64*9 + 6 = 582 parameters."""
    assert param_counts(_cfg("dynamic", V1, 2))["router"] == 1152
    assert flops_per_token(_cfg("dynamic", V1, 2))["routing"] == 3456
    assert param_counts(preset("tiny", router="dynamic", n_kv_heads=2))["router"] == 582
    assert param_counts(_cfg("dynamic", DEFAULT, 2)) == param_counts(preset("tiny", router="dynamic", n_kv_heads=2))
    # docs/MODEL.md's 1b figures: sum over l = 1..15 of (l+1) = 135 source layers; default R (135 R Hd + 15
    # gates), v1 R 135 D (one D-wide key per routed head and source layer)
    for name, R in (("1b", 32), ("1b-gqa", 8)):
        assert param_counts(preset(name, router="dynamic"))["router"] == R * (135 * R * 64 + 15)
        assert param_counts(preset(name, router="dynamic", router_dynamic=options(V1)))["router"] == R * 135 * 2048
    assert (32 * (135 * 32 * 64 + 15), 8 * (135 * 8 * 64 + 15), 32 * 135 * 2048, 8 * 135 * 2048) == (
        8_847_840, 553_080, 8_847_360, 2_211_840)


@pytest.mark.parametrize("form", [V1, PAPER, DEFAULT], ids=_ids)
def test_init(form):
    """Keys U(-1/sqrt(E), 1/sqrt(E)) (nn.Linear's default for E inputs: v1's projection); the gate
    at 1 under paper, 0 under identity; without the gate the parameter is the keys alone."""
    for init in ("paper", "identity") if form[2] else ("paper",):
        torch.manual_seed(0)
        model = build_model(preset("tiny", router="dynamic", router_init=init, router_dynamic=options(form)))
        E = model.cfg.d_model if form[0] == "hidden" else model.cfg.head_dim
        for w in model.router.weights:
            keys = w[:, :-1] if form[2] else w
            assert keys.abs().max() <= E ** -0.5 and keys.abs().max() > 0.9 * E ** -0.5
            if form[2]:
                assert torch.equal(w[:, -1], torch.full_like(w[:, -1], 1.0 if init == "paper" else 0.0))


@pytest.mark.parametrize("decay", [False, True])
def test_weight_decay_group(decay):
    """weight_decay: the router's parameters move to group ``router_decay`` (the router's LR, the base
    decay), as v1 decays its dynamic projection; off: group ``router``, no decay."""
    model = build_model(preset("tiny", router="dynamic", router_dynamic=options(V1, weight_decay=decay)))
    groups = {g["name"]: g for g in param_groups(model, lr=1e-3, weight_decay=0.1, router_lr_mult=10)}
    router_ids = {id(p) for p in model.router.parameters()}
    name = "router_decay" if decay else "router"
    assert {id(p) for p in groups[name]["params"]} == router_ids
    assert groups[name]["lr"] == pytest.approx(1e-2) and groups[name]["weight_decay"] == (0.1 if decay else 0.0)
    assert ("router" if decay else "router_decay") not in groups
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))


@pytest.mark.parametrize("form", [V1, DEFAULT], ids=_ids)
def test_kept_memory_is_the_accounted(form):
    """What a training forward saves for backward, this form minus none, against ``routing_memory``'s
    ``kept`` within 5% (hidden scores keep no grouped query: the projections keep the input anyway)."""
    cfg = _cfg("dynamic", form, 2, n_layers=6)
    idx = torch.randint(0, 256, (2, 32))

    got = saved_bytes(cfg, idx) - saved_bytes(preset("tiny", router="none", n_kv_heads=2, n_layers=6), idx)
    want = routing_memory(cfg, 2, 32)["kept"]
    assert abs(got - want) <= 0.05 * want, (got, want)


@pytest.mark.parametrize("value,message", [
    ({"scores": "keys"}, "model.router_dynamic.scores: 'keys' is not one of query, hidden"),
    ({"softmax": "heads"}, "model.router_dynamic.softmax: 'heads' is not one of layers-heads, layers"),
    ({"gate": "no"}, "model.router_dynamic.gate: must be true or false, got 'no'"),
    ({"weight_decay": 1}, "model.router_dynamic.weight_decay: must be true or false, got 1"),
    ({"decay": True}, "model.router_dynamic.decay: unknown key; allowed: scores, softmax, gate, weight_decay"),
    ("v1", "model.router_dynamic: must be a mapping with keys scores, softmax, gate, weight_decay or null"),
])
def test_config_errors(value, message):
    with pytest.raises(ConfigError) as e:
        preset("tiny", router="dynamic", router_dynamic=value)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_config_errors_across_fields():
    with pytest.raises(ConfigError, match=r"^model\.router_dynamic: router 'full' \(kind linear\) has no dynamic"):
        preset("tiny", router="full", router_dynamic={"gate": False})
    with pytest.raises(ConfigError, match=r"^model\.router_dynamic\.gate: false has no identity init"):
        preset("tiny", router="dynamic", router_init="identity", router_dynamic={"gate": False})
    cfg = preset("tiny", router="dynamic-last-2", router_dynamic=options(V1, weight_decay=True))
    assert cfg.router_dynamic == DynamicRouting(scores="hidden", softmax="layers", gate=False, weight_decay=True)
    assert cfg.to_dict()["router_dynamic"] == options(V1, weight_decay=True)  # a mapping in MLflow params
    assert cfg.replace(n_layers=3).router_dynamic == cfg.router_dynamic  # round trip through the dict
    assert preset("tiny", router="dynamic").router_dynamic is None  # absent: the defaults, as before
