"""Size guards, checked before anything is expanded, built or allocated (torch-free).

A sweep of 10^6 trials would be expanded, validated and shown for minutes while its memory grows;
``d_model: 1000000`` is an 8T-parameter model whose training state (4 TB at 16 bytes per
parameter) no machine holds. Both are input mistakes far more often than intentions, so each is
one line naming the key and the limit, exit 2, with the override in the line:

- trials per sweep: at most ``$LIME_MAX_TRIALS`` (default 10,000), counted from the grid's axis
  lengths (or ``search.num_samples x repeat``) before any trial is built;
- parameters per model: at most ``$LIME_MAX_PARAMS`` (default 20e9, five times ``1b-gqa``),
  counted from the config by ``lime_arch.size`` (the dense weights and the depth mix's, whose
  stream counts grow them as a square or a cube: a lower bound that leaves out the small router
  weights), for every trial of a sweep and for ``lime train``.
"""
from __future__ import annotations

import math
import os
from typing import Any

from lime_arch.errors import ConfigError
from lime_arch.size import TRAIN_STATE_BYTES, depth_mix_params, min_params, train_state_bytes
from orchestrator.core.fmt import human

TRIALS_ENV, DEFAULT_TRIALS = "LIME_MAX_TRIALS", 10_000
PARAMS_ENV, DEFAULT_PARAMS = "LIME_MAX_PARAMS", 20_000_000_000


def _limit(env: str, default: int) -> int:
    raw = os.environ.get(env)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise ConfigError(f"${env}: must be a positive whole number, got {raw!r}")
    return int(v)


def max_trials() -> int:
    return _limit(TRIALS_ENV, DEFAULT_TRIALS)


def max_params() -> int:
    return _limit(PARAMS_ENV, DEFAULT_PARAMS)


def check_trials(n: int, where: str, shape: str) -> None:
    """``n`` trials (``shape``: how they come about, e.g. ``router (8) x seed (5)``) within the limit."""
    limit = max_trials()
    if n > limit:
        raise ConfigError(f"{where}: {n:,} trials ({shape}) is more than the limit of {limit:,} trials per sweep; "
                          f"shrink it or raise ${TRIALS_ENV}")


def check_model(mcfg: Any, where: str) -> int:
    """The model of ``mcfg`` (a ``lime_arch.ModelConfig``) within the parameter limit; returns its
    parameter count (lower bound)."""
    n, limit = min_params(mcfg), max_params()
    if n > limit:
        raise ConfigError(f"{where}: the model has at least {human(n)} parameters ({_shape(mcfg)}), "
                          f"{human(train_state_bytes(n))}B of training state at {TRAIN_STATE_BYTES} bytes per "
                          f"parameter, more than the limit of {human(limit)} parameters; make it smaller or raise "
                          f"${PARAMS_ENV}")
    return n


def _shape(mcfg: Any) -> str:
    mix = f", depth_mix {mcfg.depth_mix} ({human(depth_mix_params(mcfg))} of them)" if mcfg.depth_mix != "none" else ""
    return f"d_model {mcfg.d_model}, n_layers {mcfg.n_layers}, ffn_dim {mcfg.ffn_dim}, vocab {mcfg.vocab_size}{mix}"


def describe() -> str:
    """The limits in effect, for the dry run."""
    return (f"limits: {max_trials():,} trials (${TRIALS_ENV}), {human(max_params())} parameters per model "
            f"(${PARAMS_ENV})")
