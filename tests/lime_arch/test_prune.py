"""Top-p pruning of router weights (``lime_arch.prune``): the rule against hand-worked rows and a
plain-loop reimplementation, the renormalisation, a pruned model against an unpruned twin whose
weights are the masked ones (forward, gradients, the concatenation, cached decoding), pruned
sources really skipped (no gradient reaches them, the plan moves fewer slots), the masks in the
state dict, and the one-line errors."""
import numpy as np
import pytest
import torch

from lime_arch import ConfigError, build_model, preset
from lime_arch.generate import generate
from lime_arch.model import KVCache
from lime_arch.prune import refresh, stats, top_p_keep
from lime_arch.routing.mixers import make_mixer
from lime_arch.routing.plan import step_traffic


@pytest.mark.parametrize("row,p,keep", [
    ([0.5, 0.25, 0.125, 0.125], 0.75, [1, 1, 1, 0]),  # 0.5 + 0.25 = 0.75 does not exceed 0.75: the third crosses
    ([0.5, 0.25, 0.125, 0.125], 0.7, [1, 1, 0, 0]),  # 0.75 > 0.7: the second crosses
    ([0.125, 0.5, 0.125, 0.25], 0.7, [0, 1, 0, 1]),  # order does not matter
    ([0.25, 0.25, 0.25, 0.25], 0.5, [1, 1, 1, 0]),  # ties: in column order
    ([2.0, 0.0, 0.0, 0.0], 0.9, [1, 0, 0, 0]),  # one entry carries everything
    ([0.0, 0.0, 0.0], 0.9, [1, 1, 1]),  # nothing to rank: all kept
    ([1.0, 1.0, 8.0], 0.8, [1, 0, 1]),  # share 0.8 does not exceed 0.8: one more (the first tie)
])
def test_top_p_rule_by_hand(row, p, keep):
    got = top_p_keep(torch.tensor([row]), p)
    assert got.tolist() == [[bool(k) for k in keep]]


def _loop_rule(row: np.ndarray, p: float) -> np.ndarray:
    """The authors' rule as plain loops: sort by share, add entries until the sum exceeds p."""
    share = row / row.sum()
    keep = np.zeros(len(row), dtype=bool)
    total = 0.0
    for i in sorted(range(len(row)), key=lambda i: (-share[i], i)):
        keep[i] = True
        total += share[i]
        if total > p:
            break
    return keep


def test_top_p_rule_against_plain_loops():
    rng = np.random.default_rng(0)
    for _ in range(200):
        row = np.abs(rng.standard_normal(rng.integers(1, 30))) ** 3
        p = float(rng.uniform(0.05, 0.99))
        np.testing.assert_array_equal(top_p_keep(torch.tensor(row[None]), p)[0].numpy(), _loop_rule(row, p))


