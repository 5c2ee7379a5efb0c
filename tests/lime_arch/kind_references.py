"""One float64 reference per router kind, written here from the paper's Eq. 4 (arXiv 2502.09245)
and sharing no code with lime_arch: plain loops over source slots and heads.

Each reference maps (w, sources, kbuf, vbuf, l, q) to layer l's routed (k, v), (B, R, T, Hd):
  w        the router's ``weight(l)`` in the kind's layout (None for the parameter-free kinds),
           columns in the order of ``sources``;
  sources  the slots layer l reads (sorted, from the test's own table, not from the router);
  kbuf, vbuf  the raw (pre-RoPE) K and V of layers 0..l, each (B, R, T, Hd);
  q        layer l's query (B, H, T, Hd), pre-RoPE: read by token-dependent kinds only.
``params`` and ``macs`` are the kind's counts for one layer l >= 1 reading n sources with R KV
heads of Hd dims: its parameters, and its multiply-accumulates per token for K and V.

Every registered kind needs an entry in REFERENCES (``test_kinds.py`` fails without one): a new
kind is its module in lime_arch/routing/kinds/ plus its reference here."""
from collections.abc import Callable
from dataclasses import dataclass

import torch


def identity(w, sources, kbuf, vbuf, l, q):
    return kbuf[l], vbuf[l]


def mean(w, sources, kbuf, vbuf, l, q):
    """routed[h] = (1 / |S|) sum_s KV_s[h]."""
    k = sum(kbuf[s] for s in sources) / len(sources)
    v = sum(vbuf[s] for s in sources) / len(sources)
    return k, v


def linear(w, sources, kbuf, vbuf, l, q):
    """routed[h] = sum_{i, h'} W[h, i*R + h'] KV_{S_i}[h']: w is (R, |S|*R)."""
    if w is None:
        return kbuf[l], vbuf[l]
    R = kbuf[0].shape[1]

    def mix(buf):
        heads = []
        for h in range(R):
            heads.append(sum(w[h, i * R + g] * buf[s][:, g] for i, s in enumerate(sources) for g in range(R)))
        return _stack(heads)

    return mix(kbuf), mix(vbuf)


def same_head(w, sources, kbuf, vbuf, l, q):
    """routed[h] = sum_i W[h, i] KV_{S_i}[h]: w is (R, |S|), no mixing across heads."""
    if w is None:
        return kbuf[l], vbuf[l]
    R = kbuf[0].shape[1]

    def mix(buf):
        return _stack([sum(w[h, i] * buf[s][:, h] for i, s in enumerate(sources)) for h in range(R)])

    return mix(kbuf), mix(vbuf)


def per_dim(w, sources, kbuf, vbuf, l, q):
    """routed[h][d] = sum_{i, h'} W[h, i*R + h', d] KV_{S_i}[h'][d]: w is (R, |S|*R, Hd)."""
    if w is None:
        return kbuf[l], vbuf[l]
    R = kbuf[0].shape[1]

    def mix(buf):
        heads = []
        for h in range(R):
            heads.append(sum(w[h, i * R + g] * buf[s][:, g] for i, s in enumerate(sources) for g in range(R)))
        return _stack(heads)  # w[h, c] is an Hd-vector: it scales the last dimension of (B, T, Hd)

    return mix(kbuf), mix(vbuf)


def depth_attention(w, sources, kbuf, vbuf, l, q):
    """Depth-Attention (arXiv 2606.05014), per token t and KV head h with plain loops: the group's
    mean query scores each source's key at t, a softmax over the sources mixes their values; the
    keys stay the layer's own. q is (B, H, T, Hd); groups are H/R consecutive query heads."""
    B, R, T, Hd = kbuf[0].shape
    G = q.shape[1] // R
    v_out = torch.zeros_like(vbuf[l])
    for b in range(B):
        for h in range(R):
            for t in range(T):
                qbar = sum(q[b, h * G + g, t] for g in range(G)) / G
                s = torch.stack([(qbar * kbuf[src][b, h, t]).sum() / Hd ** 0.5 for src in sources])
                e = torch.exp(s - s.max())
                a = e / e.sum()
                v_out[b, h, t] = sum(a[i] * vbuf[src][b, h, t] for i, src in enumerate(sources))
    return kbuf[l], v_out
