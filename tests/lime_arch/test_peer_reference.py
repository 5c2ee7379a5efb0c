"""The peer architectures against float64 references written here from their papers' equations
(as restated by arXiv 2502.09245, Section 5 and Appendix C), sharing no code with lime_arch:
a plain loop over layers, per stream and per source, reading the model's weights by name.

Every peer's weights are randomised first (their inits are the identity and zeros, which would
hide most of the mixing). Logits and every gradient at 1e-9, MHA and GQA, with the none and the
full router (the composition). Every registered depth mix needs an entry in REFERENCES."""
import math

import field_references as field
import pytest
import torch
import torch.nn.functional as F

from lime_arch import build_model, preset
from lime_arch.depth_mix import DEPTH_MIXES, depth_mix_specs, parse_depth_mix
from tests.lime_arch.gated_reference import GatedResidualSteps


@pytest.fixture(autouse=True)
def _f64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # (B, H, T, Hd), rotate-half
    T, Hd = x.shape[-2:]
    inv = 1.0 / theta ** (torch.arange(0, Hd, 2, dtype=torch.float64) / Hd)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., Hd // 2:], x[..., :Hd // 2]], -1) * sin


class Ref:
    """One reference forward pass: the LLaMA block as sublayers, the full router's Eq. 4 on the
    raw K/V of every earlier layer, and hooks the peers below fill in."""

    def __init__(self, model, idx):
        self.m, self.cfg, self.idx = model, model.cfg, idx
        self.kbuf, self.vbuf = [], []
        self.v1 = None

    def attention(self, l, h, kv=None):
        """kv: ((h_k, g_k), (h_v, g_v)), separate key and value inputs, each normed by the block's
        attention norm and then scaled by its own gain (MUDDFormer); default: h for all three."""
        cfg, blk = self.cfg, self.m.blocks[l]
        a, (B, T, _) = blk.attn, h.shape
        H, R, Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        h = rms(h, blk.attn_norm.weight, cfg.norm_eps)
        hk, hv = (h, h) if kv is None else (rms(x, blk.attn_norm.weight, cfg.norm_eps) * g for x, g in kv)
        q = (h @ a.wq.weight.T).view(B, T, H, Hd).transpose(1, 2)
        self.kbuf.append((hk @ a.wk.weight.T).view(B, T, R, Hd).transpose(1, 2))  # raw (B, R, T, Hd)
        self.vbuf.append((hv @ a.wv.weight.T).view(B, T, R, Hd).transpose(1, 2))
        k, v = self.kbuf[l], self.vbuf[l]
        if cfg.router == "full" and l > 0:  # routed[h] = sum_{s, h'} W[h, s*R + h'] KV_s[h']
            W = self.m.router.weights[l - 1]
            k = sum(W[:, s * R + g, None, None] * self.kbuf[s][:, g:g + 1] for s in range(l + 1) for g in range(R))
            v = sum(W[:, s * R + g, None, None] * self.vbuf[s][:, g:g + 1] for s in range(l + 1) for g in range(R))
        v = self.value_hook(l, v)
        q, k = rope(q, cfg.rope_theta), rope(k, cfg.rope_theta)
        k, v = k.repeat_interleave(H // R, 1), v.repeat_interleave(H // R, 1)
        att = (q @ k.transpose(-1, -2) / math.sqrt(Hd)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1),
                                                                    float("-inf"))
        return (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * Hd) @ a.wo.weight.T

    def mlp(self, l, h):
        blk = self.m.blocks[l]
        h = rms(h, blk.mlp_norm.weight, self.cfg.norm_eps)
        return (F.silu(h @ blk.mlp.w1.weight.T) * (h @ blk.mlp.w3.weight.T)) @ blk.mlp.w2.weight.T

    def value_hook(self, l, v):
        return v

    def run(self):
        x = self.m.embed.weight[self.idx]
        for l in range(self.cfg.n_layers):
            x = x + self.attention(l, x)
            x = x + self.mlp(l, x)
        return self.logits(x)

    def logits(self, x):
        return rms(x, self.m.norm.weight, self.cfg.norm_eps) @ self.m.embed.weight.T


