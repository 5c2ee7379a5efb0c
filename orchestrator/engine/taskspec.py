"""A synthetic task from a data config (``data.source`` = a task name, ``data.task`` = its
parameters), with errors that name the config key. Cheap: nothing is generated, so trial
configs are checked with it before any compute."""
from __future__ import annotations

import re
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.tasks import Task, make_task

PARAM_RE = re.compile(r"parameter '([A-Za-z0-9_]+)'")


def task_error(err: ConfigError) -> ConfigError:
    """A task's ConfigError re-worded to name the config key ``data.task.<param>``."""
    msg = str(err)
    m = PARAM_RE.search(msg)
    return ConfigError(f"data.task.{m.group(1)}: {msg}" if m else f"data.task: {msg}")


def _split_params(cfg: Any) -> tuple[dict[str, Any], int]:
    params = dict(cfg.task)  # a mapping: DataConfig's type says so
    data_seed = params.pop("data_seed", 0)
    if isinstance(data_seed, bool) or not isinstance(data_seed, int):
        raise ConfigError(f"data.task.data_seed: must be an integer, got {data_seed!r}")
    return params, data_seed


def build_task(name: str, cfg: Any) -> tuple[Task, int]:
    """The task and data seed of a data config (its sizes are checked by DataConfig's field types);
    ConfigErrors name ``data.*`` keys."""
    params, data_seed = _split_params(cfg)
    try:
        return make_task(name, **params), data_seed
    except ConfigError as err:
        raise task_error(err) from None
    except TypeError as err:  # e.g. a non-string key
        raise ConfigError(f"data.task: {err}") from None
