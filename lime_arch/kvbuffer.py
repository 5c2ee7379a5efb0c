"""Executing the routing: the K/V buffer and its mixers.

Design (why it is fast and lean):
- Every layer writes its raw, pre-RoPE K and V once into a preallocated buffer
  ``buf`` of shape (D, L*R, N): row ``s*R + h`` holds head h of layer s. For scalar
  routers D = 1 and N = 2*B*T*Hd (K and V side by side, so one product mixes both); for
  per-dim routers D = Hd and N = 2*B*T (a batch of Hd products). Routing of layer l is then a
  handful of batched matrix products ``W[:, run] @ buf[run rows]``, one per contiguous run of
  source slots (1 for full/last-j, 2 for first-j, |S_l| for dilated-d) reading views of the
  buffer: no concatenation, nothing copied per layer, so memory is O(L), not O(L^2).
- Writing into a tensor in place breaks autograd's saved-tensor checks, so two custom
  autograd functions do the bookkeeping. ``_Write`` puts K/V into the buffer and returns a
  scalar *token*; ``_Route`` takes layer l's token and mixes. In backward, every ``_Route``
  adds ``W^T grad`` into a gradient buffer, and ``_Write_l`` hands out slot l's gradient.
  Tokens are chained (``_Write_l`` consumes ``_Write_{l-1}``'s token), so the autograd engine
  runs ``_Write_l``'s backward only after every ``_Route_{l' >= l}``: the slot's gradient is
  complete by then. The only extra activation memory over the baseline is one copy of the raw
  K/V (and its gradient during backward); the paper's concatenation holds O(L^2).
- The uniform average needs no buffer at all: a running sum divided by l+1.
- ``ConcatMixer`` is the paper's pseudocode (grow the buffer by concatenation at every layer,
  multiply with the dense router): the benchmark's peer and an independent reference.
Every mixer maps raw K/V of the current tokens (B, T, R, Hd) to routed K/V (B, R, T, Hd).
Routing is per position, so the same code serves training, prefill and one-token decoding.
"""
from __future__ import annotations

import torch
from torch.autograd import Function

from .routers import Router

Tensor = torch.Tensor


def _runs(sources: list[int], R: int) -> list[tuple[int, int, int, int]]:
    """Contiguous runs of source slots as (col0, col1, row0, row1) into (W columns, buffer rows)."""
    runs, i = [], 0
    while i < len(sources):
        j = i
        while j + 1 < len(sources) and sources[j + 1] == sources[j] + 1:
            j += 1
        runs.append((i * R, (j + 1) * R, sources[i] * R, (sources[j] + 1) * R))
        i = j + 1
    return runs


class _BufferState:
    """The preallocated buffer of one forward pass, and its gradient during backward."""

    def __init__(self, L: int, R: int, perdim: bool, k: Tensor):
        B, T, _, Hd = k.shape
        self.L, self.R, self.B, self.T, self.Hd, self.perdim = L, R, B, T, Hd, perdim
        D, N = (Hd, 2 * B * T) if perdim else (1, 2 * B * T * Hd)
        self.buf = k.new_empty(D, L * R, N)
        self.grad: Tensor | None = None

    def slot(self, t: Tensor, l: int) -> tuple[Tensor, Tensor]:
        """Views of slot l of ``t`` (buffer or its gradient) as K, V in (B, T, R, Hd) order."""
        L, R, B, T, Hd = self.L, self.R, self.B, self.T, self.Hd
        if self.perdim:
            kv = t.view(Hd, L, R, 2, B, T)[:, l]  # (Hd, R, 2, B, T)
            return kv[:, :, 0].permute(2, 3, 1, 0), kv[:, :, 1].permute(2, 3, 1, 0)
        kv = t.view(L, R, 2, B, T, Hd)[l]  # (R, 2, B, T, Hd)
        return kv[:, 0].permute(1, 2, 0, 3), kv[:, 1].permute(1, 2, 0, 3)

    def split(self, out: Tensor) -> tuple[Tensor, Tensor]:
        """Routed (D, R, N) -> K, V as (B, R, T, Hd)."""
        R, B, T, Hd = self.R, self.B, self.T, self.Hd
        if self.perdim:
            k, v = out.view(Hd, R, 2, B, T).unbind(2)  # (Hd, R, B, T) each
            return k.permute(2, 1, 3, 0), v.permute(2, 1, 3, 0)
        k, v = out.view(R, 2, B, T, Hd).unbind(1)  # (R, B, T, Hd) each
        return k.transpose(0, 1), v.transpose(0, 1)

    def mix(self, w3: Tensor, runs) -> Tensor:
        w3 = w3.to(self.buf.dtype)
        out = None
        for c0, c1, r0, r1 in runs:
            a, b = w3[:, :, c0:c1], self.buf[:, r0:r1]  # (D, R, n), (D, n, N)
            out = torch.bmm(a, b) if out is None else out.baddbmm_(a, b)
        return out  # (D, R, N)


