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

No torch at the top of this module (the classes are also the declarations a config check reads:
``lime_arch.depth_mix.registry``), so the methods that call torch import it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lime_arch.depth_mix.registry import DepthMix, Submodule, register_depth_mix

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

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        L, C = self.n_layers, self.d_model
        self.ways = [1 if i == L - 1 else WAYS for i in range(L)]
        self.proj = nn.ModuleList([DenseWeights(C, hidden_width(w, i + 2, i == L - 1), w * (i + 2), self.norm_eps)
                                   for i, w in enumerate(self.ways)])
        biases = []
        for i, w in enumerate(self.ways):
            b = torch.zeros(w, i + 2)
            b[:, -1] = 1.0  # current only: X_{i+1}
            biases.append(nn.Parameter(b))
        self.bias = nn.ParameterList(biases)  # b_i: (ways, i + 2)
        self.kv_gain = nn.Parameter(torch.ones(max(L - 1, 0), 2, C))  # (g_k, g_v) of blocks 1..L-1

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        L, C, total = n_layers, d_model, 2 * d_model * max(n_layers - 1, 0)  # the K and V gains
        for i in range(L):
            w, s = (1 if i == L - 1 else WAYS), i + 2
            h = hidden_width(w, s, i == L - 1)
            total += C * h + h * w * s + w * s  # W1, W2 and the bias of block i
        return total

    def decays(self, name: str) -> bool:
        return name.startswith("proj.")

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        memo["outputs"] = [x]  # X_0
        return x

    def sublayer(self, k: int, x, fn: Callable[..., Tensor], memo: dict) -> Tensor:
        l = k // 2
        if k % 2 or l == 0:
            return x + fn(x)  # the MLP, and block 0 (the embedding for all four inputs)
        xq, xk, xv, xr = x
        g = self.kv_gain[l - 1]
        return xr + fn(xq, kv=((xk, g[0]), (xv, g[1])))

    def after_block(self, l: int, x: Tensor, memo: dict):
        import torch

        outputs = memo["outputs"]
        outputs.append(x)  # X_{l+1}
        ways, S = self.ways[l], l + 2
        A = (self.proj[l](x) + self.bias[l].flatten().to(x.dtype)).to(x.dtype)  # (B, T, ways * S)
        A = A.unflatten(-1, (ways, S)).unsqueeze(-1)  # (B, T, ways, S, 1)
        mixes = []
        for c in range(ways):
            y = outputs[0] * A[..., c, 0, :]  # (B, T, C)
            for j in range(1, S):  # fused multiply-adds: no stacked copy of the sources is saved
                y = torch.addcmul(y, A[..., c, j, :], outputs[j])
            mixes.append(y)
        return mixes[0] if ways == 1 else tuple(mixes)  # the final norm's input, or (q, k, v, r)

    def macs_per_token(self) -> int:
        """Per block: RMSNorm(x) W1 C*h, GELU(.) W2 h*ways*S, the mixtures ways*S*C (norm, GELU left out)."""
        total = 0
        for i, w in enumerate(self.ways):
            S = i + 2
            h = hidden_width(w, S, i == self.n_layers - 1)
            total += self.d_model * h + h * w * S + w * S * self.d_model
        return total
