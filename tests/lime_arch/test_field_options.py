"""The 2026 field's options on the existing depth mixes (issue 36, item 3): additive Attention
Residuals (``attn-res-additive[-block-<size>]``, Delta AttnRes), the NanoGPT speedrun's trimmed MUDD
(``mudd-last-<k>``, ``mudd-vr``, ``mudd-vr-last-<k>``) and the symmetry-broken stream init of HC and mHC
(``hyper-connections-asym``, ``mhc-asym``): each against its float64 reference (field_references.py)
to 1e-12, MHA and GQA, with and without the full router; its step-0 behaviour against the none model
of the same seed; its layout and init by hand. The registry-wide behaviour (cache, compile,
optimizer groups, accounting) is in test_depth_mix.py, test_compile.py and test_peer_accounting.py."""
import re

import pytest
import torch
from test_field_mixes import baseline_at_init
from test_peer_reference import REFERENCES

from lime_arch import ConfigError, build_model, preset
from lime_arch.depth_mix import parse_depth_mix
from lime_arch.depth_mix.attn_res import AdditiveAttentionResiduals, AdditiveBlockAttentionResiduals
from lime_arch.depth_mix.mudd import LastLayersMUDDFormer, LastLayersValueResidualMUDDFormer, ValueResidualMUDDFormer


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def tiny(depth_mix, router="none", kv=2, **kw):
    return preset("tiny", depth_mix=depth_mix, router=router, n_kv_heads=kv, **kw)


def _randomise(mix, scale=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mix.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


# At 5 layers (10 sublayers): blocks of 3 sublayers are 3, 3, 3, 1; size 1 is full additive AttnRes, 10 one
# block. mudd-last-1 trims to the last block, -4 (= L - 1) is every block; mudd-vr-last-3 both trims.
SPECS = ["attn-res-additive", "attn-res-additive-block", "attn-res-additive-block-1", "attn-res-additive-block-3",
         "attn-res-additive-block-10", "mudd-last", "mudd-last-1", "mudd-last-4", "mudd-vr", "mudd-vr-last-1",
         "mudd-vr-last-3", "hyper-connections-asym", "hyper-connections-asym-2", "mhc-asym", "mhc-asym-3-2"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", [4, 2])
@pytest.mark.parametrize("router", ["none", "full"])
def test_matches_the_float64_reference(spec, kv, router, f64):
    model = build_model(preset("tiny", router=router, n_kv_heads=kv, n_layers=5, depth_mix=spec))
    _randomise(model.depth_mix)
    idx = torch.randint(0, 256, (2, 9))
    target = torch.randn(2, 9, 256)
    out = model(idx)
    (out * target).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    ref = REFERENCES[parse_depth_mix(spec)[0].name](model, idx).run()
    (ref * target).sum().backward()
    ref_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    # 1e-12 of each tensor's scale: randomised mixing weights give gradients up to ~1e4 (MUDD), whose rounding
    # differences between the vectorised and the looped sums are ~1e-13 of that (measured), 1e-9 in absolute terms
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12 * ref.abs().max().item())
    assert grads.keys() == ref_grads.keys() == {n for n, _ in model.named_parameters()}  # every weight trains
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-12, atol=1e-12 * max(1.0, g.abs().max().item()), msg=n)


# -- additive Attention Residuals ----------------------------------------------------------------
def _sublayer_inputs(model, idx):
    seen = []
    hooks = [norm.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach()))
             for b in model.blocks for norm in (b.attn_norm, b.mlp_norm)]
    with torch.no_grad():
        logits = model(idx)
    for h in hooks:
        h.remove()
    return logits, seen


def test_additive_attn_res_at_init_keeps_the_residual_stream(f64):
    """Zero pseudo-queries: sublayer k >= 1 reads x_k plus the uniform mean of its n_k sources, which sum to x_k,
    so x_k (1 + 1/n_k); sublayer 0 reads the embedding alone and the final norm the plain stream (float64, a
    negligible eps: the two models' sublayers compute the same outputs, and the logits are the baseline's)."""
    idx = torch.randint(0, 256, (2, 9))
    torch.manual_seed(4)
    base_logits, base = _sublayer_inputs(build_model(tiny("none", "full", norm_eps=1e-30)), idx)
    for spec, n in (("attn-res-additive", [None, 2, 3, 4, 5, 6, 7, 8]),
                    ("attn-res-additive-block-3", [None, 2, 2, 2, 3, 3, 3, 4])):  # blocks {0,1,2}, {3,4,5}, {6,7}
        torch.manual_seed(4)
        logits, got = _sublayer_inputs(build_model(tiny(spec, "full", norm_eps=1e-30)), idx)
        for k, (x, h, c) in enumerate(zip(base, got, n)):
            want = x if c is None else x * (1 + 1 / c)
            torch.testing.assert_close(h, want, rtol=1e-12, atol=1e-14, msg=f"{spec} sublayer {k}")
        torch.testing.assert_close(logits, base_logits, rtol=1e-12, atol=1e-12)


