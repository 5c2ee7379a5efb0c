"""Route ablation (``orchestrator.analysis.ablate``, ``lime analyze --ablate``): each route's effect
against the decoder written from the paper (``tests/lime_arch/model_reference.py``) run with that
route zeroed by hand in per-token loops written here, a route of zero mass, route selection, the
seeds' interval against scipy and a brute-force sign-flip inversion, and the command end to end."""
from __future__ import annotations

import csv
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats as sps

from lime_arch import build_model, preset
from orchestrator.analysis.ablate import (
    Ablation,
    RouteId,
    candidate_routes,
    measure,
    route_masses,
    select_routes,
    spearman,
)
from orchestrator.cli import analyze_ablation
from orchestrator.engine.trial_config import TrialConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lime_arch"))  # the float64 references
from kind_references import REFERENCES  # noqa: E402
from model_reference import reference_forward  # noqa: E402


def _model(spec: str, seed: int = 0, gate: float | None = None):
    torch.manual_seed(seed)
    model = build_model(preset("tiny", router=spec, n_layers=3, n_kv_heads=2, vocab_size=256)).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith("router."):
                p.mul_(10.0)  # init std 0.2: a route moves the loss well above rounding
        for w in model.router.weights:
            if model.router.kind.name == "dynamic":
                w[:, :-1].normal_(0.0, 2.0, generator=g)  # keys far from uniform
                w[:, -1] = 0.7 if gate is None else gate  # a gate < 1: (1 - g) stays on the own heads
            else:
                w.normal_(0.0, 0.5, generator=g)
    return model.eval()


def _windows(n=3, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (2, T), generator=g), torch.randint(0, 256, (2, T), generator=g)) for _ in range(n)]


def _losses(windows):
    """(model) -> per window the summed float64 cross-entropy and the count of its targets."""
    def losses(model):
        with torch.no_grad():
            out = [F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(y.shape).sum(1)
                   for x, y in windows]
        s = torch.cat(out)
        return s.tolist(), [windows[0][1].shape[1]] * len(s)
    return losses


def _mean_se(sums, counts):
    return sum(sums) / sum(counts), 0.0


def _ref_loss(model, windows, route):
    tot, n = 0.0, 0
    for x, y in windows:
        with torch.no_grad():
            logits = reference_forward(model, x, lambda l: list(range(l + 1)), route=route)
        tot += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
        n += y.numel()
    return tot / n


def _rescale(coef: dict, before, renorm: bool) -> dict:
    """Per token: scale the coefficients left back to the row's |mass| ``before`` (where any is left)."""
    if not renorm:
        return coef
    after = sum(c.abs() for c in coef.values())
    scale = torch.where(after > 0, before / torch.where(after > 0, after, torch.ones_like(after)),
                        torch.ones_like(after))
    return {k: c * scale for k, c in coef.items()}


def _zeroed_static(kind: str, layer: int, source: int, head, renorm: bool):
    """The kind's reference run on layer ``layer``'s weight with the route's entries zeroed by hand
    (and each row that lost some scaled back to the |w| mass it had)."""
    def route(w, sources, kbuf, vbuf, l, q):
        if l == layer:
            R = kbuf[0].shape[1]
            i = sources.index(source)
            w = w.clone()
            for h in range(R) if head is None else [head]:
                before = w[h].abs().sum()
                if kind == "same-head":
                    w[h, i] = 0
                else:
                    w[h, i * R:(i + 1) * R] = 0
                after = w[h].abs().sum()
                if renorm and after > 0:
                    w[h] = w[h] * (before / after)
        return REFERENCES[kind].route(w, sources, kbuf, vbuf, l, q)
    return route


def _zeroed_dynamic(layer: int, source: int, head, renorm: bool):
    """Appendix E's routing with this project's gate, per routed head h as per-token coefficients on
    (source layer, source head), the gate's (1 - g) on the own head; the route's coefficients zeroed."""
    def route(w, sources, kbuf, vbuf, l, q):
        if l != layer:
            return REFERENCES["dynamic"].route(w, sources, kbuf, vbuf, l, q)
        B, R, T, Hd = kbuf[0].shape
        G, n = q.shape[1] // R, len(sources) * R
        ks, vs = [], []
        for h in range(R):
            key, g = w[h, :n * Hd].reshape(n, Hd), w[h, n * Hd]
            qbar = q[:, h * G:(h + 1) * G].mean(1)  # (B, T, Hd)
            a = torch.softmax(qbar @ key.T / math.sqrt(Hd), dim=-1)  # (B, T, n)
            coef = {(s, h2): g * a[..., i * R + h2] for i, s in enumerate(sources) for h2 in range(R)}
            coef[(l, h)] = coef[(l, h)] + (1 - g)
            if head is None or head == h:
                before = sum(c.abs() for c in coef.values())
                coef.update({(source, h2): torch.zeros_like(a[..., 0]) for h2 in range(R)})
                coef = _rescale(coef, before, renorm)
            ks.append(sum(c[..., None] * kbuf[s][:, h2] for (s, h2), c in coef.items()))
            vs.append(sum(c[..., None] * vbuf[s][:, h2] for (s, h2), c in coef.items()))
        return torch.stack(ks, 1), torch.stack(vs, 1)
    return route


