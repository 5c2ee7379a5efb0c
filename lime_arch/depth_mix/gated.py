"""The gated residual hyper-connection of Qwen's 2026 models (Qwen4-Exp / Qwen3.8-Flash-Next, its
``GatedResidual``; x-transformers 2.31.10 has a port as ``gated_multi_residual``, class ``GatedMultiResidual``),
as a depth mix: ``gated-residual[-<rate>[-<rank>]]``, defaults 4 streams and rank 8 (C/8 at the field
sweep's width 64: Qwen's ratio, 320 at C = 2560).

Like Hyper-Connections (``lime_arch.depth_mix.peers``) the residual stream is n streams H (B, T, n, C), all
the embedding output at first; unlike HC and mHC there is no n x n stream-mixing matrix: every stream
only accumulates sublayer outputs. Sublayer k (k = 2l attention, 2l + 1 MLP of layer l) reads and writes
them through (per token; H_i is stream i, vec(u) the n normalised streams flattened stream-major, nC):
  u_i   = RMSNorm(H_i) * (1 + gamma_{k,i})                    per stream, over its C channels
  a     = SiLU(vec(u) D_k / n)                                 (r,)      the low-rank bottleneck
  G_i   = sigmoid(S_{k,i} + (a U_k)_i)                         (C,)      the read gate, per channel
  h     = (1/n) sum_i G_i * u_i                                (C,)      the sublayer's input
  w_i   = 2 sigmoid((vec(u) J_k)_i / n)                        (n,)      the write scalar, per stream
  H'_i  = H_i + w_i sublayer(h)
with gamma_k (n, C) a zero-centred norm gain, D_k (nC, r), U_k (r, nC), S_k (n, C) the static read logits
and J_k (nC, n) per sublayer. After the last layer a learned output mixer (Qwen's hyper_connection_mixer:
the same read without a write, gamma, D, U and S of its own, index k = 2L) contracts the streams into what
the final norm reads. All but S are Qwen4-Exp's (transformers' modular_qwen4_exp); S is x-transformers'.

Init: gamma = 0, U = 0, J = 0, S = 1 on stream k mod n and 0 elsewhere (x-transformers' identity anchor: it
breaks the streams' symmetry, as HC's a_m does), D ~ N(0, std^2) (the model's init std). U = 0 alone zeroes
the gate's dynamic part; D stays random because with both factors zero neither would ever get a gradient
(dU is a outer dG, dD goes through U). So at step 0 every stream is the plain residual stream (w =
2 sigmoid(0) = 1 exactly) and the sublayer reads h = c RMSNorm(x), c = (sigmoid(1) + (n - 1)/2) / n; the
block's pre-norm maps c RMSNorm(x) back to RMSNorm(x), as the final norm does after the mixer: the model is
the plain pre-norm residual model up to the norms' eps (the tests check it in float64 with a negligible eps;
at the default eps the block's norm, now reading a unit-scale input, weighs eps less than the baseline's does
on the small embedding: the tiny preset's step-0 fp32 logits differ from the none model's by up to 6.5e-3).

Where this differs from Qwen's code or x-transformers' port (docs/MODEL.md, the deviation table):
  - the block keeps its own pre-norm (RMSNorm with gain) after the read; both references drop it (the read
    normalises). Kept so the shared weights and the step-0 model are the ``none`` model's (paired
    comparisons); without it the sublayer would read c RMSNorm(x) at step 0, not the plain model;
  - the init: Qwen's code draws every projection normal and has no static logits (step 0 not a plain
    residual); x-transformers zero-inits U and the write projection, draws D with nn.Linear's default
    (uniform, std 1/sqrt(3 nC)) and scales the bottleneck by a learned scalar (0.01 at init), left out;
  - the write scalar from vec(u) J directly (Qwen); x-transformers takes it from the shared bottleneck a
    plus a static per-stream logit;
  - the final readout: Qwen's learned mixer; x-transformers sums the streams (and adds a zero-initialised
    learned embedding per stream at the start, left out);
  - the read in fp32 (or the streams' dtype if wider) with autocast off, like mHC's coefficients; Qwen keeps
    the norm in fp32 and runs the projections in the model's dtype.
``hidden`` (analysis) reads the mean of the streams, the residual stream's scale (the baseline's residual
stream exactly at step 0); the final norm reads the output mixer. Weight decay: D, U and J (``proj``) decay
like every weight matrix; gamma and S take none. The mixing is per token, so cached decoding is exact.

No torch at the top of this module (the classes are also the declarations a config check reads:
``lime_arch.depth_mix.registry``), so the methods that call torch import it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lime_arch.depth_mix.peers import _full_precision
from lime_arch.depth_mix.registry import DepthMix, MixArg, Submodule, register_depth_mix

if TYPE_CHECKING:
    from torch import Tensor


class GatedReadWeights(Submodule):
    """The projections of one read: D (nC, r), U (r, nC) and, for a sublayer (not the output mixer), J
    (nC, n). An ``nn.Module`` once built (``Submodule``); its parameters are ``down``, ``up``, ``inject``."""

    def __init__(self, n: int, d_model: int, rank: int, std: float, write: bool):
        import torch
        from torch import nn

        super().__init__()
        width = n * d_model
        self.down = nn.Parameter(torch.randn(width, rank) * std)
        self.up = nn.Parameter(torch.zeros(rank, width))
        if write:
            self.inject = nn.Parameter(torch.zeros(width, n))


@register_depth_mix("gated-residual")
class GatedResidual(DepthMix):
    """Qwen's gated residual streams: n streams, a per-channel sigmoid read gate from a rank-r bottleneck,
    a per-stream write scalar, a learned output mixer (module docstring)."""

    arguments = (MixArg("rate", 4), MixArg("rank", 8))
    rate: int
    rank: int

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        n, K = self.rate, 2 * self.n_layers
        # reads 0..K-1 are the sublayers', read K the output mixer's (no write)
        self.proj = nn.ModuleList([GatedReadWeights(n, self.d_model, self.rank, self.std, k < K) for k in range(K + 1)])
        self.gain = nn.Parameter(torch.zeros(K + 1, n, self.d_model))  # gamma: the norm gain is 1 + gamma
        logits = torch.zeros(K + 1, n, self.d_model)  # S: 1 on stream k mod n, every channel
        for k in range(K + 1):
            logits[k, k % n] = 1.0
        self.read_logit = nn.Parameter(logits)

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        n, r, K = args["rate"], args["rank"], 2 * n_layers
        read = n * d_model * (2 * r + 2)  # D, U, gamma and S of one read
        return (K + 1) * read + K * n * d_model * n  # and J of every sublayer

    def decays(self, name: str) -> bool:
        return name.startswith("proj.")

    def read(self, k: int, H: Tensor) -> tuple[Tensor, Tensor | None]:
        """Read k of the streams H (B, T, n, C): the sublayer's input h (B, T, C) and the write scalars w
        (B, T, n) (None for the output mixer, k = 2L), in fp32 or wider."""
        import torch
        import torch.nn.functional as F

        n, p = self.rate, self.proj[k]
        with _full_precision(H):
            Hf = H.to(torch.promote_types(H.dtype, torch.float32))
            dt = Hf.dtype
            u = Hf * torch.rsqrt(Hf.pow(2).mean(-1, keepdim=True) + self.norm_eps) * (1 + self.gain[k].to(dt))
            flat = u.flatten(-2)  # vec(u): (B, T, nC), stream-major
            a = F.silu(flat @ p.down.to(dt) / n)  # (B, T, r)
            logits = (a @ p.up.to(dt)).unflatten(-1, (n, self.d_model)) + self.read_logit[k].to(dt)  # (B, T, n, C)
            h = (torch.sigmoid(logits) * u).mean(-2)  # (B, T, C)
            w = 2 * torch.sigmoid(flat @ p.inject.to(dt) / n) if k < 2 * self.n_layers else None  # (B, T, n)
        return h, w

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.rate, x.shape[-1])  # (B, T, n, C)

    def sublayer(self, k: int, H: Tensor, fn: Callable[[Tensor], Tensor], memo: dict) -> Tensor:
        h, w = self.read(k, H)
        y = fn(h.to(H.dtype))
        with _full_precision(H):
            return H + w.to(H.dtype).unsqueeze(-1) * y.unsqueeze(-2)  # (B, T, n, C)

    def end(self, H: Tensor, memo: dict) -> Tensor:
        h, _ = self.read(2 * self.n_layers, H)
        return h.to(H.dtype)

    def hidden(self, H: Tensor) -> Tensor:
        return H.mean(-2)  # the residual stream's scale: the baseline's stream exactly at step 0

    def macs_per_token(self) -> int:
        """Per sublayer: vec(u) D n*C*r, a U r*n*C, the gated mean n*C, vec(u) J n*C*n and the write n*C;
        the output mixer: the read alone (2 n*C*r + n*C). The norms, SiLU and sigmoids are left out like
        every norm and activation."""
        n, C, r = self.rate, self.d_model, self.rank
        read = 2 * n * C * r + n * C
        return 2 * self.n_layers * (read + n * C * n + n * C) + read
