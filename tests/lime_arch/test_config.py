import pytest
import torch

from lime_arch import ConfigError, build_model, flops_per_token, param_counts, param_groups, preset


@pytest.mark.parametrize("name,target,tol", [
    ("150m", 150e6, 0.05), ("1b", 1.17674e9, 0.01), ("1b-gqa", 1.07607e9, 0.01),
    ("360m", 361.82e6, 0.001)])  # SmolLM2-360M: 361,821,120 with its tied 49,152 vocabulary
def test_preset_parameter_targets(name, target, tol):
    assert abs(param_counts(preset(name))["total"] - target) / target <= tol


@pytest.mark.parametrize("name,layers", [("deep32", 32), ("deep64", 64), ("deep128", 128)])
def test_deep_presets(name, layers):
    c = preset(name)
    assert (c.n_layers, c.d_model, c.ffn_dim, c.n_heads) == (layers, 256, 1024, 8)


def test_preset_override_and_unknown():
    assert preset("deep32", n_layers=8).n_layers == 8
    with pytest.raises(ConfigError, match="preset: unknown preset 'huge'"):
        preset("huge")


def test_paper_router_cost_1b():
    # the paper (arXiv 2502.09245): 138,240 router params and 35.4 MFLOP/token for R=32, L=16, Hd=64
    c = preset("1b", router="full")
    assert param_counts(c)["router"] == 138_240
    assert flops_per_token(c)["routing"] == 4 * 32 * 32 * 64 * sum(l + 1 for l in range(1, 16))
    g = preset("1b-gqa", router="full")
    assert flops_per_token(g)["routing"] * 16 == flops_per_token(c)["routing"]  # shrinks as R^2


def test_flops_base_by_hand():
    c = preset("tiny")  # d=64, L=4, H=4, ffn=172, V=256
    T = 32
    per_layer = 4 * 64 * 64 + 3 * 64 * 172 + 2 * T * 64
    assert flops_per_token(c, T)["base"] == 2 * (4 * per_layer + 64 * 256)


def test_param_groups():
    model = build_model(preset("tiny", router="full"))
    groups = {g["name"]: g for g in param_groups(model, lr=1e-3, weight_decay=0.1, router_lr_mult=10)}
    assert groups["router"]["lr"] == pytest.approx(1e-2) and groups["router"]["weight_decay"] == 0
    ids = lambda g: {id(p) for p in g["params"]}  # noqa: E731
    assert ids(groups["router"]) == {id(p) for p in model.router.parameters()}
    assert id(model.embed.weight) in ids(groups["no_decay"])
    assert id(model.blocks[0].attn_norm.weight) in ids(groups["no_decay"])
    assert id(model.blocks[0].attn.wq.weight) in ids(groups["decay"])
    n = sum(len(g["params"]) for g in groups.values())
    assert n == len(list(model.parameters()))
    assert param_groups(model, lr=1e-3, weight_decay=0.1, router_lr=5e-3)[2]["lr"] == 5e-3
    with pytest.raises(ConfigError):
        param_groups(model, lr=1e-3, weight_decay=0.1, router_lr=1e-2, router_lr_mult=2)
    torch.optim.AdamW(param_groups(model, lr=1e-3, weight_decay=0.1))