def test_additive_attn_res_differs_from_attn_res_in_the_routing_only(f64):
    """Same sources and scores as attn-res, the mixture added to the stream: given attn-res's pseudo-query of
    sublayer 1 (its row 1; the additive mix has no row for sublayer 0), sublayer 1 of the additive model reads
    what attn-res's reads plus x_1 = embedding + sublayer 0's output. 2L - 1 zero pseudo-queries."""
    for spec, cls in (("attn-res-additive", AdditiveAttentionResiduals),
                      ("attn-res-additive-block-3", AdditiveBlockAttentionResiduals)):
        mix = build_model(tiny(spec, n_layers=3)).depth_mix
        assert isinstance(mix, cls) and mix.queries.shape == (5, 64) and not mix.queries.any()
        assert list(mix.readers()) == [1, 2, 3, 4, 5]
    assert list(build_model(tiny("attn-res", n_layers=3)).depth_mix.readers()) == list(range(7))
    torch.manual_seed(2)
    rep = build_model(tiny("attn-res", n_layers=3))
    _randomise(rep.depth_mix)
    torch.manual_seed(2)
    add = build_model(tiny("attn-res-additive", n_layers=3))
    with torch.no_grad():
        add.depth_mix.queries.copy_(rep.depth_mix.queries[1:6])
    idx = torch.randint(0, 256, (2, 7))
    y0 = []
    add.blocks[0].attn.register_forward_hook(lambda _m, _i, o: y0.append(o.detach()))
    _, hr = _sublayer_inputs(rep, idx)
    _, ha = _sublayer_inputs(add, idx)
    emb = add.embed.weight[idx]
    torch.testing.assert_close(ha[0], emb, rtol=0, atol=0)  # sublayer 0: the embedding (attn-res: its mixture)
    torch.testing.assert_close(hr[0], emb, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(ha[1], hr[1] + emb + y0[0], rtol=1e-13, atol=1e-13)


def test_additive_attn_res_bad_size():
    with pytest.raises(ConfigError, match="needs a positive integer for size, got 0"):
        tiny("attn-res-additive-block-0")
    assert parse_depth_mix("attn-res-additive-block") == (AdditiveBlockAttentionResiduals, (4,))


# -- trimmed MUDD ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["mudd-last", "mudd-last-1", "mudd-vr", "mudd-vr-last-2"])
@pytest.mark.parametrize("router", ["none", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_trimmed_mudd_at_init_is_the_baseline_bit_for_bit(spec, router, dtype):
    """The default eps: every mixture is the latest block output exactly (current-only bias, W2 = 0: the
    speedrun's zero-initialised output, reparametrised), the gains are 1, so the logits are the baseline's bit
    for bit; the gradients to rounding (the attention norm's backward runs once per input)."""
    grads = baseline_at_init(tiny, spec, router, dtype)
    mixed = [n for n in grads if n.startswith("depth_mix.") and n.endswith((".w2", "kv_gain"))]
    assert mixed and all(grads[n].abs().sum() > 0 for n in mixed)


def test_trimmed_mudd_layout_by_hand():
    """At 4 layers: mudd-last-2's mixtures feed blocks 2 and 3 (dense weights after blocks 1, 2 and the last);
    mudd-vr has two ways and only g_v; mudd-vr-last-1 feeds block 3 alone. Hidden widths (h // 64 + 1) * 64 of
    ways * sources (x 4 after the last block): all 64 here."""
    cases = {"mudd-last": (LastLayersMUDDFormer, [4, 4, 1], [3, 4, 5], (2, 2, 64)),
             "mudd-last-3": (LastLayersMUDDFormer, [4, 4, 4, 1], [2, 3, 4, 5], (3, 2, 64)),
             "mudd-last-9": (LastLayersMUDDFormer, [4, 4, 4, 1], [2, 3, 4, 5], (3, 2, 64)),
             "mudd-vr": (ValueResidualMUDDFormer, [2, 2, 2, 1], [2, 3, 4, 5], (3, 1, 64)),
             "mudd-vr-last-1": (LastLayersValueResidualMUDDFormer, [2, 1], [4, 5], (1, 1, 64))}
    for spec, (cls, ways, sources, gains) in cases.items():
        mix = build_model(tiny(spec)).depth_mix
        assert isinstance(mix, cls) and mix.ways == ways, spec
        assert [tuple(b.shape) for b in mix.bias] == [(w, s) for w, s in zip(ways, sources)], spec
        assert [tuple(p.w2.shape) for p in mix.proj] == [(64, w * s) for w, s in zip(ways, sources)], spec
        assert tuple(mix.kv_gain.shape) == gains and torch.equal(mix.kv_gain, torch.ones(gains)), spec
        assert all(torch.equal(b, torch.eye(b.shape[1])[-1].expand_as(b)) for b in mix.bias)
    assert parse_depth_mix("mudd-vr-last") == (LastLayersValueResidualMUDDFormer, (2,))
    with pytest.raises(ConfigError, match=re.escape("needs a positive integer for last, got 0")):
        tiny("mudd-last-0")


def test_mudd_last_feeds_only_the_last_blocks(f64):
    """Perturbing mudd-last-2's dense weights leaves blocks 0 and 1 the baseline's: their outputs equal the none
    model's, and block 2's differs."""
    outs = {}
    for spec in ("none", "mudd-last"):
        torch.manual_seed(3)
        model = build_model(tiny(spec))
        if spec != "none":
            _randomise(model.depth_mix)
        seen = []
        for b in model.blocks:
            b.register_forward_hook(lambda _m, _i, o, seen=seen: seen.append(o.detach()))
        model(torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0)))
        outs[spec] = seen
    for l in (0, 1):
        torch.testing.assert_close(outs["mudd-last"][l], outs["none"][l], rtol=0, atol=0)
    assert not torch.allclose(outs["mudd-last"][2], outs["none"][2])


def test_mudd_vr_queries_and_keys_read_the_residual_mixture(f64, monkeypatch):
    """mudd-vr: the attention's query and key read the residual mixture, the one the block adds its output to;
    the values read their own mixture (randomised dense weights: the two differ)."""
    torch.manual_seed(3)
    model = build_model(tiny("mudd-vr"))
    _randomise(model.depth_mix)
    states, q_in, k_in, v_in = [], [], [], []
    mix = model.depth_mix
    original = type(mix).after_block

    def spy(self, l, x, memo):
        out = original(self, l, x, memo)
        states.append(out)
        return out

    monkeypatch.setattr(type(mix), "after_block", spy)
    for b in model.blocks:
        b.attn.wq.register_forward_pre_hook(lambda _m, a: q_in.append(a[0].detach()))
        b.attn.wk.register_forward_pre_hook(lambda _m, a: k_in.append(a[0].detach()))
        b.attn.wv.register_forward_pre_hook(lambda _m, a: v_in.append(a[0].detach()))
    model(torch.randint(0, 256, (2, 8)))
    for l in range(1, 4):
        q, k, v, r = states[l - 1]
        assert q is r and k is r
        norm, g_v = model.blocks[l].attn_norm, mix.kv_gain[l - 1, 0]
        torch.testing.assert_close(q_in[l], norm(r), rtol=0, atol=0)
        torch.testing.assert_close(k_in[l], norm(r), rtol=0, atol=0)
        torch.testing.assert_close(v_in[l], norm(v) * g_v, rtol=0, atol=0)
        assert not torch.allclose(v, r)


# -- symmetry-broken streams ----------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["hyper-connections-asym", "mhc-asym-3"])
def test_asymmetric_streams_start_apart(spec, f64):
    """stream_init "offset": stream i starts as x + p_i, p (n, C) centred over the streams (their sum stays n x)
    with the model's init std; the streams then differ after every block, where "copy" keeps them identical."""
    torch.manual_seed(5)
    model = build_model(tiny(spec, n_layers=3))
    mix, n = model.depth_mix, model.depth_mix.rate
    p = mix.stream_offset
    assert p.shape == (n, 64) and torch.allclose(p.sum(0), torch.zeros(64), atol=1e-15)
    assert 0.5 * model.cfg.std < p.std().item() < 1.5 * model.cfg.std
    x = torch.randn(2, 5, 64)
    H = mix.begin(x, {})
    torch.testing.assert_close(H, x[..., None, :] + p, rtol=0, atol=0)
    torch.testing.assert_close(H.sum(-2), n * x, rtol=1e-14, atol=1e-14)
    for s in (spec, spec.replace("-asym", "")):
        torch.manual_seed(5)
        m = build_model(tiny(s, n_layers=3))
        streams = []
        m.blocks[2].register_forward_hook(lambda _m, _i, o, streams=streams: streams.append(o.detach()))
        m(torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0)))
        spread = (streams[0] - streams[0].mean(-2, keepdim=True)).abs().max().item()
        # copy: identical to rounding; offset: apart (mHC's H_res at init, exp(I) normalised, pulls the streams
        # towards their mean by (e - 1) / (e + n - 1) per sublayer: measured 7e-4 after 3 layers at n = 3)
        assert (spread > 1e-4) if "asym" in s else (spread < 1e-12), (s, spread)


def test_the_default_stream_init_is_unchanged():
    """hyper-connections and mhc keep copying the embedding into every stream: no offsets, the same weights."""
    for spec in ("hyper-connections", "hyper-connections-static", "hyper-connections-corl", "mhc", "mhc-sigmoid",
                 "mhc-readout"):
        mix = build_model(tiny(spec)).depth_mix
        assert mix.stream_init == "copy" and not hasattr(mix, "stream_offset"), spec
        x = torch.randn(2, 3, 64)
        assert torch.equal(mix.begin(x, {}), x[..., None, :].expand(2, 3, mix.rate, 64)), spec


def test_asymmetric_streams_are_not_the_baseline_at_init(f64):
    idx = torch.randint(0, 256, (2, 9))
    out = {}
    for spec in ("none", "hyper-connections-asym", "mhc-asym"):
        torch.manual_seed(3)
        out[spec] = build_model(tiny(spec, norm_eps=1e-30))(idx)
    for spec in ("hyper-connections-asym", "mhc-asym"):
        assert (out[spec] - out["none"]).abs().max() > 1e-3, spec
