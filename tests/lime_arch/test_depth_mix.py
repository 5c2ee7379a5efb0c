"""The depth-mix axis: the registry and its spec strings, and the behaviour every registered entry
must have (parametrized over the registry, so a new entry is covered without naming it): causal,
cached decoding equal to the full forward with several routers, the same shared weights and RNG
stream as the none model of the same seed, the baseline at step 0 where the entry says so, and
its parameters in the right optimizer groups."""
import pytest
import torch

import lime_arch.depth_mix.registry as registry_mod
from lime_arch import ConfigError, build_model, param_counts, param_groups, preset
from lime_arch.depth_mix import (
    DEPTH_MIXES,
    DepthMix,
    MixArg,
    build_depth_mix,
    depth_mix_specs,
    parse_depth_mix,
    register_depth_mix,
)
from lime_arch.depth_mix.peers import DenseFormer, HyperConnections, StaticHyperConnections
from lime_arch.generate import generate
from lime_arch.model import KVCache

SPECS = depth_mix_specs()
ROUTERS = ["none", "full", "first-2", "no-head-mix", "per-dim"]


def tiny(depth_mix, router="none", kv=4, **kw):
    return preset("tiny", depth_mix=depth_mix, router=router, n_kv_heads=kv, **kw)


# -- the registry -------------------------------------------------------------------------------
def test_registry_lists_the_paper_peers_and_the_field_in_order():
    assert SPECS == ["none", "denseformer", "hyper-connections", "hyper-connections-static", "hyper-connections-corl",
                     "hyper-connections-asym", "value-residual", "value-residual-learned", "attn-res", "attn-res-block",
                     "attn-res-additive", "attn-res-additive-block", "gated-residual", "mhc", "mhc-sigmoid",
                     "mhc-readout", "mhc-asym", "mudd", "mudd-last", "mudd-vr", "mudd-vr-last"]


@pytest.mark.parametrize("spec,cls,args", [
    ("denseformer", DenseFormer, (1, 1)), ("denseformer-2", DenseFormer, (2, 1)),
    ("denseformer-2-3", DenseFormer, (2, 3)), ("hyper-connections", HyperConnections, (4,)),
    ("hyper-connections-2", HyperConnections, (2,)), ("hyper-connections-static", StaticHyperConnections, (4,)),
    ("hyper-connections-static-8", StaticHyperConnections, (8,))])
def test_spec_strings_and_defaults(spec, cls, args):
    assert parse_depth_mix(spec) == (cls, args)
    mix = build_depth_mix(spec, n_layers=4, d_model=8, n_heads=2, n_kv_heads=2, head_dim=4, norm_eps=1e-5, std=0.1)
    assert mix.arg_values == args and mix.spec == "-".join([cls.name, *map(str, args)])


@pytest.mark.parametrize("spec,message", [
    ("densformer", "model.depth_mix: unknown depth mix 'densformer'; registered: none, "
                   "denseformer[-<dilation>[-<period>]], hyper-connections[-<rate>], "
                   "hyper-connections-static[-<rate>], hyper-connections-corl[-<rate>], "
                   "hyper-connections-asym[-<rate>], value-residual, value-residual-learned, attn-res, "
                   "attn-res-block[-<size>], attn-res-additive, attn-res-additive-block[-<size>], "
                   "gated-residual[-<rate>[-<rank>]], "
                   "mhc[-<rate>[-<iters>[-<post_gain>]]], mhc-sigmoid[-<rate>[-<iters>[-<post_gain>]]], "
                   "mhc-readout[-<rate>[-<iters>[-<post_gain>]]], mhc-asym[-<rate>[-<iters>[-<post_gain>]]], "
                   "mudd, mudd-last[-<last>], mudd-vr, mudd-vr-last[-<last>]"),
    ("denseformer-0", "model.depth_mix: 'denseformer-0' needs a positive integer for dilation, got 0"),
    ("denseformer-1-0", "model.depth_mix: 'denseformer-1-0' needs a positive integer for period, got 0"),
    ("denseformer-1.5", "model.depth_mix: 'denseformer-1.5' needs a positive integer for dilation, got 1.5"),
    ("denseformer-1-2-3", "model.depth_mix: 'denseformer-1-2-3': denseformer takes at most 2 argument(s), "
                          "denseformer[-<dilation>[-<period>]]; registered: "),
    ("denseformer-1-8", "model.depth_mix: 'denseformer-1-8': period 8 exceeds model.n_layers=4: no DWA would run"),
    ("value-residual-2", "model.depth_mix: unknown depth mix 'value-residual-2'; registered: "),
    ("hyper-connections-x", "model.depth_mix: unknown depth mix 'hyper-connections-x'"),
    (3, "model.depth_mix: must be a string, got 3; registered: none, "),
])
def test_bad_specs_are_one_line_config_errors(spec, message):
    with pytest.raises(ConfigError) as e:
        preset("tiny", depth_mix=spec)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_registration_checks_the_class(monkeypatch):
    monkeypatch.setattr(registry_mod, "DEPTH_MIXES", DEPTH_MIXES.copy())
    with pytest.raises(ValueError, match="registered already"):
        register_depth_mix("denseformer")(type("X", (DepthMix,), {}))
    with pytest.raises(ValueError, match="lowercase words"):
        register_depth_mix("Mix-2")(type("X", (DepthMix,), {}))
    with pytest.raises(TypeError, match="not a subclass of DepthMix"):
        register_depth_mix("plain")(type("X", (), {}))
    with pytest.raises(ValueError, match="positive int default"):
        register_depth_mix("bad-default")(type("X", (DepthMix,), {"arguments": (MixArg("k", 0),)}))
    with pytest.raises(ValueError, match="not a free identifier"):
        register_depth_mix("bad-arg")(type("X", (DepthMix,), {"arguments": (MixArg("std", 2),)}))


