"""Before any compute: every requested task resolved by the harness, and its data found.

- Names are looked up in the generated tasks (``orchestrator.evaluation.localtasks``) and the
  ``include`` folders first; only when a name is not there is the harness's own index built (it
  reads ~15,000 YAML files, seconds), so local-only evaluations never touch it. A suite expands to
  its tasks (``orchestrator.evaluation.suites``); ``<task>_bpb`` is the gold-answer loss variant
  of a multiple-choice task (``orchestrator.evaluation.variants``).
- Data: a task whose ``dataset_path`` is ``json``/``csv``/``parquet``/``text``/``arrow`` (or a local
  folder) needs its ``data_files`` on disk; any other dataset comes from the Hugging Face hub. With
  ``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` set it must be in the Hugging Face cache; without them
  the hub must answer (one TCP probe, seconds: ``orchestrator.engine.data.hub``). Otherwise one
  line names the task, the dataset and the ways out: ``HF_DATASETS_OFFLINE=1`` with the data
  cached, or a local task definition (``dataset_path: json`` with ``data_files``).
"""
from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lime_arch import ConfigError
from orchestrator.engine.data import hub
from orchestrator.evaluation.localtasks import write_local_tasks
from orchestrator.evaluation.settings import EvalSettings
from orchestrator.evaluation.suites import LOCAL_TASKS, base_of_variant

LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
WAYS_OUT = ("set HF_DATASETS_OFFLINE=1 with the dataset in the Hugging Face cache, or define the task locally "
            "(a harness YAML task with dataset_path: json and dataset_kwargs.data_files, in a folder given to "
            "eval.include or --include)")


@dataclass
class Resolved:
    """The harness's task manager and the planned tasks: (name, shots, only its gold-loss variant)."""

    manager: Any
    tasks: list[tuple[str, int | None, bool]] = field(default_factory=list)


def loc(key: str, name: str) -> str:
    """Where a setting was given: ``eval.tasks`` in a sweep file (``key`` "eval"), ``--tasks`` on
    the command line (``key`` "")."""
    return f"{key}.{name}" if key else f"--{name}"


def task_manager(names: list[str], include: list[str], key: str = "eval"):
    """A harness ``TaskManager`` over the generated tasks and ``include``, with the harness's own
    tasks only if some name needs them."""
    from lm_eval.tasks import TaskManager

    for i, p in enumerate(include):  # before the local tasks are written: a mistake writes nothing
        if not Path(p).expanduser().is_dir():
            raise ConfigError(f"{loc(key, 'include')}[{i}]: {p!r} is not a folder (of harness task YAML files)")
    paths = []
    if any(n in LOCAL_TASKS or base_of_variant(n) in LOCAL_TASKS for n in names):
        paths.append(str(write_local_tasks()))
    paths += [str(Path(p).expanduser().resolve()) for p in include]
    tm = TaskManager(include_path=paths or None, include_defaults=False)
    if all(_known(tm, n) for n in names):
        return tm
    return _with_defaults(tuple(paths))


@functools.lru_cache(maxsize=4)
def _with_defaults(paths: tuple[str, ...]):
    """A task manager over the harness's own tasks too: its index reads ~15,000 YAML files, so a
    process (a sweep's evaluation worker) builds it once per set of include paths."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths) or None, include_defaults=True)


def _known(tm, name: str) -> bool:
    base = base_of_variant(name)
    return name in tm.task_index or (base is not None and base in tm.task_index)


def resolve(settings: EvalSettings, key: str = "eval") -> Resolved:
    """The plan of ``settings`` resolved by the harness and checked for data (see the module)."""
    plan = settings.plan()
    names = [n for n, _ in plan]
    tm = task_manager(names, list(settings.include), key)
    out = Resolved(tm)
    probe: dict[str, str | None] = {}
    for name, shots in plan:
        base = None
        if name not in tm.task_index and base_of_variant(name) in tm.task_index:
            base = base_of_variant(name)
        if name not in tm.task_index and base is None:
            near = difflib.get_close_matches(name, tm.all_tasks, n=3)
            raise ConfigError(f"{loc(key, 'tasks')}: unknown task {name!r} (neither a suite nor a task of the LM "
                              "Evaluation Harness)" + (f"; did you mean {', '.join(near)}?" if near else ""))
        for leaf in leaves(tm, base or name):
            check_data(tm, leaf, key, probe)
        out.tasks.append((base or name, shots, base is not None))
    return out


def leaves(tm, name: str) -> list[str]:
    """The tasks a name stands for: itself, a tag's tasks, or a group's (one level of names)."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = tm.task_index[name]
    if entry.kind is Kind.TAG:
        return sorted(n for n, e in tm.task_index.items() if name in e.tags)
    if entry.kind is Kind.GROUP and entry.yaml_path is not None:
        children = load_yaml(entry.yaml_path, resolve_func=False).get("task") or []
        return [c for c in children if isinstance(c, str) and c in tm.task_index]
    return [name]


def _config(tm, name: str) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = tm.task_index[name]
    if entry.yaml_path is not None:
        return load_yaml(entry.yaml_path, resolve_func=False)
    return dict(entry.cfg or {})


def check_data(tm, name: str, key: str, probe: dict[str, str | None]) -> None:
    """ConfigError when a task's data cannot be had (see the module)."""
    cfg = _config(tm, name)
    path, ds_name, kwargs = cfg.get("dataset_path"), cfg.get("dataset_name"), cfg.get("dataset_kwargs") or {}
    if not path or cfg.get("custom_dataset"):
        return  # a Python task or a custom loader: nothing to check ahead
    if path in LOCAL_BUILDERS or os.path.isdir(os.path.expanduser(str(path))):
        for f in _data_files(kwargs.get("data_files")):
            if not (os.path.exists(os.path.expanduser(f)) or "://" in f):
                raise ConfigError(f"{loc(key, 'tasks')}: task {name!r}: its data file {f!r} does not exist")
        return
    what = f"the dataset {path}" + (f" ({ds_name})" if ds_name else "")
    if hub.offline():
        try:
            import datasets

            datasets.load_dataset_builder(path, ds_name, **{k: v for k, v in kwargs.items() if k != "data_files"})
        except Exception as e:  # noqa: BLE001 - not cached (or not there): the user's to fix
            raise ConfigError(f"{loc(key, 'tasks')}: task {name!r} needs {what}, which is not in the Hugging Face "
                              f"cache (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set; {type(e).__name__}); {WAYS_OUT}"
                              ) from None
        return
    if "hub" not in probe:
        probe["hub"] = hub.unreachable()
    if probe["hub"] is not None:
        raise ConfigError(f"{loc(key, 'tasks')}: task {name!r} needs {what} from the Hugging Face hub, which is not "
                          f"reachable ({hub.endpoint()}: {probe['hub']}); {WAYS_OUT}")


def _data_files(spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, (list, tuple)):
        return [f for s in spec for f in _data_files(s)]
    if isinstance(spec, dict):
        return [f for s in spec.values() for f in _data_files(s)]
    return []