def _zeroed_depth_attention(layer: int, source: int, head, renorm: bool):
    """Depth attention (arXiv 2606.05014): each KV head's group-mean query scores the keys of
    layers 0..l at its token, a softmax mixes their values; the route's weight zeroed; keys own."""
    def route(w, sources, kbuf, vbuf, l, q):
        if l != layer:
            return REFERENCES["depth-attention"].route(w, sources, kbuf, vbuf, l, q)
        B, R, T, Hd = kbuf[0].shape
        G = q.shape[1] // R
        vs = []
        for h in range(R):
            qbar = q[:, h * G:(h + 1) * G].mean(1)
            a = torch.softmax(torch.stack([(qbar * kbuf[s][:, h]).sum(-1) for s in sources], -1) / math.sqrt(Hd), -1)
            coef = {s: a[..., i] for i, s in enumerate(sources)}
            if head is None or head == h:
                before = sum(c.abs() for c in coef.values())
                coef[source] = torch.zeros_like(coef[source])
                coef = _rescale(coef, before, renorm)
            vs.append(sum(c[..., None] * vbuf[s][:, h] for s, c in coef.items()))
        return kbuf[l], torch.stack(vs, 1)
    return route


REFS = {"full": lambda *a: _zeroed_static("linear", *a), "per-dim": lambda *a: _zeroed_static("per-dim", *a),
        "no-head-mix": lambda *a: _zeroed_static("same-head", *a), "dynamic": _zeroed_dynamic,
        "depth-attention": _zeroed_depth_attention}


@pytest.mark.parametrize("spec", list(REFS))
@pytest.mark.parametrize("renorm", [False, True])
def test_each_effect_is_the_reference_decoder_with_the_route_zeroed_by_hand(spec, renorm):
    model = _model(spec)
    windows = _windows()
    routes = [RouteId(2, 0), RouteId(2, 1, 1), RouteId(1, 0, 0)]
    mass = {r: 0.0 for r in routes}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    a = measure(model, routes, mass, _losses(windows), _mean_se, renormalize=renorm)
    assert a.mechanism == ("mask" if spec == "full" else "mixer")
    base = _ref_loss(model, windows, None)
    assert a.loss == pytest.approx(base, abs=1e-10)
    for r in routes:
        ref = _ref_loss(model, windows, REFS[spec](r.layer, r.source, r.head, renorm)) - base
        assert abs(ref) > 1e-6, r  # the route matters here, so the comparison can fail
        assert a.effect[r] == pytest.approx(ref, abs=1e-10), r
    after = model.state_dict()  # masks, weights and the mixer are put back: nothing attached stays
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    assert "wrap_mixer" not in vars(model.depth_mix)


@pytest.mark.parametrize("renorm", [False, True])
def test_the_pruning_masks_and_the_wrapped_mixer_agree_on_a_linear_router(renorm):
    model, windows = _model("full", seed=3), _windows(seed=3)
    routes = candidate_routes(model.router) + [RouteId(2, 0, 1)]
    mass = {r: 0.0 for r in routes}
    by_mask = measure(model, routes, mass, _losses(windows), _mean_se, renormalize=renorm, via="mask")
    by_mixer = measure(model, routes, mass, _losses(windows), _mean_se, renormalize=renorm, via="mixer")
    for r in routes:
        assert by_mask.effect[r] == pytest.approx(by_mixer.effect[r], abs=1e-10)


def test_a_route_already_pruned_has_zero_mass_and_zero_effect():
    from lime_arch import prune

    model, windows = _model("full", seed=1), _windows(seed=1)
    prune.attach(model.router)
    with torch.no_grad():
        model.router.prune.mask(2)[:, 0:2] = False  # layer 2's source 0, every head: pruned
        model.router.prune.refreshed.fill_(5)
    model.router.prune.changed()
    routes = candidate_routes(model.router)
    mass = route_masses(model, [x for x, _ in windows], routes)
    assert mass[RouteId(2, 0)] == 0.0 and mass[RouteId(2, 1)] > 0
    for renorm in (False, True):
        a = measure(model, routes, mass, _losses(windows), _mean_se, renormalize=renorm)
        assert abs(a.effect[RouteId(2, 0)]) < 1e-12 and abs(a.effect[RouteId(2, 1)]) > 1e-6
    assert int(model.router.prune.refreshed) == 5 and not model.router.prune.mask(2)[:, :2].any()
    assert model.router.prune.mask(2)[:, 2:].all()  # the checkpoint's own mask, put back


