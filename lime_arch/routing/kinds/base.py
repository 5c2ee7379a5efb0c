"""The router-kind base class and the kind registry.

A router (``lime_arch.routers``) says which buffered K/V heads layer l reads (``sources(l)``)
and owns its coefficients; its *kind* says what those coefficients are and how the mixing runs.
One kind is one ``RouterKind`` subclass in one module of this package named after it (the kind
``same-head`` is ``same_head.py``), registered once with ``register_kind`` (a single instance,
e.g. ``LINEAR``); routers declare it by name, torch-free (``kind = KindName("linear")``,
``lime_arch.router_base``), and a built router's ``kind`` is the instance. Nothing
outside the kind's module branches on it: the router, the accounting, the mixers, the KV-cache
decoding and the compile ops ask the kind object.

What a new kind implements is in ``RouterKind``'s docstring.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from lime_arch.specs import Registry

Tensor = torch.Tensor


class RouterKind:
    """What a router's ``weight(l)`` is and how its mixing runs. ``router`` arguments are the router
    object (``lime_arch.routers.Router``): ``n_layers``, ``R`` (KV heads), ``head_dim``,
    ``sources(l)``, ``weight(l)``, ``weight_shape(l)``, ``init``, ``options`` (the kind's typed
    options, ``check_options``) and ``d_model``. Layer 0 reads its own K/V under
    every kind (the concatenation reference relies on it).

    What a new kind implements (one module, ``register_kind(MyKind())``; the buffered kinds share
    ``BufferedKind``, whose docstring lists what such a kind adds):

      name, learned      the registry name; whether the router has one weight per layer l >= 1
      operand_shape      the shape of ``weight(l)`` (None without weights)
      init_weight        layer l's initial weight (learned kinds)
      dense              the same mixing as a dense (R, (l+1)R[, Hd]) matrix, zeros outside the
                         sources: analysis, plots and the concatenation reference
      token_mixing       the dense mixing per token for the layer's query (default: ``dense``)
      macs_per_token     multiply-accumulates per token of routing K and V at layer l (the FLOP
                         accounting, ``lime_arch.accounting``, sums them)
      check_options, decays  the router's typed options (default: none taken), and which of its
                         parameters take weight decay (default: none; ``lime_arch.optim``)
      make_mixer         the object whose ``route(l, k, v, q=None, x=None)`` maps layer l's raw,
                         pre-RoPE K/V (B, T, R, Hd) to routed K/V (B, R, T, Hd), once per forward pass
                         and layer in order 0..L-1; ``q`` is the layer's query (B, T, H, Hd), pre-RoPE,
                         and ``x`` its normed attention input (B, T, D), which static kinds ignore.
                         The same object runs training, prefill and decoding: routing is per
                         position, so the KV cache (``lime_arch.model.KVCache``) holds routed,
                         post-RoPE K/V of the baseline's size whatever the kind, as long as a token's
                         routed K/V depend only on that token's K/V (query, input) at layers <= l. A fast
                         path for a few tokens without autograd (decoding) is the mixer's business
                         (``BufferedKind.few_token_path``).
      concat_route       the paper's pseudocode on the concatenated buffer (``routing_impl: concat``):
                         by default ``dense(l)`` applied to it
      traffic_slots      slots (one layer's K and V for the batch) a training step moves: the
                         benchmark's bandwidth floor (``lime_arch.routing.plan.step_traffic``)
      prunable, prune_mass  whether top-p pruning applies, and each weight entry's importance
      activation_elems   elements the routing of a training step keeps for backward beyond the
                         baseline's, and the most it holds at once on top (``accounting.routing_memory``)

    The buffered kinds (linear, same-head, per-dim) run on the shared K/V buffer, its autograd
    functions and its compile ops; ``BufferedKind`` says what such a kind adds (its buffer layout).

    A token-dependent kind (``dynamic.py``: weights softmax over sources of
    q_{t,h} . key_l[h, s, h'] / sqrt(Hd); depth attention would be another) sets
    ``token_dependent`` and is one more module here: its mixer reads ``q`` in ``route``, its
    ``concat_route`` computes the same from the concatenated K/V and ``q``, its ``macs_per_token``
    counts the scores too, its ``token_mixing(l, q)`` gives the dense mixing of every token, and its
    ``dense`` is a token-free matrix of its choice (dynamic: the mixing of a zero query). The
    analysis of a trained model (``orchestrator.analysis.routes``: the end-of-trial router artifacts
    and ``lime analyze``) summarises a token-dependent kind by ``token_mixing`` averaged over
    validation tokens, with the spread over tokens as a second map; a static kind by ``dense``.
    Its reference test goes into ``tests/lime_arch/kind_references.py``.
    """

    name: ClassVar[str]
    learned: ClassVar[bool] = False  # one weight per layer l >= 1 (``Router.weights``)
    # the mixing depends on the tokens (it reads ``q``): ``dense`` has no single matrix, and the
    # router maps of the analysis and the report average ``token_mixing`` over tokens
    token_dependent: ClassVar[bool] = False
    prunable: ClassVar[bool] = False  # top-p pruning applies (``prune_mass``; ``lime_arch.prune``)

    def __repr__(self) -> str:
        return f"RouterKind({self.name!r})"

    # -- the router's side -----------------------------------------------------------------------
    def check_options(self, options, d_model: int | None):
        """The router's ``options`` as this kind keeps them (``RouterModule.options``); a kind
        without options takes only None."""
        if options is not None:
            raise ValueError(f"router kind {self.name} takes no options, got {options!r}")
        return None

    def decays(self, router, name: str) -> bool:
        """Whether the router's parameter ``name`` takes weight decay (default: no router weight does)."""
        return False

    def operand_shape(self, router, l: int) -> tuple[int, ...] | None:
        """The shape of ``weight(l)`` (None: the kind multiplies no weight)."""
        return None

    def init_weight(self, router, l: int) -> Tensor:
        raise TypeError(f"router kind {self.name} has no weights")

    def dense(self, router, l: int) -> Tensor:
        raise NotImplementedError

    def token_mixing(self, router, l: int, q: Tensor, keys: list[Tensor] | None = None,
                     x: Tensor | None = None) -> Tensor:
        """Layer l's dense mixing per token, (B, T, R, (l+1)R[, Hd]), for the layer's query q
        (B, T, H, Hd), the raw keys (B, T, R, Hd) of layers 0..l (read by kinds whose weights
        depend on them, depth attention) and its attention input x (B, T, D) (the dynamic kind's
        hidden-state scores): ``dense(l)`` at every token, unless the kind is token-dependent."""
        d = self.dense(router, l).to(q)
        return d.expand(q.shape[0], q.shape[1], *d.shape)

    def prune_mass(self, w: Tensor) -> Tensor:
        """The importance of each entry of a layer's weight for top-p pruning (``lime_arch.prune``),
        shaped like ``w``; a prunable kind's weight has its sources as equal column blocks of dim 1."""
        raise TypeError(f"router kind {self.name} cannot be pruned")

    def route_keys(self, router, l: int) -> Tensor | None:
        """Layer l's learned keys (R, n, Hd), one per routed head and source column, which a token's
        query is scored against (token-dependent kinds; None for the others): the logit lens of
        ``orchestrator.analysis.routes`` maps them to tokens."""
        return None

    def macs_per_token(self, router, l: int) -> int:
        raise NotImplementedError

    # -- execution --------------------------------------------------------------------------------
    def make_mixer(self, router, *, block: int | None = None, use_ops: bool | None = None):
        """A fresh mixer for one forward pass (``block``, ``use_ops``: the buffer mixer's)."""
        raise NotImplementedError

    def concat_route(self, router, l: int, k: Tensor, v: Tensor, k_all: Tensor, v_all: Tensor,
                     q: Tensor | None, x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Layer l >= 1 of the concatenation reference: k, v (B, T, R, Hd) are layer l's raw K/V,
        k_all, v_all (B, T, (l+1)R, Hd) every layer's so far, q and x its query and attention
        input; routed (B, R, T, Hd)."""
        d = router.dense(l).to(device=k.device, dtype=k.dtype)
        eq = "hc,btcd->bhtd" if d.dim() == 2 else "hcd,btcd->bhtd"
        return torch.einsum(eq, d, k_all), torch.einsum(eq, d, v_all)

    def traffic_slots(self, router, block: int | None) -> int:
        raise NotImplementedError

    def activation_elems(self, router, B: int, T: int) -> tuple[int, int]:
        """(kept, transient): elements a training step's routing keeps from forward to backward on
        top of the baseline's activations, and the most it holds at once on top of those (the
        analytic memory of ``lime_arch.accounting.routing_memory``). Default: nothing (identity;
        the running mean's sums are freed once read)."""
        return 0, 0


def average_dense(R: int, l: int, sources: list[int]) -> Tensor:
    """The dense (R, (l+1)R) matrix of the uniform average of ``sources`` (``[l]``: the layer's
    own K/V)."""
    out = torch.zeros(R, (l + 1) * R)
    for s in sources:
        out[:, s * R:(s + 1) * R] = torch.eye(R) / len(sources)
    return out


ROUTER_KINDS: Registry[RouterKind] = Registry("router kind", word="registered")


def register_kind(kind: RouterKind) -> RouterKind:
    """Add the one instance of a ``RouterKind`` subclass to ``ROUTER_KINDS`` under its ``name``."""
    if not isinstance(kind, RouterKind):
        raise TypeError(f"register_kind: {kind!r} is not a RouterKind instance")
    return ROUTER_KINDS.add(kind.name, kind)