def _model(router="full", kv=2, layers=6, seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(preset("tiny", router=router, n_kv_heads=kv, n_layers=layers,
                              router_prune={"top_p": 0.9}, **kw)).double()


def test_refresh_masks_and_renormalises_each_row():
    m = _model()
    before = [w.detach().clone() for w in m.router.weights]
    refresh(m.router, 0.9)
    for l, (w0, w) in enumerate(zip(before, m.router.weights), start=1):
        mask = m.router.prune.mask(l)
        np.testing.assert_array_equal(mask.numpy(), np.stack([_loop_rule(r, 0.9) for r in w0.abs().numpy()]))
        torch.testing.assert_close((w * mask).abs().sum(-1), w0.abs().sum(-1))  # the row's |w| mass kept
        ratio = (w / w0)[mask]  # kept entries scaled by their row's factor >= 1, the pruned untouched
        assert (ratio >= 1 - 1e-12).all() and torch.equal(w[~mask], w0[~mask])
    plain = _model()
    refresh(plain.router, 0.9, renormalize=False)
    assert all(torch.equal(a, b) for a, b in zip(plain.router.weights, before))


def _hand_model(row0, row1):
    """A full router over 3 layers with R = 2: layer 1's weight (2 heads x 2 slots x 2 heads) set by hand
    (row 1 mirrors row 0, so every slot stays read and ``executed().weight(1)`` is the whole masked matrix)."""
    m = _model("full", 2, layers=3)
    with torch.no_grad():
        m.router.weights[0].copy_(torch.tensor([row0, row1], dtype=torch.float64))
    return m


def test_renormalisation_off_masks_only_by_hand():
    """Row [0.5, -0.3, 0.15, 0.05] at top_p 0.7: shares 0.5, 0.3 reach 0.8 > 0.7 at the second entry, so
    two are kept. Renormalised: x 1.0 / 0.8 = 1.25 (the row's |w| mass); not: masked only."""
    row0, row1 = [0.5, -0.3, 0.15, 0.05], [0.05, 0.15, -0.3, 0.5]
    on, off = _hand_model(row0, row1), _hand_model(row0, row1)
    refresh(on.router, 0.7)
    refresh(off.router, 0.7, renormalize=False)
    want_mask = [[True, True, False, False], [False, False, True, True]]
    assert on.router.prune.mask(1).tolist() == off.router.prune.mask(1).tolist() == want_mask
    torch.testing.assert_close(on.router.executed().weight(1), torch.tensor(
        [[0.625, -0.375, 0, 0], [0, 0, -0.375, 0.625]], dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(off.router.executed().weight(1), torch.tensor(
        [[0.5, -0.3, 0, 0], [0, 0, -0.3, 0.5]], dtype=torch.float64), rtol=0, atol=0)


def test_pruning_again_ranks_only_the_kept_weights_by_hand():
    """After top_p 0.7 row 0 is [0.625, 0.375 | 0.15, 0.05 dropped]. Again at 0.9 over the kept weights
    (shares 0.625, 0.375): both stay, the dropped stay dropped, nothing is rescaled. Ranking every weight
    at its stale value instead (the training refresh) shares 0.521, 0.313, 0.125, 0.042 and brings the
    0.15 back. Again at 0.5: 0.625 alone exceeds it; renormalised to the kept mass 1.0."""
    row0, row1 = [0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]
    m = _hand_model(row0, row1)
    refresh(m.router, 0.7)
    refresh(m.router, 0.9, only_kept=True)
    assert m.router.prune.mask(1).tolist() == [[True, True, False, False], [False, False, True, True]]
    torch.testing.assert_close(m.router.weights[0][0], torch.tensor([0.625, 0.375, 0.15, 0.05],
                                                                    dtype=torch.float64), rtol=0, atol=1e-15)
    assert stats(m.router).pruned[1] == 4  # the earlier drops are counted
    stale = _hand_model(row0, row1)
    refresh(stale.router, 0.7)
    refresh(stale.router, 0.9)
    assert stale.router.prune.mask(1)[0].tolist() == [True, True, True, False]
    refresh(m.router, 0.5, only_kept=True)
    assert m.router.prune.mask(1).tolist() == [[True, False, False, False], [False, False, False, True]]
    torch.testing.assert_close(m.router.executed().weight(1)[0], torch.tensor([1.0, 0, 0, 0], dtype=torch.float64),
                               rtol=0, atol=1e-15)
    assert stats(m.router).pruned[1] == 6


def _twin(m):
    """An unpruned model whose router weights are the pruned model's masked weights."""
    cfg = m.cfg.replace(router_prune=None)
    twin = build_model(cfg).double()
    state = {k: v for k, v in m.state_dict().items() if ".prune." not in k}
    for l in range(1, cfg.n_layers):
        state[f"router.weights.{l - 1}"] = m.router.weights[l - 1].detach() * m.router.prune.mask(l)
    twin.load_state_dict(state)
    return twin


@pytest.mark.parametrize("router", ["full", "first-2", "dilated-2"])
@pytest.mark.parametrize("kv", [4, 2])
def test_pruned_model_is_its_masked_twin(router, kv):
    m = _model(router, kv)
    with torch.no_grad():  # a few slots weak for every head: pruned whole, so the plans shrink
        for l, w in enumerate(m.router.weights, start=1):
            w[:, : kv] *= 1e-3 if l >= 3 else 1.0
    refresh(m.router, 0.9)
    assert any(stats(m.router).skipped[l] for l in range(3, 6)), "the test needs skipped slots"
    twin = _twin(m)
    idx = torch.randint(0, 256, (2, 11))
    target = torch.randn(2, 11, 256)
    out, ref = m(idx), twin(idx)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    (out * target).sum().backward()
    (ref * target).sum().backward()
    tw = dict(twin.named_parameters())
    for n, p in m.named_parameters():
        want = tw[n].grad
        if n.startswith("router.weights."):
            want = want * m.router.prune.mask(int(n.rsplit(".", 1)[1]) + 1)  # no gradient for a pruned entry
        torch.testing.assert_close(p.grad, want, rtol=1e-9, atol=1e-11, msg=n)
    concat = _model(router, kv, routing_impl="concat")
    concat.load_state_dict(m.state_dict())
    torch.testing.assert_close(concat(idx), out, rtol=1e-10, atol=1e-10)
    m.eval()
    with torch.no_grad():
        cache = KVCache(m.cfg, 2, 11, idx.device, torch.float64)
        steps = [m(idx[:, :5], cache)] + [m(idx[:, t:t + 1], cache) for t in range(5, 11)]
        torch.testing.assert_close(torch.cat(steps, 1), m(idx), rtol=1e-9, atol=1e-9)
        assert torch.equal(generate(m, idx[:, :3], 5), generate(twin.eval(), idx[:, :3], 5))


def test_pruned_sources_are_skipped():
    """A slot pruned for every head of layer 4 is no source of it: no gradient from layer 4's output
    reaches it, and the plan the buffer mixer runs moves fewer slots than the unpruned one."""
    m = _model("full", 2, layers=6)
    with torch.no_grad():
        m.router.weights[3][:, 2:4] = 1e-6  # layer 4, slot 1, both heads
    refresh(m.router, 0.9)
    view = m.router.executed()
    assert 1 not in view.sources(4) and 1 in m.router.sources(4) and 4 in view.sources(4)
    assert 1 in stats(m.router).skipped[4]
    R, Hd, B, T = 2, m.cfg.head_dim, 2, 3
    raw = [(torch.randn(B, T, R, Hd, dtype=torch.float64, requires_grad=True),
            torch.randn(B, T, R, Hd, dtype=torch.float64, requires_grad=True)) for _ in range(6)]
    mixer = make_mixer(m.router)
    outs = [mixer.route(l, k, v) for l, (k, v) in enumerate(raw)]
    (outs[4][0].sum() + outs[4][1].sum()).backward()
    assert raw[1][0].grad is None or raw[1][0].grad.abs().sum() == 0
    assert raw[0][0].grad.abs().sum() > 0
    assert step_traffic(view, B, T)[0] < step_traffic(_model("full", 2).router, B, T)[0]


def test_masks_travel_in_the_state_dict():
    m = _model()
    refresh(m.router, 0.9, step=7)
    fresh = _model(seed=1)
    assert fresh.router.executed() is fresh.router  # never refreshed: nothing pruned
    fresh.load_state_dict(m.state_dict())
    assert int(fresh.router.prune.refreshed) == 7 and fresh.router.executed() is not fresh.router
    idx = torch.randint(0, 256, (2, 9))
    torch.testing.assert_close(fresh(idx), m(idx), rtol=0, atol=0)
    assert stats(fresh.router).pruned == stats(m.router).pruned


@pytest.mark.parametrize("router", ["dynamic", "average", "none", "per-dim", "no-head-mix"])
def test_only_linear_routers_prune(router):
    with pytest.raises(ConfigError, match=r"^model.router_prune: router .* cannot be pruned; prunable: .*linear"):
        preset("tiny", router=router, router_prune={"top_p": 0.9})


@pytest.mark.parametrize("value,message", [
    ({"top_p": 1.0}, "model.router_prune.top_p: must be a number in (0, 1), got 1.0"),
    ({"top_p": 0.9, "every": -1}, "model.router_prune.every: must be an integer >= 0, got -1"),
    ({"start": 3}, "model.router_prune.top_p: required"),
    ({"top_p": 0.9, "often": 2}, "model.router_prune.often: unknown key; allowed: top_p, start, every, renormalize"),
    (0.9, "model.router_prune: must be a mapping"),
])
def test_bad_prune_configs(value, message):
    with pytest.raises(ConfigError) as e:
        preset("tiny", router="full", router_prune=value)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_schedule():
    rp = preset("tiny", router="full", router_prune={"top_p": 0.9, "start": 10, "every": 5}).router_prune
    assert [s for s in range(30) if rp.due(s)] == [10, 15, 20, 25]
    once = preset("tiny", router="full", router_prune={"top_p": 0.9, "start": 4}).router_prune
    assert [s for s in range(30) if once.due(s)] == [4]


def test_the_torch_free_list_of_prunable_kinds_is_the_kinds_own():
    """The config check reads PRUNABLE_KINDS by name (no torch); the kinds declare ``prunable``."""
    from lime_arch.routers import PRUNABLE_KINDS, ROUTER_KINDS

    assert {name for name, kind in ROUTER_KINDS.items() if kind.prunable} == PRUNABLE_KINDS
