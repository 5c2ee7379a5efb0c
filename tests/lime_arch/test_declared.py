"""Routers and depth mixes are torch-free declarations (``lime_arch.specs.Declared``) whose
instances are ``nn.Module``s: what the class is, what building one gives, and that models survive
pickle and deepcopy although their classes are made at run time."""
import copy
import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lime_arch import DEPTH_MIXES, ROUTERS, build_model, depth_mix_specs, preset, router_specs
from lime_arch.depth_mix import build_depth_mix
from lime_arch.routers import (
    LINEAR,
    ROUTER_KINDS,
    FullRouter,
    KindName,
    Router,
    RouterArg,
    build_router,
    register_router,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_router_class_builds_a_module_that_is_an_instance_of_it():
    r = FullRouter(n_layers=3, n_kv_heads=2, head_dim=4, init="paper")  # the class itself, as before
    assert isinstance(r, FullRouter) and isinstance(r, Router) and isinstance(r, nn.Module)
    assert type(r).__name__ == "FullRouter" and type(r).declaration is FullRouter
    assert type(build_router("full", n_layers=3, n_kv_heads=2, head_dim=4)) is type(r)  # made once per class
    assert [k for k, _ in r.named_parameters()] == ["weights.0", "weights.1"]
    assert r.kind is LINEAR and FullRouter.kind is LINEAR  # reading the kind gives the kind object
    assert inspect.getattr_static(FullRouter, "kind").name == "linear"  # what the class declares


def test_every_registered_router_declares_a_kind_by_name():
    for name, cls in ROUTERS.items():
        declared = inspect.getattr_static(cls, "kind")
        assert isinstance(declared, KindName), name
        assert declared.name in ROUTER_KINDS and cls.kind is ROUTER_KINDS[declared.name]


def test_a_kind_name_without_a_module_fails_where_it_is_written():
    with pytest.raises(ValueError, match="router kind 'lineer': no module lime_arch.routing.kinds.<name>"):
        KindName("lineer")
    with pytest.raises(ValueError, match="router kind 'Linear'"):
        KindName("Linear")


def test_an_argument_named_like_a_module_attribute_fails_when_built():
    class Clash(Router):
        kind = KindName("linear")
        arguments = (RouterArg("to"),)  # nn.Module.to

    register_router("clash")(Clash)
    try:
        with pytest.raises(TypeError, match="argument name 'to' is an attribute of RouterModule"):
            build_router("clash-2", n_layers=3, n_kv_heads=2, head_dim=4)
    finally:
        ROUTERS.pop("clash")


def test_a_depth_mix_class_builds_a_module_that_is_an_instance_of_it():
    cls = DEPTH_MIXES["denseformer"]
    mix = build_depth_mix("denseformer-2", n_layers=4, d_model=8, n_heads=2, n_kv_heads=2, head_dim=4, norm_eps=1e-5,
                          std=0.1)
    assert isinstance(mix, cls) and isinstance(mix, nn.Module) and type(mix).declaration is cls
    assert (mix.dilation, mix.period, mix.spec) == (2, 1, "denseformer-2-1")


def test_a_depth_mix_building_block_is_an_nn_module():
    mix = build_depth_mix("mudd", n_layers=3, d_model=8, n_heads=2, n_kv_heads=2, head_dim=4, norm_eps=1e-5, std=0.1)
    block = mix.proj[0]  # MUDDFormer's DenseWeights, a registry.Submodule
    assert isinstance(block, nn.Module) and type(block).__name__ == "DenseWeights"
    assert [k for k, _ in block.named_parameters()] == ["w1", "w2"]
    assert "proj.0.w1" in mix.state_dict()


@pytest.mark.parametrize("depth_mix", depth_mix_specs())
@pytest.mark.parametrize("router", router_specs((2,)))
def test_models_survive_pickle_and_deepcopy(router, depth_mix):
    torch.manual_seed(0)
    model = build_model(preset("tiny", router=router, depth_mix=depth_mix, n_layers=3)).eval()
    idx = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        want = model(idx)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(twin.router) is type(model.router) and type(twin.depth_mix) is type(model.depth_mix)
        assert twin.router.kind is model.router.kind
        assert list(twin.state_dict()) == list(model.state_dict())
        with torch.no_grad():
            assert torch.equal(twin(idx), want)


def test_a_model_pickled_in_one_process_loads_in_another(tmp_path):
    torch.manual_seed(0)
    model = build_model(preset("tiny", router="first-2", depth_mix="hyper-connections-2", n_layers=3))
    torch.save(model, tmp_path / "model.pt")
    code = ("import torch; m = torch.load('model.pt', weights_only=False); "
            "print(type(m.router).__name__, type(m.depth_mix).__name__, m.router.spec, m.depth_mix.spec)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["FirstRouter", "HyperConnections", "first-2", "hyper-connections-2"]
