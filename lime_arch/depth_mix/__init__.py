"""The depth-mix axis (``model.depth_mix``): the registry (``registry``), the paper's peers
(``peers``: DenseFormer, Hyper-Connections, value residual) and the 2026 field (``mhc``: mHC,
``attn_res``: Attention Residuals, ``mudd``: MUDDFormer, ``gated``: Qwen's gated residual streams).
Importing the package registers them."""
from lime_arch.depth_mix import attn_res, gated, mhc, mudd, peers  # noqa: F401 - registers them
from lime_arch.depth_mix.registry import (
    DEPTH_MIXES,
    DepthMix,
    MixArg,
    build_depth_mix,
    check_depth_mix,
    depth_mix_specs,
    parse_depth_mix,
    register_depth_mix,
)

__all__ = ["DEPTH_MIXES", "DepthMix", "MixArg", "build_depth_mix", "check_depth_mix", "depth_mix_specs",
           "parse_depth_mix", "register_depth_mix"]
