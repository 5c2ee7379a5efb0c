"""Capture with a depth mix: Hyper-Connections' block outputs are n streams, recorded as their sum
(what the final norm reads); the value residual's recorded values are the mixed ones attention
reads; the end-of-run analysis runs for every registered depth mix."""
import pytest
import torch

import lime_arch.model as lime_model
from lime_arch import build_model, preset
from lime_arch.depth_mix import depth_mix_specs
from orchestrator.analysis.analyze import analyze_model
from orchestrator.analysis.capture import capture
from orchestrator.engine.data import make_batches
from orchestrator.engine.trial_config import DataConfig


def test_hyper_connections_hidden_is_the_sum_of_the_streams():
    model = build_model(preset("tiny", depth_mix="hyper-connections")).eval()
    x = torch.randint(0, 256, (2, 10))
    streams = []
    h = model.blocks[2].register_forward_hook(lambda _m, _i, o: streams.append(o))
    with capture(model) as st:
        model(x)
    h.remove()
    assert streams[0].shape == (2, 10, 4, 64)
    torch.testing.assert_close(st["hidden"][2], streams[0].sum(2), rtol=0, atol=0)


def test_value_residual_values_are_what_attention_reads(monkeypatch):
    model = build_model(preset("tiny", router="full", n_kv_heads=2, depth_mix="value-residual")).eval()
    x = torch.randint(0, 256, (2, 10))
    routed = {}  # the router's output, before the value residual
    make = lime_model.make_mixer

    def recording(router, impl="buffer"):
        mixer = make(router, impl)
        route = mixer.route

        def rec(l, k, v, q=None, x=None):  # the mixer's interface: the layer's query and normed input
            kr, vr = route(l, k, v, q=q, x=x)
            routed[l] = vr.transpose(1, 2).reshape(2, 10, -1)
            return kr, vr

        mixer.route = rec
        return mixer

    monkeypatch.setattr(lime_model, "make_mixer", recording)
    with capture(model) as st:
        model(x)
    torch.testing.assert_close(st["values"][0], routed[0], rtol=0, atol=0)
    for l in (1, 3):
        torch.testing.assert_close(st["values"][l], 0.5 * routed[0] + 0.5 * routed[l], rtol=0, atol=0)
        assert not torch.allclose(st["values"][l], routed[l])
    assert "wrap_mixer" not in vars(model.depth_mix)  # the patch is gone after the context


@pytest.mark.parametrize("spec", depth_mix_specs())
def test_analysis_runs_for_every_depth_mix(spec):
    model = build_model(preset("tiny", vocab_size=257, router="first-2", depth_mix=spec))
    res = analyze_model(model, make_batches(DataConfig()), sequences=4, seq_len=32)
    assert {"analysis/value_entropy/layer_3", "analysis/hidden_entropy/layer_3"} <= set(res.metrics)