def test_a_dynamic_router_whose_gates_are_shut_has_zero_mass_and_exactly_zero_effect():
    model, windows = _model("dynamic", gate=0.0), _windows()
    routes = candidate_routes(model.router) + [RouteId(2, 1, 0)]
    mass = route_masses(model, [x for x, _ in windows], routes)
    assert all(m == 0.0 for m in mass.values())
    for renorm in (False, True):
        a = measure(model, routes, mass, _losses(windows), _mean_se, renormalize=renorm)
        assert all(a.effect[r] == 0.0 for r in routes)


def test_masses_are_the_router_map_and_the_heads_shares():
    model = _model("full", seed=2)
    routes = candidate_routes(model.router) + candidate_routes(model.router, heads=True)
    mass = route_masses(model, [torch.zeros(1, 4, dtype=torch.long)], routes)
    w = model.router.weights[1].detach().abs().numpy()  # layer 2: (R, 3R), R = 2
    blocks = np.array([w[:, 2 * s:2 * s + 2].mean() for s in range(3)])
    assert mass[RouteId(2, 0)] == pytest.approx(blocks[0] / blocks.sum())
    h1 = np.array([w[1, 2 * s:2 * s + 2].sum() for s in range(3)])
    assert mass[RouteId(2, 1, 1)] == pytest.approx(h1[1] / h1.sum())


def test_selection_takes_the_top_half_by_mass_and_a_seeded_sample_of_the_rest():
    routes = [RouteId(l, s) for l in range(1, 6) for s in range(l)]  # 15 routes
    mass = {r: float(i) for i, r in enumerate(routes)}
    assert select_routes(routes, mass, 15)[1] == {r: "all" for r in routes}
    chosen, why = select_routes(routes, mass, 5)
    assert len(chosen) == 5 and chosen == sorted(chosen, key=RouteId.order)
    assert {r for r, w in why.items() if w == "top mass"} == set(routes[-3:])  # ceil(5 / 2) highest
    assert sum(w == "sample" for w in why.values()) == 2
    assert select_routes(routes, mass, 5) == (chosen, why)  # seeded


def test_spearman_is_the_hand_computed_rank_correlation():
    # ranks of mass 1 2 3, of effect 3 1 2: d = -2 1 1, rho = 1 - 6 * 6 / (3 * 8) = -0.5
    assert spearman([0.1, 0.2, 0.3], [3.0, 1.0, 2.0]) == pytest.approx(-0.5)
    assert math.isnan(spearman([0.1, 0.2], [1.0, 2.0])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def _sign_flip_by_brute_force(d, level):
    """The mu kept by the exact two-sided sign-flip test (p >= 1 - level), searched over every
    subset mean (where the limits are, Hartigan 1969) by enumerating all 2^n sign vectors."""
    n = len(d)
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=n)))
    cands = {float(np.mean([d[i] for i in c])) for k in range(1, n + 1) for c in itertools.combinations(range(n), k)}
    kept = []
    for mu in cands:
        x = np.asarray(d) - mu
        p = np.mean(np.abs(signs @ x) >= abs(x.sum()) - 1e-12)
        if p >= 1 - level - 1e-12:
            kept.append(mu)
    return min(kept), max(kept)


def test_the_seeds_interval_is_the_t_and_sign_flip_hull_computed_independently():
    effects = [[0.031, 0.002], [0.027, -0.001], [0.040, 0.003], [0.019, 0.000], [0.035, -0.002], [0.024, 0.004]]
    routes = [RouteId(1, 0), RouteId(2, 1)]
    abl = [Ablation(routes, {routes[0]: 0.1, routes[1]: 0.6}, 3.0, 0.01, {r: e[i] for i, r in enumerate(routes)})
           for e in effects]
    out = {s.route: s for s in analyze_ablation.summarize(abl)}
    assert [s.route for s in analyze_ablation.summarize(abl)] == routes  # largest mean effect first
    for i, r in enumerate(routes):
        d = np.array([e[i] for e in effects])
        t_lo, t_hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
        s_lo, s_hi = _sign_flip_by_brute_force(d, 0.95)
        iv = out[r].interval
        assert out[r].effect == pytest.approx(d.mean())
        assert (iv.low, iv.high) == pytest.approx((min(t_lo, s_lo), max(t_hi, s_hi)), abs=1e-12)
    assert math.isinf(analyze_ablation.summarize(abl[:5])[0].interval.low)  # 5 seeds: the whole line


