"""mHC, manifold-constrained hyper-connections (Xie et al., arXiv 2512.24880; the residual of
DeepSeek-V4), as a depth mix.

Like Hyper-Connections (``lime_arch.depth_mix.peers``) the residual stream is n streams H
(B, T, n, C), all the embedding output at first, summed before the final norm. Sublayer k
(k = 2l attention, 2l + 1 MLP of layer l) reads and writes them through three per-token maps
computed from ONE linear map of the flattened streams (the paper's Eqs. 7-8):
  x'      = RMSNorm(vec(H))                                 (1, nC), no gain
  H~pre   = a_pre  (x' phi_pre)  + b_pre                    (n,)
  H~post  = a_post (x' phi_post) + b_post                   (n,)
  H~res   = a_res  mat(x' phi_res) + b_res                  (n, n)
  H_pre = sigmoid(H~pre),  H_post = g sigmoid(H~post),  H_res = SinkhornKnopp(exp(H~res))
  h = H_pre H  (the sublayer's input),   H' = H_post^T sublayer(h) + H_res H
with phi = [phi_pre | phi_post | phi_res] (nC, n(n+2)), scalars a, and biases b, per sublayer.
Sinkhorn-Knopp, as the paper's Eq. 9 writes it, M(t) = T_r(T_c(M(t-1))): each of the ``iters``
rounds (the paper: 20) normalises the columns of the positive matrix, then its rows. Row i of
H_res is what new stream i takes from the old streams, so the last (row) normalisation makes
every new stream an exact convex combination of the old ones; the column sums reach 1 only in
the limit (within 1e-10 after 20 rounds at moderate logits). The order matters at few rounds
(logits differ by up to 6e-2 at 1-3 rounds) and a little at 20 (6e-5..8e-4 measured).

Arguments: ``mhc[-<rate>[-<iters>[-<post_gain>]]]``, defaults 4 streams, 20 iterations, g = 2.
The streams are summed before the final norm (the paper's Section 4 leaves the readout open);
``mhc-readout`` (same arguments) combines them as DeepSeek-V4's released code does (its hc_head),
with learned per-token weights from one more linear map of the flattened streams:
  w = sigmoid(a_out (RMSNorm(vec(H)) phi_out) + b_out)  (n,),   final = w^T H      (B, T, C)
phi_out (nC, n) zero, a_out = 0.01 and b_out = 0 at init (w = 1/2 per stream, so the final norm
sees (n/2) x: the baseline up to the norm eps, as with the sum); DeepSeek-V4's small eps added to
w is left out like the other kernel guards. Per-block analysis (``hidden``) reads the streams
through the same readout.
Where public ports differ, the choice is named:
  - the factor 2 on H_post (``post_gain``): the paper and DeepSeek-V4's reference kernel have it,
    Hugging Face transformers' DeepseekV4HyperConnection omits it: ``mhc-4-20-1``;
  - the positive map before the Sinkhorn normalisation: the paper exponentiates (the reference
    kernel's row softmax is the same thing followed by the first row normalisation), the
    transformers port takes a sigmoid first and normalises after: ``mhc-sigmoid`` (same
    arguments).
  Left out from the ports: their small eps added to H_pre and inside the normalisations (a
  kernel guard the paper does not state).

Init (the paper gives the gating factors' init, 0.01 in its Table 5; for the rest this follows
Hyper-Connections): phi = 0, a = 0.01, b_pre = e_{k mod n} (HC's static a_m, through the
sigmoid), b_res = I_n (HC's A_r), b_post = 0 (so H_post = g/2 = 1, HC's b). Then every stream
equals the baseline's residual stream: identical streams stay identical under any doubly
stochastic H_res, and the sublayer reads c x with c = sum(H_pre) = sigmoid(1) + (n-1)/2, which the
pre-norm maps to RMSNorm(x) with eps/c^2; the final norm sees n x (eps/n^2), as with HC. So step 0
is the baseline up to the norm eps (exactly for g = 2 only); the asymmetric b_pre breaks the
streams' symmetry, as HC's a_m does (with symmetric biases the streams would stay identical).
``mhc-asym`` (same arguments) also starts the streams apart, stream i as x + p_i with learned
offsets (``hyper-connections-asym`` in ``lime_arch.depth_mix.peers``: arXiv 2606.03483's cure of
stream collapse); not the baseline at step 0.

Precision: the coefficients are computed in fp32 (or the streams' dtype if wider) with autocast
off, as the paper prescribes; the streams mix in their own dtype (fp32 under bf16 autocast).
Weight decay: phi (``proj``, and ``readout_proj``) decays like every weight matrix; a and b take none.

No torch at the top of this module (the classes are also the declarations a config check reads:
``lime_arch.depth_mix.registry``), so the functions and methods that call torch import it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from lime_arch.depth_mix.peers import _full_precision, expand_streams, stream_offsets
from lime_arch.depth_mix.registry import DepthMix, MixArg, register_depth_mix

if TYPE_CHECKING:
    from torch import Tensor


MAX_SINKHORN_ROUNDS = 1000  # 50 times the paper's: more is a typo, and hours of normalising per step


def sinkhorn_knopp(M: Tensor, iters: int) -> Tensor:
    """``iters`` rounds of column then row normalisation of a positive (..., n, n) matrix (the
    paper's Eq. 9: T_r(T_c(M)) per round; the rows sum to 1 exactly on return)."""
    for _ in range(iters):
        M = M / M.sum(-2, keepdim=True)  # columns sum to 1
        M = M / M.sum(-1, keepdim=True)  # rows sum to 1
    return M


def _exp(x: Tensor) -> Tensor:
    # Sinkhorn is invariant to scaling the matrix, so subtracting each matrix's largest entry is
    # exact in real arithmetic and keeps exp from overflowing (the shift carries no gradient)
    import torch

    return torch.exp(x - x.amax(dim=(-2, -1), keepdim=True).detach())


def _sigmoid(x: Tensor) -> Tensor:
    import torch

    return torch.sigmoid(x)


@register_depth_mix("mhc")
class ManifoldHyperConnections(DepthMix):
    """mHC with n streams, ``iters`` Sinkhorn-Knopp rounds and H_post = post_gain * sigmoid; see
    the module docstring."""

    arguments = (MixArg("rate", 4), MixArg("iters", 20), MixArg("post_gain", 2.0, float))
    rate: int
    iters: int
    post_gain: float
    # the positive map of H~res before the Sinkhorn normalisation (the paper: exp)
    positive: ClassVar[Callable[[Tensor], Tensor]] = staticmethod(_exp)
    # the final readout: False, the sum of the streams; True, DeepSeek-V4's learned weights
    learned_readout: ClassVar[bool] = False
    # how the streams start: "copy" (the embedding output in each) or "offset" (``mhc-asym``)
    stream_init: ClassVar[str] = "copy"

    def __init__(self, **kw):
        import torch
        from torch import nn

        super().__init__(**kw)
        n, K, C = self.rate, 2 * self.n_layers, self.d_model
        self.proj = nn.ParameterList([nn.Parameter(torch.zeros(n * C, n * (n + 2))) for _ in range(K)])  # phi
        self.gate = nn.Parameter(torch.full((K, 3), 0.01))  # (a_pre, a_post, a_res) per sublayer
        bias = torch.zeros(K, n * (n + 2))  # [b_pre | b_post | vec(b_res)] per sublayer
        for k in range(K):
            bias[k, k % n] = 1.0
            bias[k, 2 * n:] = torch.eye(n).flatten()
        self.bias = nn.Parameter(bias)
        if self.learned_readout:  # DeepSeek-V4's hc_head: phi_out, a_out, b_out
            self.readout_proj = nn.Parameter(torch.zeros(n * C, n))
            self.readout_gate = nn.Parameter(torch.full((1,), 0.01))
            self.readout_bias = nn.Parameter(torch.zeros(n))
        if self.stream_init == "offset":
            self.stream_offset = stream_offsets(n, C, self.std)

    @classmethod
    def check(cls, args: dict, n_layers: int) -> str | None:
        if args["iters"] > MAX_SINKHORN_ROUNDS:  # each round is two normalisations per token, sublayer and step
            return (f"iters {args['iters']}: at most {MAX_SINKHORN_ROUNDS} Sinkhorn-Knopp rounds (the mHC paper "
                    "uses 20)")
        return None

    @classmethod
    def param_count(cls, args: dict, *, n_layers: int, d_model: int) -> int:
        n, K = args["rate"], 2 * n_layers
        readout = n * d_model * n + 1 + n if cls.learned_readout else 0  # phi_out, a_out, b_out
        offsets = n * d_model if cls.stream_init == "offset" else 0
        return K * (n * d_model * n * (n + 2) + 3 + n * (n + 2)) + readout + offsets  # phi, gates, biases per sublayer

    def decays(self, name: str) -> bool:
        return name.startswith("proj.") or name == "readout_proj"

    def coefficients(self, k: int, H: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """H_pre (B, T, n), H_post (B, T, n), H_res (B, T, n, n) of sublayer k, in fp32 or wider."""
        import torch

        n = self.rate
        with _full_precision(H):
            x = H.flatten(-2).to(torch.promote_types(H.dtype, torch.float32))  # vec(H): (B, T, nC)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm_eps)
            logits = x @ self.proj[k].to(x.dtype)  # (B, T, n(n+2))
            a, b = self.gate[k].to(x.dtype), self.bias[k].to(x.dtype)
            pre = torch.sigmoid(a[0] * logits[..., :n] + b[:n])
            post = self.post_gain * torch.sigmoid(a[1] * logits[..., n:2 * n] + b[n:2 * n])
            res = self.positive((a[2] * logits[..., 2 * n:] + b[2 * n:]).unflatten(-1, (n, n)))  # (B, T, n, n)
            return pre, post, sinkhorn_knopp(res, self.iters)

    def begin(self, x: Tensor, memo: dict) -> Tensor:
        return expand_streams(x, self.rate, getattr(self, "stream_offset", None))  # (B, T, n, C)

    def sublayer(self, k: int, H: Tensor, fn: Callable[[Tensor], Tensor], memo: dict) -> Tensor:
        pre, post, res = (c.to(H.dtype) for c in self.coefficients(k, H))
        with _full_precision(H):
            h = (pre.unsqueeze(-2) @ H).squeeze(-2)  # H_pre H: (B, T, C)
        y = fn(h)
        with _full_precision(H):
            return post.unsqueeze(-1) * y.unsqueeze(-2) + res @ H  # (B, T, n, C)

    def end(self, H: Tensor, memo: dict) -> Tensor:
        return self.hidden(H)

    def hidden(self, H: Tensor) -> Tensor:
        """What the final norm reads: (B, T, C), the sum of the streams or the learned readout."""
        if not self.learned_readout:
            return H.sum(-2)
        import torch

        with _full_precision(H):
            x = H.flatten(-2).to(torch.promote_types(H.dtype, torch.float32))  # vec(H): (B, T, nC)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm_eps)
            m = x @ self.readout_proj.to(x.dtype)  # (B, T, n)
            w = torch.sigmoid(self.readout_gate.to(x.dtype) * m + self.readout_bias.to(x.dtype))
            return (w.to(H.dtype).unsqueeze(-2) @ H).squeeze(-2)  # w^T H

    def macs_per_token(self) -> int:
        """x' phi n*C*n(n+2), H_pre H n*C, H_res H n*n*C, H_post^T y n*C per sublayer, and the final sum
        of the streams (the learned readout: x' phi_out n*C*n and w^T H n*C); the Sinkhorn rounds
        (2 iters n^2 divisions), norms and sigmoids are left out like every norm and softmax (O(n^2)
        per token)."""
        n, C = self.rate, self.d_model
        per_sublayer = n * C * n * (n + 2) + n * C + n * n * C + n * C
        readout = n * C * n + n * C if self.learned_readout else (n - 1) * C
        return 2 * self.n_layers * per_sublayer + readout


@register_depth_mix("mhc-sigmoid")
class SigmoidManifoldHyperConnections(ManifoldHyperConnections):
    """mHC with a sigmoid, not exp, as the positive map of H~res before the Sinkhorn normalisation
    (Hugging Face transformers' DeepseekV4HyperConnection; with ``mhc-sigmoid-4-20-1`` also without
    the factor 2 on H_post, that port as it is)."""

    positive = staticmethod(_sigmoid)


@register_depth_mix("mhc-readout")
class ReadoutManifoldHyperConnections(ManifoldHyperConnections):
    """mHC whose final streams are combined with learned per-token weights (DeepSeek-V4's hc_head)
    instead of summed; see the module docstring."""

    learned_readout = True


@register_depth_mix("mhc-asym")
class AsymmetricManifoldHyperConnections(ManifoldHyperConnections):
    """mHC whose streams start apart, stream i as x + p_i with learned offsets p (n, C), N(0, std^2)
    and centred over the streams at init: the symmetry breaking of arXiv 2606.03483 (stream
    collapse), in the form ``hyper-connections-asym`` documents. Not the baseline at step 0. Unlike
    HC's A_r = I, H_res at init (exp(I), normalised) pulls the streams towards their mean by a
    factor (e - 1) / (e + n - 1) per sublayer, so at init the offsets' spread fades with depth
    (0.02 to 7e-4 after 3 layers at n = 3) until H_res or the offsets learn otherwise."""

    stream_init = "offset"
    baseline_at_init = False