class DenseFormerRef(Ref):
    """Y_i = sum_{j <= i, (i - j) % k == 0} a_{i,j} X_j after every p-th block; block i+1 reads Y_i."""

    def run(self):
        dm = self.m.depth_mix
        k, p = dm.dilation, dm.period
        X = [self.m.embed.weight[self.idx]]
        y, m = X[0], 0
        for i in range(1, self.cfg.n_layers + 1):
            x = y + self.attention(i - 1, y)
            x = x + self.mlp(i - 1, x)
            X.append(x)
            y = x
            if i % p == 0:
                js = [j for j in range(i + 1) if (i - j) % k == 0]
                a = dm.weights[m]
                y = sum(a[n] * X[j] for n, j in enumerate(js))
                m += 1
        return self.logits(y)


class HyperConnectionsRef(Ref):
    """n streams; per sublayer k, per stream i: a_m[i], A_r[i, j], b[i] (+ s tanh(norm(H_i) W)),
    h = sum_i a_m[i] H_i, H'_j = b[j] y + sum_i A_r[i, j] H_i; the sum of the streams at the end."""

    def norm(self, h):  # RMSNorm without gain
        return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)

    def step(self, k, Hs, f):
        dm, n = self.m.depth_mix, len(Hs)
        am = [dm.static_alpha[k][i, 0] for i in range(n)]
        Ar = [[dm.static_alpha[k][i, 1 + j] for j in range(n)] for i in range(n)]
        b = [dm.static_beta[k][i] for i in range(n)]
        if dm.dynamic:
            W, (sa, sb) = dm.proj[k], dm.scale[k]  # W = [W_m | W_r | W_b]: (C, n + 2)
            for i in range(n):
                hn = self.norm(Hs[i])
                am[i] = am[i] + sa * torch.tanh(hn @ W[:, 0])
                Ar[i] = [Ar[i][j] + sa * torch.tanh(hn @ W[:, 1 + j]) for j in range(n)]
                b[i] = b[i] + sb * torch.tanh(hn @ W[:, n + 1])
        expand = (lambda s: s[..., None]) if dm.dynamic else (lambda s: s)
        y = f(sum(expand(am[i]) * Hs[i] for i in range(n)))
        return [expand(b[j]) * y + sum(expand(Ar[i][j]) * Hs[i] for i in range(n)) for j in range(n)]

    def run(self):
        x0 = self.m.embed.weight[self.idx]
        Hs = [x0] * self.m.depth_mix.rate
        for l in range(self.cfg.n_layers):
            Hs = self.step(2 * l, Hs, lambda h, l=l: self.attention(l, h))
            Hs = self.step(2 * l + 1, Hs, lambda h, l=l: self.mlp(l, h))
        return self.logits(sum(Hs))


class CorlHyperConnectionsRef(HyperConnectionsRef):
    """The LIMe authors' HC: the dynamic weights read LayerNorm without affine: (h - mean) / sqrt(var + eps)."""

    def norm(self, h):
        c = h - h.mean(-1, keepdim=True)
        return c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)


class MHCRef(Ref):
    """mHC (arXiv 2512.24880, Eqs. 7-8), per sublayer k, stream by stream and entry by entry:
    x' = [H_0, .., H_{n-1}] / rms; t_j = x' . phi[:, j]; H_pre[i] = sigmoid(a_pre t_i + b_i),
    H_post[i] = g sigmoid(a_post t_{n+i} + b_{n+i}), M[i][j] = exp(a_res t_{2n+ni+j} + b_{2n+ni+j}) then
    ``iters`` rounds of Eq. 9, M <- T_r(T_c(M)): the columns normalised, then the rows;
    h = sum_i H_pre[i] H_i, H'_i = H_post[i] y + sum_j M[i][j] H_j; the sum of the streams at the end."""

    def positive(self, z):
        return torch.exp(z)

    def step(self, k, Hs, f):
        dm, n = self.m.depth_mix, len(Hs)
        x = torch.cat(Hs, -1)
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        t = x @ dm.proj[k]  # (B, T, n(n+2))
        a, b = dm.gate[k], dm.bias[k]
        pre = [torch.sigmoid(a[0] * t[..., i] + b[i]) for i in range(n)]
        post = [dm.post_gain * torch.sigmoid(a[1] * t[..., n + i] + b[n + i]) for i in range(n)]
        M = [[self.positive(a[2] * t[..., 2 * n + n * i + j] + b[2 * n + n * i + j]) for j in range(n)]
             for i in range(n)]
        for _ in range(dm.iters):
            cols = [sum(M[i][j] for i in range(n)) for j in range(n)]
            M = [[M[i][j] / cols[j] for j in range(n)] for i in range(n)]
            rows = [sum(M[i]) for i in range(n)]
            M = [[M[i][j] / rows[i] for j in range(n)] for i in range(n)]
        y = f(sum(pre[i][..., None] * Hs[i] for i in range(n)))
        return [post[i][..., None] * y + sum(M[i][j][..., None] * Hs[j] for j in range(n)) for i in range(n)]

    def run(self):
        Hs = [self.m.embed.weight[self.idx]] * self.m.depth_mix.rate
        for l in range(self.cfg.n_layers):
            Hs = self.step(2 * l, Hs, lambda h, l=l: self.attention(l, h))
            Hs = self.step(2 * l + 1, Hs, lambda h, l=l: self.mlp(l, h))
        return self.logits(self.readout(Hs))

    def readout(self, Hs):
        return sum(Hs)


