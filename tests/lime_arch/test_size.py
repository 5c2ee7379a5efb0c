"""``lime_arch.size`` counts a depth mix's weights torch-free (``DepthMix.param_count``), so the size
guards see Hyper-Connections' and mHC's, which grow as the square and the cube of the stream count.
Every registered depth mix's count is held to the module it builds (its parameters' numel)."""
from __future__ import annotations

import pytest

from lime_arch import preset
from lime_arch.depth_mix import build_depth_mix, depth_mix_specs
from lime_arch.size import dense_param_counts, depth_mix_params, min_params

SPECS = sorted(set(depth_mix_specs()) | {"denseformer-2", "denseformer-2-2", "denseformer-1-2", "hyper-connections-3",
                                         "hyper-connections-static-2", "hyper-connections-corl-5", "mhc-3-5",
                                         "mhc-sigmoid-2", "mhc-readout-3-5", "attn-res-block-3",
                                         "attn-res-additive-block-3", "mudd-last-1", "mudd-vr-last-3", "mhc-asym-3-5",
                                         "hyper-connections-asym-2",
                                         "value-residual-learned"})


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n_layers,d_model", [(2, 8), (3, 8), (5, 12)])
def test_every_depth_mix_counts_the_weights_it_builds(spec, n_layers, d_model):
    cfg = preset("tiny", n_layers=n_layers, d_model=d_model, n_heads=2, ffn_dim=16, depth_mix=spec)
    built = build_depth_mix(spec, n_layers=n_layers, d_model=d_model, n_heads=2, n_kv_heads=cfg.kv_heads,
                            head_dim=cfg.head_dim, norm_eps=cfg.norm_eps, std=cfg.std)
    assert depth_mix_params(cfg) == sum(p.numel() for p in built.parameters())


def test_the_lower_bound_holds_the_depth_mix():
    # mHC with n streams: per sublayer phi (nC x n(n+2)), 3 gates and n(n+2) biases; 2 sublayers per layer
    cfg = preset("tiny", depth_mix="mhc-100000")
    n, C, K = 100_000, cfg.d_model, 2 * cfg.n_layers
    assert depth_mix_params(cfg) == K * (n * C * n * (n + 2) + 3 + n * (n + 2))
    dense = dense_param_counts(cfg)
    assert min_params(cfg) == dense["body"] + dense["embedding"] + depth_mix_params(cfg)
    # Hyper-Connections with n streams: alpha n(n+1), beta n, W C(n+2), two scales per sublayer
    cfg = preset("tiny", depth_mix="hyper-connections-1000000")
    n = 1_000_000
    assert depth_mix_params(cfg) == K * (n * (n + 1) + n + C * (n + 2) + 2)
