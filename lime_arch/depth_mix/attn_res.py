"""Attention Residuals, AttnRes (Kimi team, arXiv 2603.15031), as depth mixes: full and block.

The residual stream's fixed sum is replaced by softmax attention over depth. The sources are
v_0, the embedding output, and v_{k+1}, the output of sublayer k (k = 2l attention, 2l + 1 MLP
of layer l). Sublayer k reads
  h_k = sum_{i <= k} a_{i,k} v_i,   a_{., k} = softmax_i(w_k . RMSNorm(v_i)),
with one learned pseudo-query w_k (C,) per sublayer; the final norm reads the same mixture of
all 2L + 1 sources with a pseudo-query of its own (w_{2L}). The keys are RMS-normalised without
a gain (a gain g would be redundant: w . (g * n(v)) = (w * g) . n(v)), so a large-magnitude
source does not dominate by its size alone; the values are the sources themselves.

Zero init (the paper's): every a_{., k} is uniform at step 0, so sublayer k reads the mean
x_k / (k + 1) of the embedding and the outputs before it, where x_k is exactly the plain
residual stream the baseline's sublayer k reads. The pre-norm maps c x to RMSNorm(x) with eps/c^2,
so step 0 is the baseline with sublayer k's norm eps divided by (k + 1)^2 and the final norm's by
(2L + 1)^2 (checked in float64 with a negligible eps; at eps = 1e-5 and small activations the
difference is not negligible, which is part of the method: its inputs are convex mixtures).

Block AttnRes (``attn-res-block-<size>``): the 2L sublayers are cut into consecutive blocks of
``size`` sublayers (the last one shorter if size does not divide 2L; the authors' ``block_size``
also counts attention and MLP sublayers). The default, 4 (two layers per block), gives the paper's
~8 blocks at 16 layers, its 1B models' depth; a deeper model wants a larger size for 8 blocks
(32 layers: ``attn-res-block-8``). A block summary b_{m+1} is the plain sum of block m's sublayer
outputs (a standard residual within the block), b_0 is the embedding. Sublayer k of block m reads
the softmax mixture of the completed summaries b_0..b_m and, past the block's first sublayer, the
running partial sum of block m; the final norm reads the mixture of all summaries. Size 1 is full
AttnRes exactly; a size of 2L or more is one block (every sublayer reads the embedding and the
partial sum). Memory: full AttnRes keeps every source (O(L C) per token, the same tensors the
sublayers' backward keeps anyway) and one normalised copy of each; the block variant keeps
O(blocks C).

What the decoder threads from sublayer to sublayer (the residual state) is the plain running sum
of the sources, i.e. the baseline's residual stream value for the analysis hooks; no sublayer
reads it. The weighted sums are chains of fused multiply-adds (no stacked copy of the sources per
sublayer, which would save O(L^2) activations). Cached decoding is exact: the mixing is per
token. The pseudo-queries take no weight decay (mixing vectors, like the router's weights).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lime_arch.depth_mix.peers import _full_precision
from lime_arch.depth_mix.registry import DepthMix, MixArg, register_depth_mix

if TYPE_CHECKING:
    from torch import Tensor


@register_depth_mix("attn-res")
class AttentionResiduals(DepthMix):
    """Full Attention Residuals: every sublayer and the final norm read a softmax mixture of the
    embedding and all earlier sublayer outputs (module docstring)."""

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        return (2 * n_layers + 1) * d_model  # one query per sublayer and the final norm

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        self.queries = nn.Parameter(torch.zeros(2 * self.n_layers + 1, self.d_model))  # w_k; the last: final norm

    def key(self, v: Tensor) -> Tensor:
        """RMSNorm(v) without a gain, fp32 or wider: (B, T, C)."""
        import torch

        vf = v.to(torch.promote_types(v.dtype, torch.float32))
        return vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + self.norm_eps)

    def read(self, k: int, values: list[Tensor], keys: list[Tensor]) -> Tensor:
        """sum_i softmax_i(w_k . keys_i) values_i: (B, T, C)."""
        import torch

        w = self.queries[k]
        with _full_precision(values[0]):
            logits = torch.stack([key @ w.to(key.dtype) for key in keys])  # (S, B, T)
            a = logits.softmax(0).to(values[0].dtype).unsqueeze(-1).unbind(0)  # S x (B, T, 1)
            h = values[0] * a[0]
            for ai, v in zip(a[1:], values[1:]):
                h = torch.addcmul(h, ai, v)
            return h

    def _push(self, v: Tensor, memo: dict) -> None:
        v = v.to(memo["values"][0].dtype)  # the residual stream's dtype (fp32 under bf16 autocast)
        memo["values"].append(v)
        memo["keys"].append(self.key(v))

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        memo["values"], memo["keys"] = [x], [self.key(x)]
        return x

    def sublayer(self, k: int, x: Tensor, fn: Callable[[Tensor], Tensor], memo: dict) -> Tensor:
        v = fn(self.read(k, memo["values"], memo["keys"]))
        self._push(v, memo)
        return x + v  # the plain running sum (nothing reads it: module docstring)

    def end(self, x: Tensor, memo: dict) -> Tensor:
        return self.read(2 * self.n_layers, memo["values"], memo["keys"])

    def sources(self, k: int) -> int:
        """How many sources sublayer k reads (k = 2L: the final norm)."""
        return k + 1

    def macs_per_token(self) -> int:
        """Per reader with S sources: S*C for the scores w . key and S*C for the weighted sum; the key
        norms, the softmax and the running sum are left out (norms and adds)."""
        return sum(2 * self.sources(k) * self.d_model for k in range(2 * self.n_layers + 1))


@register_depth_mix("attn-res-block")
class BlockAttentionResiduals(AttentionResiduals):
    """Block Attention Residuals, blocks of ``size`` consecutive sublayers: plain residuals within a
    block, softmax attention over the block summaries and the running partial sum."""

    arguments = (MixArg("size", 4),)
    size: int

    def __init__(self, **kw):
        super().__init__(**kw)
        self.n_blocks = -(-2 * self.n_layers // self.size)  # ceil(2L / size)

    def sources(self, k: int) -> int:
        if k == 2 * self.n_layers:
            return self.n_blocks + 1
        return k // self.size + 1 + (k % self.size > 0)  # b_0..b_m, and the partial sum past the block's first

    def sublayer(self, k: int, x: Tensor, fn: Callable[[Tensor], Tensor], memo: dict) -> Tensor:
        summaries, keys = memo["values"], memo["keys"]  # b_0 (the embedding) and the completed blocks
        partial = memo.get("partial")
        if partial is None:  # the block's first sublayer
            h = self.read(k, summaries, keys)
        else:
            h = self.read(k, summaries + [partial], keys + [self.key(partial)])
        v = fn(h).to(summaries[0].dtype)
        partial = v if partial is None else partial + v
        last = k + 1 == 2 * self.n_layers or (k + 1) % self.size == 0
        if last:  # the block is complete: its sum is a summary
            self._push(partial, memo)
            partial = None
        memo["partial"] = partial
        return x + v