class SigmoidMHCRef(MHCRef):
    def positive(self, z):
        return 1 / (1 + torch.exp(-z))


class ReadoutMHCRef(MHCRef):
    """DeepSeek-V4's final readout: x' = [H_0, .., H_{n-1}] / rms, w_i = sigmoid(a_out x' . phi_out[:, i]
    + b_out[i]), sum_i w_i H_i."""

    def readout(self, Hs):
        dm = self.m.depth_mix
        x = torch.cat(Hs, -1)
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        w = [torch.sigmoid(dm.readout_gate[0] * (x @ dm.readout_proj[:, i]) + dm.readout_bias[i])
             for i in range(len(Hs))]
        return sum(w[i][..., None] * Hs[i] for i in range(len(Hs)))


class AttnResRef(Ref):
    """Attention Residuals (arXiv 2603.15031): sublayer k reads sum_i a_i v_i over v_0 (the embedding)
    and the outputs v_1..v_k of the sublayers before it, a = exp(s_i) / sum exp(s), s_i = w_k . v_i / rms(v_i);
    the final norm reads the same over all 2L + 1 sources with w_{2L}."""

    def read(self, k, vs):
        w = self.m.depth_mix.queries[k]
        e = [torch.exp((v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)) @ w) for v in vs]
        z = sum(e)
        return sum((ei / z)[..., None] * v for ei, v in zip(e, vs))

    def sources(self, k, emb, outs):  # full: every earlier output
        return [emb, *outs]

    def run(self):
        emb, outs, K = self.m.embed.weight[self.idx], [], 2 * self.cfg.n_layers
        for k in range(K):
            h = self.read(k, self.sources(k, emb, outs))
            outs.append(self.attention(k // 2, h) if k % 2 == 0 else self.mlp(k // 2, h))
        return self.logits(self.read(K, self.sources(K, emb, outs)))


class BlockAttnResRef(AttnResRef):
    """Block AttnRes: blocks of S sublayers, [mS, (m+1)S) (the last one cut at 2L); sublayer k reads the
    embedding, the sums of the blocks before its own and, if non-empty, the sum of its block's outputs so
    far; the final norm the embedding and every block's sum."""

    def sources(self, k, emb, outs):
        S = self.m.depth_mix.size
        start = k - k % S if k < 2 * self.cfg.n_layers else k  # the final norm: every block is complete
        done = [sum(outs[i:min(i + S, start)]) for i in range(0, start, S)]
        partial = outs[start:k]
        return [emb, *done] + ([sum(partial)] if partial else [])


class MUDDRef(Ref):
    """MUDDFormer (arXiv 2502.12170): after block i, A = GELU(X_{i+1}/rms W1) W2 + b, (ways, i + 2);
    mixture c = sum_j A[c, j] X_j; block i+1 reads queries from mixture q, keys from k (gain g_k), values
    from v (gain g_v) and adds to mixture r; after the last block one mixture feeds the final norm."""

    def run(self):
        dm, L = self.m.depth_mix, self.cfg.n_layers
        X = [self.m.embed.weight[self.idx]]
        q = k = v = r = X[0]
        for i in range(L):
            kv = None if i == 0 else ((k, dm.kv_gain[i - 1, 0]), (v, dm.kv_gain[i - 1, 1]))
            x = r + self.attention(i, q, kv)
            x = x + self.mlp(i, x)
            X.append(x)
            u = (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)) @ dm.proj[i].w1
            A = (0.5 * u * (1 + torch.erf(u / math.sqrt(2)))) @ dm.proj[i].w2 + dm.bias[i].flatten()
            S = i + 2
            mixes = [sum(A[..., c * S + j, None] * X[j] for j in range(S)) for c in range(A.shape[-1] // S)]
            if i == L - 1:
                return self.logits(mixes[0])
            q, k, v, r = mixes


class ValueResidualRef(Ref):
    """V_n <- 0.5 V_1 + 0.5 V_n on the values attention reads (routed), for every layer after the first."""

    def lambdas(self, l):
        return 0.5, 0.5

    def value_hook(self, l, v):
        if l == 0:
            self.v1 = v
            return v
        l1, l2 = self.lambdas(l)
        return l1 * self.v1 + l2 * v


class LearnedValueResidualRef(ValueResidualRef):
    def lambdas(self, l):
        return self.m.depth_mix.lambdas[l - 1, 0], self.m.depth_mix.lambdas[l - 1, 1]


class GatedResidualRef(GatedResidualSteps, Ref):
    """Qwen's gated residual streams: tests/lime_arch/gated_reference.py."""


class AdditiveAttnResRef(field.AdditiveAttnRes, Ref):
    """Delta AttnRes, full and block (field_references.py)."""


class TrimmedMUDDRef(field.TrimmedMUDD, Ref):
    """MUDDFormer trimmed to the last k blocks and/or the value and residual ways (field_references.py)."""


class OffsetHyperConnectionsRef(field.OffsetStreams, HyperConnectionsRef):
    """HC whose streams start as x + p_i (field_references.py)."""


class OffsetMHCRef(field.OffsetStreams, MHCRef):
    """mHC whose streams start as x + p_i (field_references.py)."""


REFERENCES = {"none": Ref, "denseformer": DenseFormerRef, "hyper-connections": HyperConnectionsRef,
              "hyper-connections-static": HyperConnectionsRef, "hyper-connections-corl": CorlHyperConnectionsRef,
              "value-residual": ValueResidualRef, "value-residual-learned": LearnedValueResidualRef,
              "mhc": MHCRef, "mhc-sigmoid": SigmoidMHCRef, "mhc-readout": ReadoutMHCRef,
              "attn-res": AttnResRef, "attn-res-block": BlockAttnResRef,
              "mudd": MUDDRef, "gated-residual": GatedResidualRef,
              "attn-res-additive": AdditiveAttnResRef, "attn-res-additive-block": AdditiveAttnResRef,
              "mudd-last": TrimmedMUDDRef, "mudd-vr": TrimmedMUDDRef, "mudd-vr-last": TrimmedMUDDRef,
              "hyper-connections-asym": OffsetHyperConnectionsRef, "mhc-asym": OffsetMHCRef}
# At 5 layers (10 sublayers) attn-res-block's default size 4 makes blocks of 4, 4, 2 and size 3 of 3, 3, 3, 1;
# size 1 is full AttnRes; sizes 10 and 20 are one block (every sublayer reads the embedding and the partial sum).
# mHC at 1-3 Sinkhorn rounds: where the order of the normalisations (columns, then rows) matters most.
SPECS = [*depth_mix_specs(), "denseformer-2-1", "denseformer-1-2", "denseformer-2-3", "hyper-connections-2",
         "hyper-connections-static-3", "hyper-connections-corl-3", "mhc-2-5", "mhc-4-20-1", "mhc-sigmoid-3-7-1.5",
         "mhc-4-1", "mhc-3-2", "mhc-readout-3-3",
         "attn-res-block-1", "attn-res-block-3", "attn-res-block-10", "attn-res-block-20", "gated-residual-2-3",
         "gated-residual-3-1"]


def test_every_registered_depth_mix_has_a_reference():
    assert set(REFERENCES) == set(DEPTH_MIXES), "write a reference for the new depth mix here"


def _randomise(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.depth_mix.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kv", [4, 2])
@pytest.mark.parametrize("router", ["none", "full"])
def test_peer_matches_reference_forward_and_gradients(spec, kv, router):
    name = parse_depth_mix(spec)[0].name
    model = build_model(preset("tiny", router=router, n_kv_heads=kv, n_layers=5, depth_mix=spec)).double()
    _randomise(model)
    idx = torch.randint(0, 256, (2, 9))
    target = torch.randn(2, 9, 256)
    out = model(idx)
    (out * target).sum().backward()
    g_model = _grads(model)
    model.zero_grad(set_to_none=True)
    ref = REFERENCES[name](model, idx).run()
    (ref * target).sum().backward()
    g_ref = _grads(model)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    assert g_model.keys() == g_ref.keys()
    for n in g_ref:
        torch.testing.assert_close(g_model[n], g_ref[n], rtol=1e-9, atol=1e-9, msg=n)