def test_variants_are_the_configs_equal_but_for_the_seed():
    def cfg(seed, lr=3e-3, router="full", folder="a"):
        return TrialConfig.from_dict({"model": {"router": router}, "optim": {"lr": lr},
                                      "train": {"seed": seed, "checkpoint_dir": folder}})
    got = analyze_ablation.variants({"a": cfg(0), "b": cfg(1, folder="b"), "c": cfg(0, lr=1e-3),
                                     "d": cfg(2, router="dynamic")})
    assert got == {"full (a)": ["a", "b"], "full (c)": ["c"], "dynamic": ["d"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny trained checkpoints of 3 layers: two seeds of a dynamic router, one full, one none."""
    from orchestrator.engine.trial import Tracking, run_trial

    root = tmp_path_factory.mktemp("trained")
    out = {}
    for router, seed in (("dynamic", 0), ("dynamic", 1), ("full", 0), ("none", 0)):
        folder = root / f"{router}-{seed}"
        run_trial(TrialConfig.from_dict({
            "preset": "tiny", "model": {"router": router, "n_layers": 3, "d_model": 16, "n_heads": 2, "ffn_dim": 32},
            "data": {"val_tokens": 256},
            "train": {"steps": 2, "batch_size": 2, "seq_len": 32, "log_interval": 1, "eval_batches": 1, "seed": seed,
                      "checkpoint_dir": str(folder)}}), tracking=Tracking(enabled=False))
        out[f"{router}{seed}"] = folder
    return out


def _refused(capsys, argv: list[str]) -> str:
    from orchestrator.cli import main

    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err.rstrip("\n")


def test_bad_ablation_flags_are_one_line_before_any_work(capsys, trained, tmp_path, monkeypatch):
    import orchestrator.cli.analyze as analyze
    from orchestrator.cli import main

    def no_compute(*a, **k):
        raise AssertionError("computed before the refusal")

    monkeypatch.setattr(analyze, "analyze_model", no_compute)
    monkeypatch.chdir(tmp_path)
    full, none = str(trained["full0"]), str(trained["none0"])
    for flag in (["--renormalize"], ["--no-renormalize"], ["--ablate-heads"], ["--ablate-max-routes", "3"]):
        name = "--renormalize/--no-renormalize" if "renormalize" in flag[0] else flag[0]
        assert _refused(capsys, ["analyze", full, *flag]) == (
            f"error: {name}: only with --ablate (the route ablation it configures)")
    assert _refused(capsys, ["analyze", full, "--ablate", "--ablate-max-routes", "0"]) == (
        "error: --ablate-max-routes: must be >= 1, got 0")
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: the same one line, exit 2
        main(["analyze", full, "--ablate", "--ablate-max-routes", "x"])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: lime analyze: argument --ablate-max-routes: invalid int value: 'x' (see lime analyze --help)\n")
    assert _refused(capsys, ["analyze", full, none, "--ablate"]) == (
        "error: --ablate: none: router 'none' reads only each layer's own K/V; it has no route to ablate")
    assert list(tmp_path.iterdir()) == []


def test_lime_analyze_ablate_writes_the_tables_over_seeds(tmp_path, trained):
    from orchestrator.cli import main

    cks = [f"{k}={trained[k]}" for k in ("dynamic0", "dynamic1", "full0")]
    out = tmp_path / "an"
    assert main(["analyze", *cks, "--out", str(out), "--sequences", "4", "--ablate", "--ablate-max-routes", "2"]) == 0
    rows = list(csv.DictReader((out / "ablation.csv").open()))
    assert [(r["variant"], r["label"]) for r in rows] == [("dynamic", "dynamic0")] * 2 + [("dynamic", "dynamic1")] * 2 \
        + [("full", "full0")] * 2
    assert {(r["layer"], r["source"]) for r in rows if r["label"] == "dynamic0"} == \
        {(r["layer"], r["source"]) for r in rows if r["label"] == "dynamic1"}  # the same routes on every seed
    assert {r["mechanism"] for r in rows} == {"mixer", "mask"} and {r["renormalize"] for r in rows} == {"False"}
    summary = list(csv.DictReader((out / "ablation_summary.csv").open()))
    dyn = [s for s in summary if s["variant"] == "dynamic"]
    assert len(dyn) == 2
    for s in dyn:  # the mean over the two seeds
        e = [float(r["effect"]) for r in rows if r["variant"] == "dynamic" and (r["layer"], r["source"]) ==
             (s["layer"], s["source"])]
        assert float(s["effect"]) == pytest.approx(np.mean(e)) and s["checkpoints"] == "2"
    md = (out / "ablation.md").read_text()
    assert "Measured 2 of 3 routes (--ablate-max-routes 2): the 1 of highest mean mass" in md
    assert "## dynamic: 2 checkpoint(s) (dynamic0, dynamic1)" in md and "whole line (< 6 seeds)" in md
