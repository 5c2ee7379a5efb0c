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

Additive Attention Residuals (``attn-res-additive``, ``attn-res-additive-block-<size>``; Delta
AttnRes, arXiv 2605.18855 and its authors' code, wdlctc/delta-attention-residuals-code): the same
sources and scores, but the mixture is added to the residual stream instead of replacing it,
  h_k = x_k + sum_{i} a_{i,k} s_i   (k >= 1),   h_0 = x_0,   the final norm reads x_{2L},
with x_k the plain residual stream (the running sum the decoder threads) and s_i sublayer k's
sources as above (full: the embedding and every earlier output; block: the summaries and the
partial sum). As in the authors' code (its ``delta`` mode) the first sublayer has no source of its
own (its only one would be the embedding, already x_0) and the final norm reads the plain stream,
so there are 2L - 1 pseudo-queries, one per sublayer 1..2L-1. Zero init, as AttnRes: the sources
of sublayer k sum to x_k, so at step 0 it reads x_k (1 + 1/n_k), n_k its number of sources, which
the pre-norm maps to RMSNorm(x_k) with eps / (1 + 1/n_k)^2: the baseline up to the norm eps (the
residual stream survives, the paper's point; not bit for bit). Where this differs from the
authors' code (docs/MODEL.md, deviations): their from-scratch runs draw the pseudo-queries from
N(0, 0.02) (Hugging Face's Linear init; their fine-tuning and AttnRes: zero), their key norm has a
learned gain (redundant, see above), and their block mode reads only the completed block deltas
(no partial sum) with the new block's delta joining one sublayer late; here the block form reads
exactly attn-res-block's sources, so it differs from it in the routing alone, as the paper frames
it, and size 1 is ``attn-res-additive``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from lime_arch.depth_mix.peers import _full_precision
from lime_arch.depth_mix.registry import DepthMix, MixArg, register_depth_mix

if TYPE_CHECKING:
    from torch import Tensor


@register_depth_mix("attn-res")
class AttentionResiduals(DepthMix):
    """Full Attention Residuals: every sublayer and the final norm read a softmax mixture of the
    embedding and all earlier sublayer outputs (module docstring)."""

    # False: h = the mixture (AttnRes); True: h = x + the mixture, sublayers 1..2L-1 only (Delta AttnRes)
    additive: ClassVar[bool] = False

    @classmethod
    def n_queries(cls, n_layers: int) -> int:
        """One pseudo-query per reader: every sublayer and the final norm, or (additive) sublayers 1..2L-1."""
        return 2 * n_layers - 1 if cls.additive else 2 * n_layers + 1

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        return cls.n_queries(n_layers) * d_model

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        # w_k of reader k (additive: row k - 1); replacement: the last row is the final norm's
        self.queries = nn.Parameter(torch.zeros(self.n_queries(self.n_layers), self.d_model))

    def readers(self) -> range:
        """The readers k that mix their sources (k = 2L: the final norm)."""
        return range(1, 2 * self.n_layers) if self.additive else range(2 * self.n_layers + 1)

    def sublayer_input(self, k: int, x: Tensor, values: list[Tensor], keys: list[Tensor]) -> Tensor:
        """What sublayer k reads: the mixture (replacement) or x plus the mixture (additive; sublayer 0: x)."""
        if not self.additive:
            return self.read(k, values, keys)
        return x if k == 0 else x + self.read(k, values, keys)

    def key(self, v: Tensor) -> Tensor:
        """RMSNorm(v) without a gain, fp32 or wider: (B, T, C)."""
        import torch

        vf = v.to(torch.promote_types(v.dtype, torch.float32))
        return vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + self.norm_eps)

    def read(self, k: int, values: list[Tensor], keys: list[Tensor]) -> Tensor:
        """sum_i softmax_i(w_k . keys_i) values_i: (B, T, C)."""
        import torch

        w = self.queries[k - 1 if self.additive else k]
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
        v = fn(self.sublayer_input(k, x, memo["values"], memo["keys"]))
        self._push(v, memo)
        return x + v  # the plain running sum (replacement: nothing reads it; module docstring)

    def end(self, x: Tensor, memo: dict) -> Tensor:
        return x if self.additive else self.read(2 * self.n_layers, memo["values"], memo["keys"])

    def sources(self, k: int) -> int:
        """How many sources sublayer k reads (k = 2L: the final norm)."""
        return k + 1

    def macs_per_token(self) -> int:
        """Per reader with S sources: S*C for the scores w . key and S*C for the weighted sum; the key
        norms, the softmax and the running sum are left out (norms and adds)."""
        return sum(2 * self.sources(k) * self.d_model for k in self.readers())


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
            h = self.sublayer_input(k, x, summaries, keys)
        else:
            h = self.sublayer_input(k, x, summaries + [partial], keys + [self.key(partial)])
        v = fn(h).to(summaries[0].dtype)
        partial = v if partial is None else partial + v
        last = k + 1 == 2 * self.n_layers or (k + 1) % self.size == 0
        if last:  # the block is complete: its sum is a summary
            self._push(partial, memo)
            partial = None
        memo["partial"] = partial
        return x + v


@register_depth_mix("attn-res-additive")
class AdditiveAttentionResiduals(AttentionResiduals):
    """Delta AttnRes: sublayer k >= 1 reads x_k plus the softmax mixture of the embedding and the
    earlier sublayer outputs; the final norm reads the plain stream (module docstring)."""

    additive = True


@register_depth_mix("attn-res-additive-block")
class AdditiveBlockAttentionResiduals(BlockAttentionResiduals):
    """Delta Block: ``attn-res-block``'s sources (block summaries and the partial sum), their mixture
    added to the residual stream (module docstring)."""

    additive = True