def test_a_new_depth_mix_is_one_class_and_one_registration(monkeypatch):
    """A scaled residual, x + s_k f(x) with learned s (init 1): registered here, it builds, trains,
    decodes from the cache and is counted, without any other code knowing its name."""
    monkeypatch.setattr(registry_mod, "DEPTH_MIXES", DEPTH_MIXES.copy())

    @register_depth_mix("scaled-residual")
    class ScaledResidual(DepthMix):
        arguments = (MixArg("init", 1.0, float),)

        def __init__(self, **kw):
            super().__init__(**kw)
            self.s = torch.nn.Parameter(torch.full((2 * self.n_layers,), self.init))

        def sublayer(self, k, x, fn, memo):
            return x + self.s[k] * fn(x)

    cfg = tiny("scaled-residual-0.5")
    model = build_model(cfg).double().eval()
    assert isinstance(model.depth_mix, ScaledResidual) and model.depth_mix.init == 0.5
    assert param_counts(cfg)["depth_mix"] == 8 == param_counts(cfg)["total"] - param_counts(tiny("none"))["total"]
    _check_cache(model)
    groups = {g["name"]: g["params"] for g in param_groups(model, lr=1e-3, weight_decay=0.1)}
    assert groups["depth_mix"] == [model.depth_mix.s]
    assert "scaled-residual" not in DEPTH_MIXES  # the real registry is untouched


# -- every registered entry -----------------------------------------------------------------------
def _check_cache(model, B=2, T=11, prompt=5):
    idx = torch.randint(0, model.cfg.vocab_size, (B, T))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(model.cfg, B, T, idx.device, next(model.parameters()).dtype)
        steps = [model(idx[:, :prompt], cache)] + [model(idx[:, t:t + 1], cache) for t in range(prompt, T)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)


def _randomise(model):
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.depth_mix.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("router", ROUTERS)
def test_causal_and_cached_decoding_equals_full_forward(spec, router):
    torch.set_default_dtype(torch.float64)
    try:
        model = build_model(tiny(spec, router, kv=2)).eval()
        _randomise(model)
        x = torch.randint(0, 256, (2, 12))
        x2 = x.clone()
        x2[:, 7:] = torch.randint(0, 256, (2, 5))
        with torch.no_grad():
            y, y2 = model(x), model(x2)
        torch.testing.assert_close(y[:, :7], y2[:, :7], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(y[:, 7:], y2[:, 7:])
        _check_cache(model)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("spec", SPECS)
def test_mha_cache_and_generate(spec):
    torch.set_default_dtype(torch.float64)
    try:
        model = build_model(tiny(spec, "first-2", kv=4)).eval()
        _randomise(model)
        _check_cache(model)
        idx = torch.randint(0, 256, (2, 5))
        out, seq = generate(model, idx, 5), idx
        for _ in range(5):
            seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], 1)
        assert torch.equal(out, seq)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("router", ["none", "full"])
def test_shared_weights_and_rng_stream_equal_the_none_model(spec, router):
    torch.manual_seed(5)
    base = build_model(tiny("none", router))
    after_base = torch.get_rng_state()
    torch.manual_seed(5)
    peer = build_model(tiny(spec, router))
    assert torch.equal(torch.get_rng_state(), after_base)  # later draws (data, dropout) stay paired
    peer_params = dict(peer.named_parameters())
    for n, p in base.named_parameters():
        assert torch.equal(p, peer_params[n]), n
    assert all(n.startswith("depth_mix.") for n in set(peer_params) - dict(base.named_parameters()).keys())


@pytest.mark.parametrize("spec", [s for s in SPECS if DEPTH_MIXES[s].baseline_at_init])
@pytest.mark.parametrize("router", ["none", "full"])
def test_baseline_at_init(spec, router):
    """Same seed, float64, a negligible norm eps (HC's final norm sees n x; see its docstring):
    logits and every shared weight's gradient equal the none model's."""
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(3)
        base = build_model(tiny("none", router, kv=2, norm_eps=1e-30))
        torch.manual_seed(3)
        peer = build_model(tiny(spec, router, kv=2, norm_eps=1e-30))
        idx = torch.randint(0, 256, (2, 10))
        target = torch.randn(2, 10, 256)
        out_b, out_p = base(idx), peer(idx)
        torch.testing.assert_close(out_p, out_b, rtol=1e-12, atol=1e-12)
        (out_b * target).sum().backward()
        (out_p * target).sum().backward()
        grads = {n: p.grad for n, p in peer.named_parameters()}
        for n, p in base.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-10, atol=1e-12, msg=n)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("spec", SPECS)
