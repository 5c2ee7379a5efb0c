"""Bytes a forward keeps for backward: autograd's saved storages (each once, parameters left out)
plus the K/V buffers the routing holds outside them. The trainer's memory metrics
(``orchestrator.engine.memory``) and the benchmark's peer table (``orchestrator.bench.peers``)
count with the same code."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from lime_arch.routing.state import held_bytes


def storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """Unique storages of the tensors: data pointer -> bytes."""
    out = {}
    for t in tensors:
        s = storage(t)
        if s is not None:
            out[s.data_ptr()] = s.nbytes()
    return out


def storage(t: torch.Tensor):
    """The storage holding ``t``'s data on this process; a sharded (FSDP2 DTensor) parameter's is its
    local shard; None for tensor subclasses without one."""
    local = t.to_local() if hasattr(t, "to_local") else t
    try:
        s = local.untyped_storage()
        s.data_ptr()
    except RuntimeError:
        return None
    return s


class SavedBytes:
    """Bytes autograd saves for backward inside ``with counter.track():``, each storage once, the
    ``exclude`` tensors' storages (the parameters) left out."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.exclude = set(storages(exclude))
        self.seen: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        s = storage(t)
        if s is not None and s.data_ptr() not in self.exclude and s.device.type != "meta":
            self.seen[s.data_ptr()] = s.nbytes()
        return t

    @contextlib.contextmanager
    def track(self) -> Iterator[SavedBytes]:
        self.seen = {}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self

    @property
    def nbytes(self) -> int:
        return sum(self.seen.values())


def saved_activation_bytes(fn, *args, exclude: Iterable[torch.Tensor] = (), **kwargs):
    """``(fn(*args, **kwargs), bytes it keeps for backward)``: autograd's saved storages (each once,
    ``exclude``'s storages left out) plus the routing buffers it opened."""
    counter = SavedBytes(exclude)
    before = held_bytes()
    with counter.track():
        out = fn(*args, **kwargs)
    return out, counter.nbytes + max(0, held_bytes() - before)