class _Write(Function):
    @staticmethod
    def forward(ctx, k: Tensor, v: Tensor, prev_token: Tensor, state: _BufferState, l: int):
        bk, bv = state.slot(state.buf, l)
        bk.copy_(k)
        bv.copy_(v)
        ctx.state, ctx.l = state, l
        return k.new_zeros(())

    @staticmethod
    def backward(ctx, g_token: Tensor):
        state, l = ctx.state, ctx.l
        gk = gv = None
        if state.grad is not None:
            gk, gv = state.slot(state.grad, l)
        if l == 0:  # the last backward of the chain: free the gradient buffer
            state.grad = None
        return gk, gv, torch.zeros_like(g_token), None, None


class _Route(Function):
    @staticmethod
    def forward(ctx, w3: Tensor, token: Tensor, state: _BufferState, runs):
        ctx.save_for_backward(w3)
        ctx.state, ctx.runs = state, runs
        return state.mix(w3, runs)

    @staticmethod
    def backward(ctx, g: Tensor):
        (w3,) = ctx.saved_tensors
        state = ctx.state
        if state.grad is None:
            state.grad = torch.zeros_like(state.buf)
        g = g.to(state.buf.dtype)
        wc = w3.to(g.dtype)
        gw = torch.empty_like(w3)
        for c0, c1, r0, r1 in ctx.runs:
            buf = state.buf[:, r0:r1]  # (D, n, N)
            gw[:, :, c0:c1] = torch.bmm(g, buf.transpose(1, 2))  # (D, R, n)
            state.grad[:, r0:r1].baddbmm_(wc[:, :, c0:c1].transpose(1, 2), g)  # (D, n, N)
        return gw, torch.zeros((), dtype=g.dtype, device=g.device), None, None


class IdentityMixer:
    def __init__(self, router: Router):
        self.router = router

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k.transpose(1, 2), v.transpose(1, 2)


class MeanMixer:
    """Uniform average of layers 0..l as a running sum: O(1) work per layer."""

    def __init__(self, router: Router):
        self.router = router
        self.sk = self.sv = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.sk = k if l == 0 else self.sk + k
        self.sv = v if l == 0 else self.sv + v
        return (self.sk / (l + 1)).transpose(1, 2), (self.sv / (l + 1)).transpose(1, 2)


class BufferMixer:
    """Learned routers (linear and per-dim) over the preallocated buffer."""

    def __init__(self, router: Router):
        self.router = router
        self.state: _BufferState | None = None
        self.token: Tensor | None = None
        self.runs = getattr(router, "_runs_cache", None)
        if self.runs is None:  # sources never change: compute the runs once per router
            self.runs = [_runs(router.sources(l), router.R) for l in range(router.n_layers)]
            router._runs_cache = self.runs

    def _w3(self, l: int) -> Tensor | None:
        w = self.router.weight(l)
        if w is None:
            return None
        return w.unsqueeze(0) if w.dim() == 2 else w.permute(2, 0, 1)  # (D, R, |S|R)

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if l == 0:
            self.state = _BufferState(self.router.n_layers, self.router.R, self.router.kind == "perdim", k)
            self.token = k.new_zeros(())
        st, w3 = self.state, self._w3(l)
        track = torch.is_grad_enabled() and (k.requires_grad or (w3 is not None and w3.requires_grad))
        if track:
            self.token = _Write.apply(k, v, self.token, st, l)
        else:
            bk, bv = st.slot(st.buf, l)
            bk.copy_(k)
            bv.copy_(v)
        if w3 is None:  # layer 0 reads its own K/V
            return k.transpose(1, 2), v.transpose(1, 2)
        out = _Route.apply(w3, self.token, st, self.runs[l]) if track else st.mix(w3, self.runs[l])
        return st.split(out)


class ConcatMixer:
    """The paper's pseudocode: concatenate the whole buffer at every layer, then multiply."""

    def __init__(self, router: Router):
        self.router = router
        self.kb = self.vb = None

    def route(self, l: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.kb = k if l == 0 else torch.cat([self.kb, k], dim=2)  # (B, T, (l+1)R, Hd)
        self.vb = v if l == 0 else torch.cat([self.vb, v], dim=2)
        if l == 0 or self.router.kind == "identity":
            return k.transpose(1, 2), v.transpose(1, 2)
        d = self.router.dense(l).to(device=k.device, dtype=k.dtype)
        eq = "hc,btcd->bhtd" if d.dim() == 2 else "hcd,btcd->bhtd"
        return torch.einsum(eq, d, self.kb), torch.einsum(eq, d, self.vb)


_MIXERS = {"identity": IdentityMixer, "mean": MeanMixer, "linear": BufferMixer, "perdim": BufferMixer}


def make_mixer(router: Router, routing_impl: str = "buffer"):
    """A fresh mixer for one forward pass."""
    if routing_impl == "concat":
        return ConcatMixer(router)
    return _MIXERS[router.kind](router)
