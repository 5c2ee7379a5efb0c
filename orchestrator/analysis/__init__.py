"""Representation analysis of LIMe models (see docs/ARCHITECTURE.md, "Analysis").

The metrics are re-exported here; the plots live in ``orchestrator.analysis.plots`` so that
importing the metrics does not pull in matplotlib.
"""

from orchestrator.analysis.metrics import (
    expected_source_layer,
    layer_entropies,
    probe_accuracy,
    renyi_entropy,
    router_source_map,
)

__all__ = [
    "expected_source_layer",
    "layer_entropies",
    "probe_accuracy",
    "renyi_entropy",
    "router_source_map",
]
