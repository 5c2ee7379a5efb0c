"""Router maps, routes and the logit lens of router keys (``orchestrator.analysis.routes``) against
hand-built routers and numpy recomputations."""
import math

import numpy as np
import pytest
import torch

from lime_arch import build_model, preset
from orchestrator.analysis.capture import capture
from orchestrator.analysis.routes import mixing_maps, nearest_tokens, routes_markdown, strongest_routes
from orchestrator.engine.data.corpus import ByteTokenizer

TOK = ByteTokenizer()


def _ids(seed=0, n=3, T=12):
    return torch.randint(0, 256, (n, T), generator=torch.Generator().manual_seed(seed))


def _dynamic(kv=2, seed=0, gate=1.0, spec="dynamic"):
    torch.manual_seed(seed)
    model = build_model(preset("tiny", router=spec, n_kv_heads=kv, vocab_size=256)).double()
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for w in model.router.weights:
            w[:, :-1].normal_(0.0, 2.0, generator=g)  # keys far from uniform
            w[:, -1] = gate
    return model


def _weights_by_hand(model, x):
    """Per layer l >= 1 the per-token dense mixing (N, T, R, (l+1)R) recomputed in numpy from the
    captured queries: softmax over the sources of qbar . key / sqrt(Hd), times the gate, plus
    (1 - gate) on the layer's own heads."""
    cfg = model.cfg
    H, R, Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    with torch.no_grad(), capture(model) as st:
        model(x)
    out = {}
    for l in range(1, cfg.n_layers):
        q = st["queries"][l].numpy()  # (N, T, H, Hd)
        qbar = q.reshape(*q.shape[:2], R, H // R, Hd).mean(3)  # (N, T, R, Hd)
        w = model.router.weights[l - 1].detach().numpy()
        n = (l + 1) * R
        d = np.zeros((*q.shape[:2], R, n))
        for h in range(R):
            keys, g = w[h, :-1].reshape(n, Hd), w[h, -1]
            s = qbar[:, :, h] @ keys.T / math.sqrt(Hd)  # (N, T, n)
            e = np.exp(s - s.max(-1, keepdims=True))
            d[:, :, h] = g * e / e.sum(-1, keepdims=True)
            d[:, :, h, l * R + h] += 1 - g
        out[l] = d
    return out


def test_static_maps_are_dense_and_have_no_spread():
    model = build_model(preset("tiny", router="full", n_kv_heads=2))
    maps = mixing_maps(model, [_ids()])
    assert maps.spread is None and maps.tokens == 0
    for l, d in enumerate(maps.dense):
        np.testing.assert_array_equal(d, model.router.dense(l).detach().numpy())


@pytest.mark.parametrize("kv", [4, 2])
def test_dynamic_maps_are_the_mean_over_tokens_and_their_spread(kv):
    model = _dynamic(kv, gate=0.6)
    x = _ids()
    maps = mixing_maps(model, [x[:2], x[2:]])  # two batches: the average runs over all tokens
    by_hand = _weights_by_hand(model, x)
    R = kv
    assert maps.tokens == x.numel()
    np.testing.assert_array_equal(maps.dense[0], np.eye(R))
    for l, d in by_hand.items():
        np.testing.assert_allclose(maps.dense[l], d.mean(axis=(0, 1)), rtol=1e-6, atol=1e-7)
        rows = np.abs(d).reshape(*d.shape[:2], R, l + 1, R).mean(axis=(2, 4))
        rows = (rows / rows.sum(-1, keepdims=True)).reshape(-1, l + 1)
        np.testing.assert_allclose(maps.spread[l, :l + 1], rows.std(axis=0), rtol=1e-6, atol=1e-9)
    assert maps.spread[1:].max() > 0.01  # keys of scale 2: the weights differ between tokens


def test_dynamic_at_the_identity_init_reads_its_own_layer_at_every_token():
    model = _dynamic(2, gate=0.0)
    maps = mixing_maps(model, [_ids()])
    for l, d in enumerate(maps.dense):
        want = np.zeros((2, (l + 1) * 2))
        want[:, l * 2:] = np.eye(2)
        np.testing.assert_array_equal(d, want)
    np.testing.assert_array_equal(maps.spread, np.zeros((4, 4)))


def test_static_strongest_routes_by_hand():
    """Layer 2, head 1 puts |w| 3 on layer 0's heads and 1 on its own: share 3/4 on level 0, the
    strongest route; everything else is the identity."""
    model = build_model(preset("tiny", router="full", n_kv_heads=2, router_init="identity"))
    with torch.no_grad():
        model.router.weights[1][1, 0:2] = torch.tensor([2.0, -1.0])  # layer 2, head 1, level 0
    routes = strongest_routes(model, [_ids()], TOK, top=2)
    assert (routes[0].layer, routes[0].head, routes[0].level) == (2, 1, 0)
    assert routes[0].weight == pytest.approx(0.75) and routes[1].weight == 0.0
    assert routes[0].fires == [] and routes[0].keys == []
    md = "\n".join(routes_markdown("full", routes))
    assert "| 2 | 1 | 0 | 0.750 |" in md and "fires" not in md


def test_dynamic_routes_list_the_tokens_where_they_fire():
    model = _dynamic(2, gate=1.0)
    x = _ids(n=4)
    routes = strongest_routes(model, [x[:2], x[2:]], TOK, top=4, per_route=3)
    by_hand = _weights_by_hand(model, x)
    R = 2
    strength = {}
    for l, d in by_hand.items():
        share = np.abs(d).reshape(*d.shape[:2], R, l + 1, R).sum(-1)
        share = share / share.sum(-1, keepdims=True)  # (N, T, R, l+1)
        for h in range(R):
            for s in range(l):
                strength[(l, h, s)] = share[:, :, h, s]
    ranked = sorted(strength, key=lambda k: -strength[k].mean())[:4]
    assert [(r.layer, r.head, r.level) for r in routes] == ranked
    for r in routes:
        per_token = strength[(r.layer, r.head, r.level)]
        assert r.weight == pytest.approx(per_token.mean(), rel=1e-6)
        top = np.sort(per_token.ravel())[::-1][:3]
        np.testing.assert_allclose([w for _, w in r.fires], top, rtol=1e-6)
        b, t = np.unravel_index(np.argmax(per_token), per_token.shape)
        assert r.fires[0][0].endswith("[" + TOK.decode([int(x[b, t])]).encode("unicode_escape").decode() + "]")
        assert len(r.keys) == 2 and all(len(toks) == 5 for _, _, toks in r.keys)
    assert "tokens where it fires" in "\n".join(routes_markdown("dynamic", routes))


def test_logit_lens_of_a_key_by_hand():
    """The key's nearest tokens: embedding / final-norm weight -> layer l's attention norm -> query
    projection, grouped per KV head, scored against the key; recomputed here in numpy."""
    model = _dynamic(2)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    l, h, c = 2, 1, 3
    cfg = model.cfg
    H, R, Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    blk = model.blocks[l]
    e = model.embed.weight.detach().numpy() / model.norm.weight.detach().numpy()
    x = e / np.sqrt((e ** 2).mean(-1, keepdims=True) + cfg.norm_eps) * blk.attn_norm.weight.detach().numpy()
    q = (x @ blk.attn.wq.weight.detach().numpy().T).reshape(-1, R, H // R, Hd).mean(2)[:, h]  # (V, Hd)
    key = model.router.weights[l - 1].detach().numpy()[h, :-1].reshape(-1, Hd)[c]
    want = np.argsort(-(q @ key))[:5]
    assert nearest_tokens(model, TOK, l, h, c, 5) == [TOK.decode([int(t)]).encode("unicode_escape").decode()
                                                       for t in want]
    static = build_model(preset("tiny", router="full"))
    assert nearest_tokens(static, TOK, 2, 0, 0) == []  # a static router has no keys


def test_v1_form_maps_routes_and_logit_lens_by_hand():
    """The v1 form (``model.router_dynamic``: hidden-state scores, a softmax over layers, no gate):
    the map is the per-token softmax of x . key over the source layers, on head h of each, recomputed
    here in numpy from the captured normed inputs; the routes run; a key's nearest tokens score the
    normed embedding itself (no query projection, no scale)."""
    torch.manual_seed(0)
    form = {"scores": "hidden", "softmax": "layers", "gate": False}
    model = build_model(preset("tiny", router="dynamic", n_kv_heads=2, router_dynamic=form)).double()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for w in model.router.weights:
            w.normal_(0.0, 0.5, generator=g)
        model.norm.weight.uniform_(0.5, 1.5)
    cfg = model.cfg
    R, D, L = cfg.kv_heads, cfg.d_model, cfg.n_layers
    x = _ids(4)
    with torch.no_grad(), capture(model) as st:
        model(x)
    maps = mixing_maps(model, [x])
    for l in range(1, L):
        u = st["inputs"][l].numpy()  # (N, T, D)
        keys = model.router.weights[l - 1].detach().numpy().reshape(R, l + 1, D)
        d = np.zeros((*u.shape[:2], R, (l + 1) * R))
        for h in range(R):
            s = u @ keys[h].T  # (N, T, l+1)
            e = np.exp(s - s.max(-1, keepdims=True))
            d[:, :, h, h::R] = e / e.sum(-1, keepdims=True)  # head h of every source layer
        np.testing.assert_allclose(maps.dense[l], d.mean((0, 1)), rtol=1e-5, atol=1e-7)
    routes = strongest_routes(model, [x], TOK, top=3, per_route=2, lens=3, key_heads=1)
    assert len(routes) == 3 and all(len(r.keys) == 1 and len(r.keys[0][2]) == 3 for r in routes)
    assert all(r.keys[0][0] == r.head for r in routes)  # layers: a routed head reads its own head index
    l, h, i = 2, 1, 0
    blk = model.blocks[l]
    e = model.embed.weight.detach().numpy() / model.norm.weight.detach().numpy()
    xn = e / np.sqrt((e ** 2).mean(-1, keepdims=True) + cfg.norm_eps) * blk.attn_norm.weight.detach().numpy()
    key = model.router.weights[l - 1].detach().numpy().reshape(R, l + 1, D)[h, i]
    want = np.argsort(-(xn @ key))[:5]
    assert nearest_tokens(model, TOK, l, h, i, 5) == [TOK.decode([int(t)]).encode("unicode_escape").decode()
                                                       for t in want]
