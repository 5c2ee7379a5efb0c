"""The depth-mix axis (``model.depth_mix``): the registry (``registry``) and the paper's peers
(``peers``: DenseFormer, Hyper-Connections, value residual). Importing the package registers them."""
from lime_arch.depth_mix import peers  # noqa: F401 - registers the peers
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
