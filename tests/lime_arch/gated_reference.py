"""A float64 reference of the gated residual streams (``gated-residual``; Qwen4-Exp's GatedResidual, see
lime_arch/depth_mix/gated.py for the equations), written from the equations with plain loops over
streams, channels blocks and bottleneck units, sharing no code with lime_arch.

``GatedResidualSteps`` is a mixin for test_peer_reference.Ref (its ``attention``, ``mlp`` and ``logits``,
the model ``m``, its config ``cfg`` and the tokens ``idx``); it reads the mix's weights by name:
``gain[k]`` (n, C) the zero-centred norm gain, ``read_logit[k]`` (n, C) the static read logits,
``proj[k].down`` (nC, r), ``proj[k].up`` (r, nC) and ``proj[k].inject`` (nC, n), rows and columns of
width nC indexed stream-major (stream i, channel c at i * C + c)."""
import torch


def sigmoid(z):
    return 1 / (1 + torch.exp(-z))


class GatedResidualSteps:
    """Per read k, stream by stream:
    u_i = H_i / sqrt(mean_c H_i[c]^2 + eps) * (1 + gamma_i);
    z_j = (1/n) sum_i u_i . D[iC:(i+1)C, j],  a_j = z_j sigmoid(z_j)  (SiLU);
    G_i = sigmoid(S_i + sum_j a_j U[j, iC:(i+1)C]);  h = (1/n) sum_i G_i * u_i;
    w_i = 2 sigmoid((1/n) sum_i' u_i' . J[i'C:(i'+1)C, i]);  H'_i = H_i + w_i sublayer(h);
    the final norm reads h of the output mixer (read 2L, no write)."""

    def read(self, k, Hs):
        dm, n, eps = self.m.depth_mix, len(Hs), self.cfg.norm_eps
        C = Hs[0].shape[-1]
        gamma, S, p = dm.gain[k], dm.read_logit[k], dm.proj[k]
        u = [Hs[i] / torch.sqrt(Hs[i].pow(2).mean(-1, keepdim=True) + eps) * (1 + gamma[i]) for i in range(n)]
        blocks = [slice(i * C, (i + 1) * C) for i in range(n)]
        z = [sum(u[i] @ p.down[blocks[i], j] for i in range(n)) / n for j in range(p.down.shape[1])]
        a = [zj * sigmoid(zj) for zj in z]
        G = [sigmoid(S[i] + sum(a[j][..., None] * p.up[j, blocks[i]] for j in range(len(a)))) for i in range(n)]
        h = sum(G[i] * u[i] for i in range(n)) / n
        if k == 2 * self.cfg.n_layers:
            return h, None
        w = [2 * sigmoid(sum(u[i2] @ p.inject[blocks[i2], i] for i2 in range(n)) / n) for i in range(n)]
        return h, w

    def step(self, k, Hs, f):
        h, w = self.read(k, Hs)
        y = f(h)
        return [Hs[i] + w[i][..., None] * y for i in range(len(Hs))]

    def run(self):
        Hs = [self.m.embed.weight[self.idx]] * self.m.depth_mix.rate
        for l in range(self.cfg.n_layers):
            Hs = self.step(2 * l, Hs, lambda h, l=l: self.attention(l, h))
            Hs = self.step(2 * l + 1, Hs, lambda h, l=l: self.mlp(l, h))
        return self.logits(self.read(2 * self.cfg.n_layers, Hs)[0])
