"""MUDDFormer, multiway dynamic dense connections (Xiao et al., arXiv 2502.12170), as a depth mix.

X_0 is the embedding output and X_{i+1} the output of block i (0-based). After block i, per token,
a small MLP of the block output gives dense weights over the i + 2 sources X_0..X_{i+1}, one row
per way, plus a static per-layer bias:
  A_i = GELU(RMSNorm(X_{i+1}) W1_i) W2_i + b_i          (ways, i + 2)
  X^c_{i+1} = sum_j A_i[c, j] X_j                        c in {query, key, value, residual}
and block i + 1 takes the four mixtures as its query, key, value and residual inputs: its
attention reads queries from RMSNorm(X^q), keys from RMSNorm(X^k) and values from RMSNorm(X^v),
and adds its output to X^r; its MLP is the plain residual on top. After the last block there is
one way (the residual) and the mixture is what the final norm reads. Block 0 reads the embedding
for all four. The keys and values still go through the router's mixer (routing composes).

Following the authors' code (Caiyun-AI/MUDDFormer: the PyTorch model and the JAX training code
with the paper's dense weights):
  - RMSNorm of the block output without a gain; exact GELU;
  - MLP hidden width ways * (i + 2) (times 4 after the last block, ``expand_last``), rounded as
    their code does, (h // 64 + 1) * 64 (so 64 becomes 128);
  - init: W1 ~ N(0, 1/C) (fan-in normal), W2 = 0, b_i = e_last for every way ("current only"):
    each mixture is exactly the latest block output at step 0 (0 * X_j adds exactly nothing), so
    step 0 computes the baseline's logits bit for bit (the gradients to rounding: the attention
    norm's backward runs once per Q, K, V input and is summed after it);
  - separate RMSNorms of the Q, K and V inputs (``sepln``): Q reads the block's attention norm;
    K and V read it times a gain of their own (g_k, g_v, init 1), a reparametrisation of separate
    gains (w * g spans every gain) that keeps every shared weight's gradient the baseline's at
    step 0; the authors' separate norms have the same function class.
Weight decay: W1 and W2 (``proj``) decay like every weight matrix; the biases and gains take none.

Trimmed MUDD (the NanoGPT speedrun's record, KellerJordan/modded-nanogpt PR 259: -65 steps at
+1.8% step time over 10 runs per arm), two options that compose:
  - ``mudd-last[-<k>]`` (default 2, the record's): only the last k blocks (l >= L - k, and l >= 1)
    take mixtures as inputs; the earlier blocks are plain residual blocks, and the dense weights
    are computed only after blocks L - k - 1 .. L - 2 and after the last (the final norm's mixture
    stays). Each mixture still weighs every source X_0..X_{i+1} (the record picks a few hand-chosen
    ones). ``mudd-last-<k>`` with k >= L - 1 is ``mudd``.
  - ``mudd-vr`` and ``mudd-vr-last[-<k>]``: only the value and residual ways (2 ways, in that
    order); the query and key read the residual mixture, the block's input as in the record (its
    mixture enters the residual stream the attention reads; MUDDFormer's one-way form reads one
    mixture for all four), so the K input needs no gain of its own and only g_v remains.
The record's "zero-initialised output" (the mixture added to the stream, X_{i+1} + sum_j A'_j X_j,
its MLP's output layer and bias zero) is this module's current-only init reparametrised, b = b' +
e_last: the same function at every step, the same gradients and (the biases take no weight decay,
Adam is shift-invariant) the same updates. So step 0 is the baseline's logits bit for bit here too.

No torch at the top of this module (the classes are also the declarations a config check reads:
``lime_arch.depth_mix.registry``), so the methods that call torch import it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from lime_arch.depth_mix.registry import DepthMix, MixArg, Submodule, register_depth_mix

if TYPE_CHECKING:
    from torch import Tensor
WAYS = 4  # query, key, value, residual


def hidden_width(ways: int, n_sources: int, last: bool) -> int:
    """The dense-weight MLP's hidden width after a block, as the authors' code computes it."""
    h = ways * n_sources * (4 if last else 1)
    return (h // 64 + 1) * 64


class DenseWeights(Submodule):
    """GELU(RMSNorm(x) W1) W2: the dynamic part of one block's dense weights (the bias is kept
    apart: no weight decay). An ``nn.Module`` once built (``Submodule``)."""

    def __init__(self, d_model: int, hidden: int, out: int, eps: float):
        import torch
        from torch import nn

        super().__init__()
        self.eps = eps
        self.w1 = nn.Parameter(torch.randn(d_model, hidden) * d_model ** -0.5)  # fan-in normal
        self.w2 = nn.Parameter(torch.zeros(hidden, out))

    def forward(self, x: Tensor) -> Tensor:
        import torch
        import torch.nn.functional as F

        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)  # (B, T, C)
        return F.gelu(xn @ self.w1) @ self.w2  # (B, T, out)


@register_depth_mix("mudd")
class MUDDFormer(DepthMix):
    """Multiway dynamic dense connections (module docstring)."""

    # the ways of a block before the last: "qkvr" (the paper's four) or "vr" (value and residual)
    channels: ClassVar[str] = "qkvr"

    @classmethod
    def first_consumer(cls, args: dict, n_layers: int) -> int:
        """The first block that takes mixtures as inputs (every block after it does too)."""
        return max(1, n_layers - args["last"]) if "last" in args else 1

    @classmethod
    def n_gains(cls) -> int:
        """The input gains of a block that takes mixtures: (g_k, g_v), or g_v alone (``vr``)."""
        return 1 if cls.channels == "vr" else 2

    @classmethod
    def layout(cls, args: dict, n_layers: int) -> list[tuple[int, int]]:
        """(block i, ways) of every block after which dense weights are computed: those whose next
        block takes mixtures, and the last (the final norm's one way)."""
        L = n_layers
        return [(i, 1 if i == L - 1 else len(cls.channels)) for i in range(cls.first_consumer(args, L) - 1, L)]

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        L, C = self.n_layers, self.d_model
        args = dict(zip((a.name for a in self.arguments), self.arg_values))
        self.first = self.first_consumer(args, L)
        layout = self.layout(args, L)
        self.slot = {i: m for m, (i, _) in enumerate(layout)}  # block i -> its row in proj and bias
        self.ways = [w for _, w in layout]
        self.proj = nn.ModuleList([DenseWeights(C, hidden_width(w, i + 2, i == L - 1), w * (i + 2), self.norm_eps)
                                   for i, w in layout])
        biases = []
        for i, w in layout:
            b = torch.zeros(w, i + 2)
            b[:, -1] = 1.0  # current only: X_{i+1}
            biases.append(nn.Parameter(b))
        self.bias = nn.ParameterList(biases)  # b_i: (ways, i + 2)
        # the K and V gains (g_k, g_v), or g_v alone, of the blocks that take mixtures
        self.kv_gain = nn.Parameter(torch.ones(max(L - self.first, 0), self.n_gains(), C))

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        L, C = n_layers, d_model
        total = C * cls.n_gains() * max(L - cls.first_consumer(args, L), 0)  # the K/V gains
        for i, w in cls.layout(args, L):
            s = i + 2
            h = hidden_width(w, s, i == L - 1)
            total += C * h + h * w * s + w * s  # W1, W2 and the bias after block i
        return total

    def decays(self, name: str) -> bool:
        return name.startswith("proj.")

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        memo["outputs"] = [x]  # X_0
        return x

    def sublayer(self, k: int, x, fn: Callable[..., Tensor], memo: dict) -> Tensor:
        l = k // 2
        if k % 2 or l < self.first:
            return x + fn(x)  # the MLP, and the blocks before the first that takes mixtures
        xq, xk, xv, xr = x
        g = self.kv_gain[l - self.first]
        g_k, g_v = (1.0, g[0]) if self.channels == "vr" else (g[0], g[1])  # vr: K reads what Q reads
        return xr + fn(xq, kv=((xk, g_k), (xv, g_v)))

    def after_block(self, l: int, x: Tensor, memo: dict):
        import torch

        outputs = memo["outputs"]
        outputs.append(x)  # X_{l+1}
        m = self.slot.get(l)
        if m is None:
            return x  # the next block is a plain one
        ways, S = self.ways[m], l + 2
        A = (self.proj[m](x) + self.bias[m].flatten().to(x.dtype)).to(x.dtype)  # (B, T, ways * S)
        A = A.unflatten(-1, (ways, S)).unsqueeze(-1)  # (B, T, ways, S, 1)
        mixes = []
        for c in range(ways):
            y = outputs[0] * A[..., c, 0, :]  # (B, T, C)
            for j in range(1, S):  # fused multiply-adds: no stacked copy of the sources is saved
                y = torch.addcmul(y, A[..., c, j, :], outputs[j])
            mixes.append(y)
        if ways == 1:
            return mixes[0]  # the final norm's input
        if ways == WAYS:
            return tuple(mixes)  # (q, k, v, r)
        v, r = mixes
        return r, r, v, r  # vr: the query and key read the residual mixture

    def macs_per_token(self) -> int:
        """Per block with dense weights: RMSNorm(x) W1 C*h, GELU(.) W2 h*ways*S, the mixtures ways*S*C
        (norm, GELU left out)."""
        total = 0
        for i, w in zip(self.slot, self.ways):
            S = i + 2
            h = hidden_width(w, S, i == self.n_layers - 1)
            total += self.d_model * h + h * w * S + w * S * self.d_model
        return total


@register_depth_mix("mudd-last")
class LastLayersMUDDFormer(MUDDFormer):
    """MUDDFormer in the last ``last`` blocks only (the NanoGPT speedrun's trim; module docstring)."""

    arguments = (MixArg("last", 2),)
    last: int


@register_depth_mix("mudd-vr")
class ValueResidualMUDDFormer(MUDDFormer):
    """MUDDFormer with the value and residual ways only (the NanoGPT speedrun's trim; module docstring)."""

    channels = "vr"


@register_depth_mix("mudd-vr-last")
class LastLayersValueResidualMUDDFormer(ValueResidualMUDDFormer):
    """Both trims: the value and residual ways, in the last ``last`` blocks only."""

    arguments = (MixArg("last", 2),)
    last: int
