"""The depth-mix registry: how a layer reuses earlier layers' hidden states or values.

The second pluggable axis of the model, beside the routers (``lime_arch.routers``): a router
decides which buffered K/V heads a layer's attention reads; a depth mix decides what flows along
the depth of the network: the plain residual stream (``none``), a learned average of every
earlier block output (DenseFormer), n parallel residual streams (Hyper-Connections), or a
shortcut from the first layer's values (ResFormer's value residual). The two compose: any
router with any depth mix is a legal model.

A depth mix is one class with ``@register_depth_mix(name)``, declared torch-free: its name, its
typed ``arguments`` and ``check`` (what is wrong with them for a model) are all a config check
reads, so ``lime_arch.ModelConfig`` validates ``model.depth_mix`` without importing torch. The
module that defines a depth mix imports no torch at its top; its methods import torch where they
need it (``__init__``, which makes the weights, and the hooks that call torch functions). Building
it (``build_depth_mix``, or calling the class) makes its implementation, the class mixed with the
``nn.Module`` base ``lime_arch.depth_mix.module.DepthMixModule`` (``lime_arch.specs.Declared``):
an ``nn.Module`` that is an instance of the class. The decoder calls its
hooks, each with the per-pass ``memo`` (a fresh dict per forward pass, for state such as the
block outputs so far); every default is the plain residual stream, so a class overrides only
what it changes:
  ``begin(x, memo)``           the embedding output (B, T, C) -> the residual state
  ``sublayer(k, x, fn, memo)`` sublayer k (2l: attention of layer l, 2l+1: its MLP); ``fn`` maps
                               the sublayer's input (B, T, C) to its output; default ``x + fn(x)``
  ``after_block(l, x, memo)``  after block l (0-based)
  ``end(x, memo)``             the residual state -> (B, T, C) for the final norm
  ``values(l, v, memo)``       the values layer l's attention reads, (B, R, T, Hd), after routing
and, outside the pass, ``hidden(x)``: the residual state as one (B, T, C) hidden state (analysis).
Arguments are typed, positive and optional from the right: ``denseformer`` is dilation 1 and
period 1, ``denseformer-2`` dilation 2, ``denseformer-2-4`` dilation 2 and period 4 (the spec
machinery is ``lime_arch.specs``, shared with the routers). Configs hold the spec string only
(names and numbers: MLflow params, sweep grids).

Weights: created after (and independently of) every baseline weight, under a forked RNG, so a
model with a depth mix has bit-for-bit the same shared weights as the ``none`` model of the same
seed (the paired statistics of a sweep rely on it). An entry that draws random weights should
use ``self.std`` (the model's init std).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from lime_arch.errors import ConfigError
from lime_arch.specs import Declared, OptionalArg, SpecRegistry, spec_string

if TYPE_CHECKING:
    from torch import Tensor


class MixArg(OptionalArg):
    """One typed argument of a depth mix (``MixArg("rate", 4)``, ``MixArg("init", 1.0, float)``);
    ``default`` (positive, of ``type``) applies when the spec leaves it out."""


# set on every depth mix instance; an argument of the same name would overwrite one of them
_RESERVED = frozenset({"name", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "norm_eps", "std",
                       "arg_values", "training", "declaration"})


class _ValuesAfterRouting:
    """A mixer whose routed values then pass through the depth mix's ``values`` hook."""

    def __init__(self, mixer, mix: DepthMix, memo: dict):
        self.mixer, self.mix, self.memo = mixer, mix, memo

    def route(self, l: int, k: Tensor, v: Tensor, q: Tensor | None = None,
              x: Tensor | None = None) -> tuple[Tensor, Tensor]:
        k, v = self.mixer.route(l, k, v, q=q, x=x)  # routed (B, R, T, Hd)
        return k, self.mix.values(l, v, self.memo)


