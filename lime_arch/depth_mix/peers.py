"""The paper's peer architectures as depth mixes (arXiv 2502.09245, Section 5 and Appendix C):
DenseFormer, Hyper-Connections (dynamic, static, and as the LIMe authors ran it) and ResFormer's
value residual. The 2026 field (mHC, Attention Residuals, MUDDFormer) has modules of its own.

Each restates its original paper; the hooks are described in ``lime_arch.depth_mix.registry``.
Shapes: B batch, T tokens, C = d_model, n the HC expansion rate, R KV heads, Hd head dim.

No torch at the top of this module: the classes are also the declarations a config check reads
(names, arguments, ``check``), so the methods that call torch import it themselves.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, ClassVar

from lime_arch.depth_mix.registry import DepthMix, MixArg, register_depth_mix

if TYPE_CHECKING:
    from torch import Tensor


@register_depth_mix("denseformer")
class DenseFormer(DepthMix):
    """Depth-weighted averaging (DWA; Pagliardini et al. 2024). X_0 is the embedding output, X_i
    the output of block i (1-based, i = 1..L), and block i+1 reads Y_i = sum_j a_{i,j} X_j over the
    sources j <= i with (i - j) % dilation == 0. DWA runs after every ``period``-th block (i %
    period == 0, the last block included when L is a multiple); elsewhere Y_i = X_i. The a_{i,j}
    are learned, a_{i,i} = 1 and 0 elsewhere at init: exactly the baseline at step 0 (1 * x and
    0 * x + y are exact). Dilation 1, period 1 (the paper's setting): L(L+3)/2 scalars."""

    arguments = (MixArg("dilation", 1), MixArg("period", 1))
    dilation: int
    period: int

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        self.points = [i for i in range(1, self.n_layers + 1) if i % self.period == 0]  # DWA after block i
        self.slot = {i: m for m, i in enumerate(self.points)}
        self.point_sources = {i: self.sources(i) for i in self.points}  # no O(L) list per block per pass
        weights = []
        for i in self.points:
            w = torch.zeros(len(self.sources(i)))
            w[-1] = 1.0  # a_{i,i}: the sources are ascending, i last
            weights.append(nn.Parameter(w))
        self.weights = nn.ParameterList(weights)  # weights[m]: (|S_i|,) for points[m] = i

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        # one weight per source of every DWA point i: the j <= i with (i - j) % dilation == 0
        return sum(i // args["dilation"] + 1 for i in range(1, n_layers + 1) if i % args["period"] == 0)

    @classmethod
    def check(cls, args: dict, n_layers: int) -> str | None:
        if args["period"] > n_layers:
            return f"period {args['period']} exceeds model.n_layers={n_layers}: no DWA would run"
        return None

    def sources(self, i: int) -> list[int]:
        return [j for j in range(i + 1) if (i - j) % self.dilation == 0]

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        memo["outputs"] = [x]  # X_0
        return x

    def after_block(self, l: int, x: Tensor, memo: dict) -> Tensor:
        import torch

        outputs = memo["outputs"]
        outputs.append(x)  # X_i, i = l + 1
        m = self.slot.get(l + 1)
        if m is None:
            return x
        a = self.weights[m].unbind(0)  # scalars, sources ascending
        y = x * a[-1]  # (B, T, C)
        # a chain of fused multiply-adds: no stacked copy of the sources is saved for backward
        for w, j in zip(a[:-1], self.point_sources[l + 1][:-1]):
            y = torch.addcmul(y, w, outputs[j])
        return y

    def macs_per_token(self) -> int:
        return sum(len(self.sources(i)) for i in self.points) * self.d_model


def _full_precision(t: Tensor):
    """Autocast off (where it is on): the residual streams stay in their own dtype (fp32), as the
    baseline's residual stream does under bf16 autocast."""
    import torch

    dev = t.device.type
    return torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else nullcontext()


def stream_offsets(n: int, d_model: int, std: float):
    """The learned per-stream offsets of ``stream_init = "offset"`` (``hyper-connections-asym``,
    ``mhc-asym``): (n, C), drawn N(0, std^2) and centred over the streams, so the streams' mean is
    still the embedding output (their sum n x, what the final norm of the unmixed streams reads)."""
    import torch
    from torch import nn

    p = torch.randn(n, d_model) * std
    return nn.Parameter(p - p.mean(0, keepdim=True))


def expand_streams(x: Tensor, n: int, offsets: Tensor | None) -> Tensor:
    """The n streams (B, T, n, C) the residual starts as: x in each, plus the offsets if any."""
    H = x.unsqueeze(-2).expand(*x.shape[:-1], n, x.shape[-1])
    return H if offsets is None else H + offsets.to(x.dtype)


@register_depth_mix("hyper-connections")
class HyperConnections(DepthMix):
    """Dynamic Hyper-Connections (Zhu et al. 2024), expansion rate n (default 4, the paper's).

    The residual stream is n streams H (B, T, n, C), all the embedding output at first. Sublayer k
    (k = 2l attention, 2l + 1 MLP of layer l) has static weights a_m = e_{k mod n} (n), A_r = I_n
    (n, n), b = 1 (n), learned; the dynamic ones add per token, from Hn = norm(H):
      a_m += s_a tanh(Hn W_m),  A_r += s_a tanh(Hn W_r),  b += s_b tanh(Hn W_b),
    with W = [W_m | W_r | W_b] (C, n + 2) zero at init and s_a = s_b = 0.01 at init (the HC
    paper's). The sublayer reads h = a_m^T H and writes H' = b y^T + A_r^T H, y = sublayer(h).
    After the last layer the streams are summed (``end``) and the final norm follows.

    Choices, documented: norm(H) is an RMSNorm per stream without a gain (a gain g would be
    redundant: norm(H) diag(g) W = norm(H) (diag(g) W)), with the model's eps. The stream mixing
    runs with autocast off, so the streams keep the residual stream's dtype under bf16.
    At init every stream equals the baseline's residual stream bit for bit (e_k and I mix exactly,
    and 1 * y + x = x + y); the final norm then sees n x, and RMSNorm(n x, eps) equals
    RMSNorm(x, eps / n^2): the logits are the baseline's with the final norm's eps divided by n^2
    (not bit for bit; the tests check this form exactly and bound the difference).
    Weight decay: the static weights and scales take none (mixing scalars, like the router's);
    the dynamic projections W decay like every other weight matrix, which pulls them towards
    their zero init, i.e. towards static HC (the HC paper does not say; this is the usual rule).
    """

    arguments = (MixArg("rate", 4),)
    rate: int
    dynamic: ClassVar[bool] = True
    # how the streams start: "copy", the embedding output in each (the HC paper's), or "offset",
    # plus a learned per-stream offset (``hyper-connections-asym``)
    stream_init: ClassVar[str] = "copy"

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        n, K = self.rate, 2 * self.n_layers
        alpha = torch.zeros(K, n, n + 1)  # per sublayer [a_m | A_r]
        for k in range(K):
            alpha[k, self.stream(k), 0] = 1.0
            alpha[k, :, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(alpha)
        self.static_beta = nn.Parameter(torch.ones(K, n))
        if self.dynamic:
            self.proj = nn.ParameterList([nn.Parameter(torch.zeros(self.d_model, n + 2)) for _ in range(K)])
            self.scale = nn.Parameter(torch.full((K, 2), 0.01))  # (s_a, s_b) per sublayer
        if self.stream_init == "offset":
            self.stream_offset = stream_offsets(n, self.d_model, self.std)

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        n, K = args["rate"], 2 * n_layers
        static = K * n * (n + 1) + K * n  # alpha, beta per sublayer
        offsets = n * d_model if cls.stream_init == "offset" else 0
        return static + offsets + (K * d_model * (n + 2) + 2 * K if cls.dynamic else 0)  # W, (s_a, s_b)

    def decays(self, name: str) -> bool:
        return name.startswith("proj.")

    def stream(self, k: int) -> int:
        """The stream sublayer k reads at init (a_m = e_stream): the HC paper indexes the sublayers."""
        return k % self.rate

    def norm(self, H: Tensor) -> Tensor:
        """norm(H) of the dynamic weights: RMSNorm per stream without a gain (B, T, n, C)."""
        import torch

        Hf = H.to(torch.promote_types(H.dtype, torch.float32))
        return (Hf * torch.rsqrt(Hf.pow(2).mean(-1, keepdim=True) + self.norm_eps)).type_as(H)

    def _weights(self, k: int, H: Tensor) -> tuple[Tensor, Tensor]:
        """[a_m | A_r] (n, n+1) and b (n,) of sublayer k; dynamic: (B, T, n, n+1) and (B, T, n)."""
        import torch

        alpha, beta = self.static_alpha[k], self.static_beta[k]
        if not self.dynamic:
            return alpha, beta
        n = self.rate
        d = torch.tanh(self.norm(H) @ self.proj[k])  # (B, T, n, n+2)
        s = self.scale[k]
        return alpha + s[0] * d[..., :n + 1], beta + s[1] * d[..., n + 1]

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        return expand_streams(x, self.rate, getattr(self, "stream_offset", None))  # (B, T, n, C)

    def sublayer(self, k: int, H: Tensor, fn: Callable[[Tensor], Tensor], memo: dict) -> Tensor:
        alpha, beta = self._weights(k, H)
        with _full_precision(H):
            h = (alpha[..., None, :, 0] @ H).squeeze(-2)  # a_m^T H: (B, T, C)
        y = fn(h)
        with _full_precision(H):
            carry = alpha[..., 1:].transpose(-1, -2) @ H  # A_r^T H: (B, T, n, C)
        return beta[..., None] * y.unsqueeze(-2) + carry

    def end(self, H: Tensor, memo: dict) -> Tensor:
        return self.hidden(H)

    def hidden(self, H: Tensor) -> Tensor:
        return H.sum(-2)  # the sum of the streams, what the final norm reads: (B, T, C)

    def macs_per_token(self) -> int:
        n, C = self.rate, self.d_model
        dyn = n * C * (n + 2) if self.dynamic else 0  # Hn @ W
        per_sublayer = dyn + n * C + n * n * C + n * C  # a_m^T H, A_r^T H, b y^T
        return 2 * self.n_layers * per_sublayer + (n - 1) * C  # and the final sum of the streams


@register_depth_mix("hyper-connections-static")
class StaticHyperConnections(HyperConnections):
    """Static Hyper-Connections: the static weights alone (no W, no scales, no norm)."""

    dynamic = False


@register_depth_mix("hyper-connections-corl")
class CorlHyperConnections(HyperConnections):
    """Dynamic Hyper-Connections as the LIMe authors ran them for the paper's HC rows (Table 1;
    corl-team/lime, src/lm/hc.py), which differ from the HC paper in two choices:
      - both sublayers of layer l read stream l mod n at init (a_m = e_{l mod n} for k = 2l and
        2l + 1), where the HC paper indexes the sublayers (e_{k mod n});
      - norm(H) of the dynamic weights is a LayerNorm without affine (mean removed, then divided by
        the standard deviation, biased variance), where ``hyper-connections`` uses an RMSNorm
        without gain; eps is the model's norm eps (the authors' nn.LayerNorm default is 1e-5, this
        project's too).
    Everything else is ``hyper-connections``: the static init is the baseline's stream in every
    stream, the scales start at 0.01, the streams are summed before the final norm. Not carried
    over: the authors' blocks also replace the pre-norms (RMSNorm with gain) by LayerNorms without
    affine; those norms belong to the shared model, not the depth mix, and stay the baseline's."""

    def stream(self, k: int) -> int:
        return (k // 2) % self.rate

    def norm(self, H: Tensor) -> Tensor:
        import torch
        import torch.nn.functional as F

        Hf = H.to(torch.promote_types(H.dtype, torch.float32))
        return F.layer_norm(Hf, Hf.shape[-1:], eps=self.norm_eps).type_as(H)  # (B, T, n, C)


@register_depth_mix("hyper-connections-asym")
class AsymmetricHyperConnections(HyperConnections):
    """Dynamic Hyper-Connections whose streams start apart: stream i starts as x + p_i, with p (n, C)
    learned, N(0, std^2) at init (std the model's init std, the embedding's scale) and centred over
    the streams. Stream collapse (arXiv 2606.03483: the streams' permutation symmetry resolved
    into one dominant stream, H_res staying near the identity) is cured there by breaking the
    streams' symmetry at initialisation; the paper's abstract does not give its scheme, so this
    one is derived: a perturbation of the starting streams (not of the weights, which HC's a_m =
    e_{k mod n} already makes asymmetric), the smallest change that makes the streams differ,
    learned so that training can keep or undo it. Not the baseline at step 0: sublayer k reads
    x + p_{k mod n} (the offsets take no weight decay, like the static weights)."""

    stream_init = "offset"
    baseline_at_init = False


@register_depth_mix("value-residual")
class ValueResidual(DepthMix):
    """ResFormer's value residual (Zhou et al. 2025): for every layer after the first (0-based
    l >= 1), the values attention reads are 0.5 V_1 + 0.5 V_l, V_1 the first layer's values.

    With a router: the mix applies to the routed values (what the attention reads), after
    routing; the K/V buffer keeps every layer's raw values. Why: (1) ResFormer's residual acts on
    the values the attention aggregates, which in LIMe are the routed ones; (2) the buffer stays
    the paper's raw per-layer K/V, so routing semantics, the buffer mixer and the routing
    references are untouched and V_1 reaches a layer only through this shortcut, not a second
    time through the routed sources; (3) with the ``none`` router both readings coincide. V_1 is
    layer 0's values, which layer 0 reads unrouted under every router. The KV cache stores the
    mixed values (what attention read), so cached decoding is exact and the cache keeps its size.
    Not the baseline at init (0.5 V_1 + 0.5 V_l is not V_l)."""

    baseline_at_init = False

    def values(self, l: int, v: Tensor, memo: dict) -> Tensor:
        if l == 0:
            memo["v1"] = v  # (B, R, T, Hd)
            return v
        return 0.5 * memo["v1"] + 0.5 * v

    def macs_per_token(self) -> int:
        return (self.n_layers - 1) * 2 * self.n_kv_heads * self.head_dim


@register_depth_mix("value-residual-learned")
class LearnedValueResidual(ValueResidual):
    """The value residual with learned per-layer mixes: l1_l V_1 + l2_l V_l, both 0.5 at init (so
    step 0 equals ``value-residual``); 2 (L - 1) scalars, without weight decay."""

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        return 2 * max(n_layers - 1, 0)

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        self.lambdas = nn.Parameter(torch.full((max(self.n_layers - 1, 0), 2), 0.5))  # (l1, l2) per layer >= 1

    def values(self, l: int, v: Tensor, memo: dict) -> Tensor:
        if l == 0:
            memo["v1"] = v
            return v
        lam = self.lambdas[l - 1]
        return lam[0] * memo["v1"] + lam[1] * v
