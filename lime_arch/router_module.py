"""The torch side of every router: ``RouterModule``, the ``nn.Module`` base that a router
declaration (``lime_arch.router_base.Router``) is mixed with when it is built.

Everything that depends on the kind (the operand's shape and init, ``dense``, the MACs the
accounting counts, the mixer) is the kind object's (``lime_arch.routing.kinds``); this class asks
it. The implementation class of a router carries its resolved kind as a plain class attribute,
so ``router.kind`` costs nothing on the hot path. A router of a prunable kind may carry top-p
pruning masks (``router.prune``, ``lime_arch.prune``): the mixers then run ``executed()``, a view
with the kept sources and the masked weights.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lime_arch import prune as _prune
from lime_arch.routing import kinds
from lime_arch.routing.kinds.base import RouterKind

kinds.load()  # every kind registered, as when they were imported one by one


class RouterModule(nn.Module):
    """Learned kinds get one parameter per layer l >= 1 (``weights[l - 1]``) shaped like the
    operand of their kind, and ``weight(l)`` returns it. A router may compute its weight from any
    parameters instead (override ``weight``, and ``weight_shape``/``_init_weight`` for parameters
    of another shape); ``weight(l)`` must keep the operand layout of ``kind``."""

    kind: RouterKind  # set on each router's implementation class

    def __init__(self, *, n_layers: int, n_kv_heads: int, head_dim: int, args: Sequence[int | float] = (),
                 init: str, options: Any = None, d_model: int | None = None):
        super().__init__()
        if len(args) != len(self.arguments):
            raise ValueError(f"router {self.name}: takes {len(self.arguments)} arguments, got {tuple(args)}")
        self.n_layers, self.R, self.head_dim, self.init = n_layers, n_kv_heads, head_dim, init
        # the kind's typed options (None: its defaults; a kind without options refuses any) and the
        # model width (read by a kind whose weights depend on the hidden state)
        self.options, self.d_model = self.kind.check_options(options, d_model), d_model
        self.arg_values = tuple(args)
        for a, v in zip(self.arguments, args):
            setattr(self, a.name, v)
        self.weights = nn.ParameterList(
            [nn.Parameter(self._init_weight(l)) for l in range(1, n_layers)] if self.kind.learned else []
        )

    @classmethod
    def implementation_attributes(cls, declaration: type) -> dict[str, Any]:
        return {"kind": declaration.kind}  # KindName -> the registered RouterKind

    @property
    def learned(self) -> bool:
        return self.kind.learned

    def operand_shape(self, l: int) -> tuple[int, ...] | None:
        """The shape of ``weight(l)`` for a learned kind, e.g. (R, |S|*R), (R, |S|) or (R, |S|*R, Hd)."""
        return self.kind.operand_shape(self, l)

    def weight_shape(self, l: int) -> tuple[int, ...]:
        """The shape of layer l's parameter (by default the operand itself)."""
        return self.operand_shape(l)

    def _init_weight(self, l: int) -> torch.Tensor:
        """Layer l's initial parameter: the kind's (the paper's U(-b, b) and identity on the
        current slot; ``identity`` init: exactly the baseline at step 0)."""
        return self.kind.init_weight(self, l)

    def weight(self, l: int) -> torch.Tensor | None:
        """The operand the mixer multiplies for layer l, shaped ``operand_shape(l)``."""
        if l == 0 or not self.kind.learned:
            return None
        return self.weights[l - 1]

    def dense(self, l: int) -> torch.Tensor:
        """Dense (R, (l+1)*R) equivalent (per-dim: (R, (l+1)*R, Hd)), zeros outside the sources (and,
        while pruned, zeros where the mask prunes)."""
        return self.kind.dense(self.executed(), l)

    def executed(self):
        """What the mixers run: this router, or while top-p pruning masks are set its pruned view
        (``lime_arch.prune.PrunedRouter``: the kept sources only, the masked weights)."""
        return _prune.executed(self)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def decays(self, name: str) -> bool:
        """Whether parameter ``name`` (relative to this router) takes weight decay (the optimizer's
        router group; ``lime_arch.optim``): the kind's choice, by default none."""
        return self.kind.decays(self, name)

    def macs_per_token(self, l: int) -> int:
        """Multiply-accumulates per token of routing K and V at layer l."""
        return self.kind.macs_per_token(self, l)