def dynamic(w, sources, kbuf, vbuf, l, q):
    """Appendix E (dynamic LIMe): token t's routed head h mixes every source head c = (i, h') with
    a_c = exp(s_c) / sum_c' exp(s_c'), s_c = qbar_t[h] . key[h, c] / sqrt(Hd), the same a for K
    and V; qbar[h] is the mean query of the query heads sharing KV head h (MHA: head h's own); plus
    this project's gate g[h]: routed = KV_l[h] + g[h] (mix - KV_l[h]). w is (R, |S|*R*Hd + 1): per
    routed head its keys (|S|*R rows of Hd, source-major), then g."""
    if w is None:
        return kbuf[l], vbuf[l]
    B, R, T, Hd = kbuf[0].shape
    H = q.shape[1]
    n = len(sources) * R
    k_heads, v_heads = [], []
    for h in range(R):
        key = w[h, :n * Hd].reshape(n, Hd)
        g = w[h, n * Hd]
        qbar = sum(q[:, j] for j in range(h * (H // R), (h + 1) * (H // R))) / (H // R)  # (B, T, Hd)
        scores = [(qbar * key[i * R + g2]).sum(-1) / Hd ** 0.5 for i in range(len(sources)) for g2 in range(R)]
        top = torch.stack(scores).max(0).values  # (B, T): a shift for a stable exp
        e = [torch.exp(s - top) for s in scores]
        z = sum(e)
        mk = sum(e[i * R + g2][..., None] / z[..., None] * kbuf[s][:, g2]
                 for i, s in enumerate(sources) for g2 in range(R))
        mv = sum(e[i * R + g2][..., None] / z[..., None] * vbuf[s][:, g2]
                 for i, s in enumerate(sources) for g2 in range(R))
        k_heads.append(kbuf[l][:, h] + g * (mk - kbuf[l][:, h]))
        v_heads.append(vbuf[l][:, h] + g * (mv - vbuf[l][:, h]))
    return _stack(k_heads), _stack(v_heads)


def _stack(heads):
    """R tensors (B, T, Hd) -> (B, R, T, Hd)."""
    return torch.stack(heads, dim=1)


@dataclass(frozen=True)
class KindRef:
    route: Callable  # (w, sources, kbuf, vbuf, l, q) -> (k, v)
    params: Callable[[int, int, int], int]  # (n, R, Hd) -> parameters of one layer
    macs: Callable[[int, int, int], int]  # (n, R, Hd) -> MACs per token of one layer, K and V


REFERENCES = {
    "identity": KindRef(identity, lambda n, R, Hd: 0, lambda n, R, Hd: 0),
    "mean": KindRef(mean, lambda n, R, Hd: 0, lambda n, R, Hd: 2 * n * R * Hd),  # one add per source
    "linear": KindRef(linear, lambda n, R, Hd: R * n * R, lambda n, R, Hd: 2 * R * n * R * Hd),
    "same-head": KindRef(same_head, lambda n, R, Hd: R * n, lambda n, R, Hd: 2 * R * n * Hd),
    "per-dim": KindRef(per_dim, lambda n, R, Hd: R * n * R * Hd, lambda n, R, Hd: 2 * R * n * R * Hd),
    # no parameters; the scores (R x n dot products of Hd) and the value mix (R x n x Hd)
    "depth-attention": KindRef(depth_attention, lambda n, R, Hd: 0, lambda n, R, Hd: 2 * R * n * Hd),
    # keys (one Hd-vector per routed head and source head) and a gate per routed head; MACs: the
    # scores q . key (R * nR * Hd) and the mixing of K and V (2 * R * nR * Hd)
    "dynamic": KindRef(dynamic, lambda n, R, Hd: R * (n * R * Hd + 1), lambda n, R, Hd: 3 * R * n * R * Hd),
}