def test_parameter_groups(spec):
    model = build_model(tiny(spec, "full"))
    groups = {g["name"]: g for g in param_groups(model, lr=1e-3, weight_decay=0.1, router_lr_mult=10)}
    where = {id(p): name for name, g in groups.items() for p in g["params"]}
    params = list(model.named_parameters())
    assert len(where) == len(params) == sum(len(g["params"]) for g in groups.values())  # each exactly once
    mix = [(n, p) for n, p in params if n.startswith("depth_mix.")]
    for n, p in mix:
        # HC's and mHC's dynamic projections, and mhc-readout's readout projection, are matrices: they decay
        expect = "decay" if n.startswith("depth_mix.proj.") or n == "depth_mix.readout_proj" else "depth_mix"
        assert where[id(p)] == expect, n
    if any(where[id(p)] == "depth_mix" for _, p in mix):
        assert groups["depth_mix"]["weight_decay"] == 0.0 and groups["depth_mix"]["lr"] == 1e-3
    assert "depth_mix" in groups or not mix or all(where[id(p)] == "decay" for _, p in mix)
    assert groups["router"]["lr"] == pytest.approx(1e-2)


@pytest.mark.parametrize("spec", SPECS)
def test_accounting_counts_the_model_it_builds(spec):
    cfg = tiny(spec, "first-2", kv=2)
    model = build_model(cfg)
    counts = param_counts(cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["depth_mix"] == sum(p.numel() for p in model.depth_mix.parameters())


# -- the paper's exactness statements, bit for bit ----------------------------------------------
def _hidden(model, idx):
    outs = []
    hooks = [b.register_forward_hook(lambda _m, _i, o: outs.append(o.detach())) for b in model.blocks]
    with torch.no_grad():
        logits = model(idx)
    for h in hooks:
        h.remove()
    return logits, outs


@pytest.mark.parametrize("router", ["none", "full", "per-dim"])
def test_denseformer_at_init_is_the_baseline_bit_for_bit(router):
    """fp32, the default eps: a_{i,i} = 1 and zeros elsewhere give exactly the baseline's logits
    and gradients of every shared weight."""
    torch.manual_seed(4)
    base = build_model(tiny("none", router, kv=2, n_layers=6))
    torch.manual_seed(4)
    peer = build_model(tiny("denseformer", router, kv=2, n_layers=6))
    idx = torch.randint(0, 256, (2, 10))
    out_b, out_p = base(idx), peer(idx)
    assert torch.equal(out_b, out_p)
    out_b.square().sum().backward()
    out_p.square().sum().backward()
    grads = {n: p.grad for n, p in peer.named_parameters()}
    for n, p in base.named_parameters():
        assert torch.equal(p.grad, grads[n]), n


@pytest.mark.parametrize("spec", ["hyper-connections", "hyper-connections-static", "hyper-connections-3"])
def test_hyper_connections_at_init(spec):
    """fp32, the default eps: after every block each of the n streams is the baseline's residual
    stream bit for bit. The final norm sees the streams' sum n x, so (float64) the logits are the
    baseline's with the final norm's eps divided by n^2, RMSNorm(n x, eps) = RMSNorm(x, eps / n^2);
    their distance to the baseline's is eps (1 - 1/n^2) / (2 mean(x^2)) relative, to first order."""
    torch.manual_seed(6)
    base = build_model(tiny("none", "full", kv=2))
    torch.manual_seed(6)
    peer = build_model(tiny(spec, "full", kv=2))
    n = peer.depth_mix.rate
    idx = torch.randint(0, 256, (2, 10))
    _, hb = _hidden(base, idx)
    _, hp = _hidden(peer, idx)
    for l, (xb, xp) in enumerate(zip(hb, hp)):
        assert xp.shape == (2, 10, n, 64)
        for i in range(n):
            assert torch.equal(xp[:, :, i], xb), (l, i)
    base, peer = base.double(), peer.double()
    lb, hb = _hidden(base, idx)
    lp, _ = _hidden(peer, idx)
    x, eps = hb[-1], base.cfg.norm_eps
    expect = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps / n**2) * base.norm.weight @ base.embed.weight.T
    torch.testing.assert_close(lp, expect, rtol=1e-12, atol=1e-12)
    rel = eps * (1 - 1 / n**2) / (2 * x.pow(2).mean(-1, keepdim=True))  # (B, T, 1)
    assert torch.all((lp - lb).abs() <= 1.01 * rel * lb.abs() + 1e-12)
    assert not torch.equal(lp, lb)


def test_learned_value_residual_starts_at_the_basic_one():
    torch.manual_seed(7)
    a = build_model(tiny("value-residual", "full"))
    torch.manual_seed(7)
    b = build_model(tiny("value-residual-learned", "full"))
    idx = torch.randint(0, 256, (2, 8))
    assert torch.equal(a(idx), b(idx))
