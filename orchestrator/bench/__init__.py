"""The routing benchmark: step time, peak memory, FLOPs and decode speed of every router vs ``none``.

Run it with ``lime bench`` (``--no-track`` to skip MLflow). Modules, bottom up:
  shapes   what is measured: shapes, batch, vocabulary, the peer, the routers (torch-free)
  step     one training step of a case: model config, AdamW, clock, the shared decoder body
  memory   peak memory of a step (subprocess worker), memory bandwidth, routing traffic
  alone    the routing's forward and backward outside the model
  timing   paired step and decode timing against ``none``, sign-test intervals
  stopping when a row stops adding paired rounds: its sign confidence sequence decides its target (torch-free)
  targets  the targets and verdicts (torch-free)
  outputs  bench.md, bench.csv, decode.csv (torch-free)
  run      ``run_bench``: all of the above, in order
  profile  ``run_profile`` (``lime bench --profile``): the routing's products against reference GEMMs
  peers    ``lime bench --peers``: x-transformers and the hyper-connections package (``peer_models``, the
           optional extra) beside the project's rows, each against its own baseline (``peer_table``: its
           section of bench.md and peers.csv, torch-free)
  throughput ``lime report --throughput``: a sweep's models at its shape, timed in paired rounds

``run_bench`` and ``run_profile`` load lazily (PEP 562, as ``lime_arch``'s public names do): ``lime bench --help``
and the option checks of ``orchestrator.cli.bench`` import this package without torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"run_bench": "orchestrator.bench.suite", "run_profile": "orchestrator.bench.profile"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'orchestrator.bench' has no attribute {name!r}")
