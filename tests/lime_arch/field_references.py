"""Float64 references for the 2026 field's trimmed and additive depth mixes (issue 36), written from
the papers' equations and sharing no code with lime_arch: plain loops over sublayers, sources and
streams, reading the model's weights by name and its options from the spec string itself.

Each class is a mixin over test_peer_reference.py's ``Ref`` (its ``attention(l, h, kv)``,
``mlp(l, h)`` and ``logits(x)``, the LLaMA block with the full router's Eq. 4) or, for the stream
mixes, over its ``HyperConnectionsRef`` / ``MHCRef`` (their per-sublayer ``step``):
  AdditiveAttnRes       Delta AttnRes (arXiv 2605.18855), full and block sources
  TrimmedMUDD           MUDDFormer (arXiv 2502.12170) trimmed as the NanoGPT speedrun's record:
                        the last k blocks only, the value and residual ways only
  OffsetStreams         HC / mHC whose n streams start as x + p_i (arXiv 2606.03483's symmetry
                        breaking at stream initialisation)
"""
import math

import torch


def _spec_args(spec):
    """'mudd-vr-last-3' -> ('mudd-vr-last', [3]): the words, then the numbers."""
    parts = spec.split("-")
    words = [p for p in parts if not p.replace(".", "").isdigit()]
    return "-".join(words), [float(p) if "." in p else int(p) for p in parts[len(words):]]


def softmax_mix(w, sources, eps):
    """sum_i a_i s_i, a_i = exp(w . s_i / rms(s_i)) / sum_j exp(w . s_j / rms(s_j)), source by source."""
    e = [torch.exp((s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + eps)) @ w) for s in sources]
    z = sum(e)
    return sum((ei / z)[..., None] * s for ei, s in zip(e, sources))


class AdditiveAttnRes:
    """h_k = x_k + sum_i a_{i,k} s_i for sublayers k = 1..2L-1, with x_k the plain residual stream
    (embedding plus every earlier sublayer output) and the scores from pseudo-query w_{k-1}; h_0 = x_0
    and the final norm reads x_{2L} (the authors' ``delta`` mode). Sources: full, the embedding and the
    outputs of sublayers 0..k-1; block (blocks of S sublayers), the embedding, the sum of each completed
    block and, if non-empty, the sum of the current block's outputs so far."""

    def field_sources(self, k, emb, outs):
        name, args = _spec_args(self.cfg.depth_mix)
        if name == "attn-res-additive":
            return [emb, *outs]
        S = args[0] if args else 4
        start = (k // S) * S
        done = [sum(outs[j:j + S]) for j in range(0, start, S)]
        partial = outs[start:k]
        return [emb, *done] + ([sum(partial)] if partial else [])

    def run(self):
        emb, outs = self.m.embed.weight[self.idx], []
        x = emb
        for k in range(2 * self.cfg.n_layers):
            h = x
            if k > 0:
                w = self.m.depth_mix.queries[k - 1]
                h = x + softmax_mix(w, self.field_sources(k, emb, outs), self.cfg.norm_eps)
            y = self.attention(k // 2, h) if k % 2 == 0 else self.mlp(k // 2, h)
            outs.append(y)
            x = x + y
        return self.logits(x)


class TrimmedMUDD:
    """MUDDFormer with the speedrun's trims, read from the spec: ``-last-<k>`` (default 2) makes blocks
    l >= max(1, L - k) the only ones whose inputs are mixtures; ``-vr`` keeps the value and residual ways
    (the query and key read the residual mixture, the key without a gain of its own). After block
    i, when block i + 1 takes mixtures or i = L - 1: A = GELU(X_{i+1}/rms W1) W2 + b, (ways, i + 2), way c
    = sum_j A[c, j] X_j; the m-th such block (in order) owns proj[m] and bias[m]; the blocks that take
    mixtures own kv_gain rows in order: (g_k, g_v), or (g_v,) with -vr."""

    def run(self):
        dm, L = self.m.depth_mix, self.cfg.n_layers
        name, args = _spec_args(self.cfg.depth_mix)
        vr = "-vr" in name
        first = max(1, L - (args[0] if args else 2)) if name.endswith("-last") else 1
        X = [self.m.embed.weight[self.idx]]
        x, mixes, m = X[0], None, 0
        for i in range(L):
            if mixes is None:
                x = x + self.attention(i, x)
            else:
                g = dm.kv_gain[i - first]
                if vr:
                    v, r = mixes
                    x = r + self.attention(i, r, ((r, 1.0), (v, g[0])))
                else:
                    q, k, v, r = mixes
                    x = r + self.attention(i, q, ((k, g[0]), (v, g[1])))
            x = x + self.mlp(i, x)
            X.append(x)
            mixes = None
            if i + 1 >= first or i == L - 1:
                u = (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)) @ dm.proj[m].w1
                A = (0.5 * u * (1 + torch.erf(u / math.sqrt(2)))) @ dm.proj[m].w2 + dm.bias[m].flatten()
                S = i + 2
                ways = [sum(A[..., c * S + j, None] * X[j] for j in range(S)) for c in range(A.shape[-1] // S)]
                m += 1
                if i == L - 1:
                    return self.logits(ways[0])
                mixes = ways
        raise AssertionError("the last block always has dense weights")


class OffsetStreams:
    """The n streams start as H_i = x + p_i (p: the mix's ``stream_offset``, one row per stream), then
    the host reference's per-sublayer step; the streams are summed before the final norm."""

    def run(self):
        x0, p = self.m.embed.weight[self.idx], self.m.depth_mix.stream_offset
        Hs = [x0 + p[i] for i in range(self.m.depth_mix.rate)]
        for l in range(self.cfg.n_layers):
            Hs = self.step(2 * l, Hs, lambda h, l=l: self.attention(l, h))
            Hs = self.step(2 * l + 1, Hs, lambda h, l=l: self.mlp(l, h))
        return self.logits(sum(Hs))