class DepthMix(Declared):
    """Base class: the plain residual stream. See the module docstring for the hooks. The
    instance attributes (``n_layers``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
    ``norm_eps``, ``std`` and each argument by name) are set by ``DepthMixModule.__init__``,
    which a subclass's ``__init__`` reaches with ``super().__init__(**kw)``."""

    implementation = "lime_arch.depth_mix.module:DepthMixModule"
    name: ClassVar[str]
    arguments: ClassVar[tuple[MixArg, ...]] = ()
    # True: at step 0 the model computes what the ``none`` model of the same seed computes (the
    # tests check it for every entry that says so)
    baseline_at_init: ClassVar[bool] = True

    @property
    def spec(self) -> str:
        """The canonical spec: the name and every argument."""
        return spec_string(self.name, self.arg_values)

    @classmethod
    def check(cls, args: dict[str, int | float], n_layers: int) -> str | None:
        """What is wrong with these arguments for a model of ``n_layers`` layers (None: nothing)."""
        return None

    @classmethod
    def param_count(cls, args: dict[str, int | float], *, n_layers: int, d_model: int) -> int:
        """How many weights the built mix has for a model of this shape, torch-free: the size guards
        (``lime_arch.size``) count them before anything is built or imported (a test holds every
        entry to its built module's count). Default: none."""
        return 0

    # -- the per-pass hooks (defaults: the plain residual stream) -------------------------------
    def begin(self, x: Tensor, memo: dict) -> Tensor:
        return x

    def sublayer(self, k: int, x: Tensor, fn: Callable[[Tensor], Tensor], memo: dict) -> Tensor:
        return x + fn(x)

    def after_block(self, l: int, x: Tensor, memo: dict) -> Tensor:
        return x

    def end(self, x: Tensor, memo: dict) -> Tensor:
        return x

    def values(self, l: int, v: Tensor, memo: dict) -> Tensor:
        return v

    def hidden(self, x: Tensor) -> Tensor:
        """The residual state as one hidden state (B, T, C), for analysis (a block's output is the
        residual state: (B, T, n, C) with Hyper-Connections). Default: the state itself."""
        return x

    def wrap_mixer(self, mixer, memo: dict):
        """The mixer the attention layers call: ``mixer`` itself unless this class overrides
        ``values``, which then sees every layer's routed values."""
        if type(self).values is DepthMix.values:
            return mixer
        return _ValuesAfterRouting(mixer, self, memo)

    # -- optimizer and accounting ---------------------------------------------------------------
    def decays(self, name: str) -> bool:
        """Whether parameter ``name`` (relative to this module) takes weight decay. Default: none
        of a depth mix's weights do (they are mixing scalars, like the router's)."""
        return False

    def macs_per_token(self) -> int:
        """Multiply-accumulates per token of the mixing itself (``lime_arch.accounting``)."""
        return 0


class Submodule(Declared):
    """A depth mix's own building block, declared without torch like the mix itself: a subclass
    defines ``__init__`` (calling ``super().__init__()`` first) and ``forward`` as an ``nn.Module``
    would, importing torch inside them; an instance is an ``nn.Module`` (the class mixed with it on
    first use), so it nests in ``nn.ModuleList`` and keeps its parameters' names."""

    implementation = "torch.nn:Module"


DEPTH_MIXES = SpecRegistry("depth mix", key="model.depth_mix", base=DepthMix, arg_class=MixArg, reserved=_RESERVED)


def register_depth_mix(name: str):
    """Class decorator: add a ``DepthMix`` subclass to ``DEPTH_MIXES`` under ``name``, after checking
    its name and ``arguments`` (a TypeError or ValueError here is a bug in the class)."""
    return DEPTH_MIXES.register(name)


def depth_mix_specs() -> list[str]:
    """Every registered depth mix as a spec string (its name: the arguments' defaults), in
    registration order."""
    return DEPTH_MIXES.specs()


def parse_depth_mix(spec: str) -> tuple[type[DepthMix], tuple[int | float, ...]]:
    """'denseformer-2' -> (DenseFormer, (2, 1)). Unknown names or bad arguments raise ConfigError."""
    return DEPTH_MIXES.parse(spec)


def check_depth_mix(spec: str, *, n_layers: int) -> None:
    """Parse ``spec`` and check it against the model (ConfigError, one line, naming the field)."""
    cls, args = parse_depth_mix(spec)
    problem = cls.check(dict(zip((a.name for a in cls.arguments), args)), n_layers)
    if problem:
        raise ConfigError(f"model.depth_mix: {spec!r}: {problem}")


def build_depth_mix(spec: str, *, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int,
                    norm_eps: float, std: float) -> DepthMix:
    """The depth mix module of ``spec`` (torch loads here). Its weights are drawn (if at all) from
    a fork of the global RNG, which is left as it was: the model's other weights do not depend on
    the depth mix."""
    check_depth_mix(spec, n_layers=n_layers)
    cls, args = parse_depth_mix(spec)
    module = importlib.import_module("lime_arch.depth_mix.module")
    return module.build(cls, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                        head_dim=head_dim, norm_eps=norm_eps, std=std, args=args)


@register_depth_mix("none")
class NoDepthMix(DepthMix):
    """The standard residual stream: x <- x + sublayer(x)."""
