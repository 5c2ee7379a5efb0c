"""Resuming a sweep, and growing its seed axis: only the new trials run, under the same parent run.

A launch of a sweep that ran before continues it when the file defines the same trials (the
fingerprint of the parent run's first launch). The one change allowed is more seeds:
``grid.seed`` grown in the file, or ``lime sweep run FILE --add-seeds N`` (N new seeds after the
largest one in effect; the file is not rewritten, so the record remembers them). Anything else
that changes the trial set is refused, as is removing a seed that ran.

Ray Tune cannot add trials to an experiment it restores, so every growth is one more Ray
experiment inside the sweep's folder: ``results/ray/<sweep>/`` is the first launch's experiment
(as always) and ``results/ray/<sweep>/extend-<k>/`` the k-th growth's (its trials' folders and
logs are there). Each launch resumes every experiment that is not finished, in order, then the
new one; all trials log to the same MLflow experiment and parent run, so ``lime report`` sees
them all.

A launch is planned once (``prepare``) into a ``Launch`` that the driver hands on: to tracking
(which records its seeds on the parent run and fills in the run's ids), to the tuner
(``tuners``), to ``finish`` and to the waves (``orchestrator.sweep.decide``). Its history (the
first launch's seeds and fingerprint, and one entry per extension: its seeds and, for a wave, the
values it runs) comes from ``lime_sweep.json`` (``orchestrator.sweep.local_state``), a cache of the
parent run's params; without it, from the record (``orchestrator.sweep.history.from_record``).
Caches written before seed growth existed are read by their fingerprint: seeds appended at the
end of ``grid.seed`` are recognised.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lime_arch import ConfigError
from orchestrator.sweep import history
from orchestrator.sweep.history import EXT_PREFIX
from orchestrator.sweep.history import fmt_seeds as _fmt
from orchestrator.sweep.local_state import STATE_FILE, read_state, write_state
from orchestrator.sweep.mlflow_runs import RAY_DONE
from orchestrator.sweep.schema import SweepSpec
from orchestrator.sweep.view import ray_trials


@dataclasses.dataclass
class Part:
    """One Ray experiment of a sweep: the first launch's (``name`` "") or an extension's."""

    name: str
    seeds: list | None  # the seed values it runs (None: a sweep without a seed axis, or a search)
    spec: SweepSpec  # the sweep restricted to those seeds
    dir: Path  # its Ray experiment folder
    axis: str | None = None  # a wave's: the compared axis and the values it runs (None: every value)
    values: list | None = None


@dataclasses.dataclass
class Launch:
    """One launch of a sweep: the sweep in effect (every seed) and its Ray experiments, planned
    once and handed on; tracking fills in ``parent`` and ``exp_id``."""

    spec: SweepSpec
    state: dict  # the history it continues (the cache, else the record; {}: a first launch)
    parts: list[Part]
    added: list  # seeds this launch adds
    message: str | None  # one line for the console, or None
    record: dict | None  # the history to save (None: nothing new)
    exp_dir: Path = Path()
    uri: str = ""
    parent: str | None = None  # the parent run, once tracking is open
    exp_id: str | None = None

    @property
    def extensions(self) -> list[dict]:
        """The seed extensions in effect (each a Ray experiment after the first)."""
        return list((self.record or self.state).get("extensions") or [])


def _where(spec: SweepSpec) -> str:
    return spec.path or spec.name


def _ext_part(spec: SweepSpec, ext: dict, exp_dir: Path) -> Part:
    """An extension's Ray experiment: its seeds, and only the axis values it names (a wave of
    sequential seeds)."""
    part = spec.with_seeds(ext["seeds"])
    values = ext.get("values")
    if values is not None:
        part = part.with_values(ext["axis"], values)
    return Part(ext["name"], list(ext["seeds"]), part, exp_dir / ext["name"],
                ext.get("axis") if values is not None else None, None if values is None else list(values))


def plan(spec: SweepSpec, exp_dir: Path, uri: str, add_seeds: int = 0, only: list | None = None,
         state: dict | None = None) -> Launch:
    """The launch of ``spec`` against the sweep's history ``state`` (default: the cache in
    ``exp_dir``; nothing is read from MLflow: the dry run plans with it); ConfigError when it
    cannot continue that sweep (its trials changed, a seed that ran was removed, another MLflow
    store). ``only``: the values of the compared axis the added seeds run for
    (``orchestrator.sweep.decide``: the baseline and the undecided variants); None: every value."""
    exp_dir = Path(exp_dir)
    state = read_state(exp_dir) if state is None else state
    if not state.get("fingerprint") and "base_fingerprint" not in state:
        state = {}  # nothing ran from it
    axis = spec.seed_axis() if spec.search is None else None
    if only is not None and not add_seeds:
        raise ConfigError("a wave names the values its seeds run for, but adds no seeds")
    if add_seeds and spec.search is not None:
        raise ConfigError(f"--add-seeds: {_where(spec)} is a search sweep; only a grid sweep's seed axis can grow "
                          "(Optuna samples a search's trials)")
    if add_seeds and axis is None:
        raise ConfigError(f"--add-seeds: {_where(spec)} has no seed axis (grid.seed); adding one would rename "
                          "every trial")
    if state.get("tracking_uri") and state["tracking_uri"] != uri:
        raise ConfigError(f"MLFLOW_TRACKING_URI: {exp_dir} was started with the MLflow store "
                          f"{state['tracking_uri']}; set MLFLOW_TRACKING_URI to it to resume, or delete {exp_dir}")
    where = {"exp_dir": exp_dir, "uri": uri}
    if axis is None:
        if state and state.get("base_fingerprint", state.get("fingerprint")) != spec.fingerprint():
            raise _changed(spec, exp_dir)
        return Launch(spec, state, [Part("", None, spec, exp_dir)], [], None, None, **where)
    file_seeds = list(spec.grid[axis])
    if not state:  # a first launch: the file's seeds and any added ones are one experiment
        added = _after(file_seeds, add_seeds)
        first = Part("", file_seeds + added, spec.with_seeds(file_seeds + added) if added else spec, exp_dir)
        record = {"seeds": first.seeds, "base_seeds": first.seeds, "base_fingerprint": first.spec.fingerprint(),
                  "extensions": []}
        msg = (f"seeds {_fmt(added)} added to the file's {_fmt(file_seeds)}: {first.spec.n_trials()} trials"
               + _not_rewritten(spec, axis, file_seeds, exp_dir)) if added else None
        return Launch(first.spec, state, [first], added, msg, record if added else None, **where)
    base_seeds, exts, base_fp = _history(state, spec, axis, exp_dir)
    removed = [s for s in base_seeds if s not in file_seeds]
    if removed:
        raise ConfigError(f"{_where(spec)}: grid.{axis}: seed {_fmt(removed)} ran in this sweep ({exp_dir}); seeds "
                          f"can be added, not removed; restore it, or delete {exp_dir} to start the sweep over")
    in_effect = base_seeds + [s for e in exts for s in e["seeds"]]
    added = [s for s in file_seeds if s not in in_effect] + _after([*in_effect, *file_seeds], add_seeds)
    parts = [Part("", base_seeds, spec.with_seeds(base_seeds), exp_dir)]
    parts += [_ext_part(spec, e, exp_dir) for e in exts]
    if added:
        name = f"{EXT_PREFIX}{len(exts) + 1}"
        ext = {"name": name, "seeds": added}
        if only is not None:
            ext.update(axis=_compared_axis(spec), values=list(only))
        exts = [*exts, ext]
        parts.append(_ext_part(spec, ext, exp_dir))
    full = spec.with_seeds(in_effect + added)
    if any(e.get("values") is not None for e in exts):  # waves: the union of the parts, not a cross product
        full = full.restricted({i for p in parts for i in p.spec.trial_ids()})
    record = {"seeds": in_effect + added, "base_seeds": base_seeds, "base_fingerprint": base_fp, "extensions": exts}
    msgs = []
    if added:
        msgs.append(f"seeds {_fmt(added)} added: {parts[-1].spec.n_trials()} new trials in Ray experiment "
                    f"{parts[-1].dir}; {full.n_trials()} trials in all, under the same MLflow parent run")
    if add_seeds:
        msgs.append(_not_rewritten(spec, axis, file_seeds, exp_dir).lstrip("; "))
    elif [s for s in in_effect if s not in file_seeds]:
        earlier = [s for s in in_effect if s not in file_seeds]
        msgs.append(f"seeds in effect: {_fmt(full.grid[axis])} ({_fmt(earlier)} added earlier and not in the file; "
                    f"the parent run records them, {exp_dir / STATE_FILE} caches them)")
    return Launch(full, state, parts, added, "; ".join(msgs) or None, record, exp_dir=exp_dir, uri=uri)


def _compared_axis(spec: SweepSpec) -> str:
    """The grid axis the report compares (its name as the grid writes it)."""
    axis = spec.report.axis
    return next((a for a in spec.grid if a == axis or spec.key(a) == spec.key(axis)), axis)


def _after(seeds: list, n: int) -> list[int]:
    """``n`` seeds after the largest of ``seeds``."""
    top = max(seeds) if seeds else -1
    return list(range(top + 1, top + 1 + n)) if n else []


def _not_rewritten(spec: SweepSpec, axis: str, file_seeds: list, exp_dir: Path) -> str:
    return (f"; --add-seeds does not rewrite {spec.path or 'the file'} (its grid.{axis} stays {_fmt(file_seeds)}): "
            f"the parent run records the seeds in effect, {exp_dir / STATE_FILE} caches them")
def _history(state: dict, spec: SweepSpec, axis: str, exp_dir: Path) -> tuple[list, list[dict], str]:
    """(the first launch's seeds, the extensions so far, the first launch's fingerprint)."""
    if "base_seeds" in state and "base_fingerprint" in state:
        exts = [e for e in state.get("extensions") or [] if isinstance(e, dict) and "name" in e and "seeds" in e]
        fp = state["base_fingerprint"]
        if spec.with_seeds(state["base_seeds"]).fingerprint() != fp:
            raise _changed(spec, exp_dir)
        return list(state["base_seeds"]), exts, fp
    # a state written before seed growth existed holds the fingerprint of the first launch, whose
    # seeds are the first of the file's (seeds appended at the end), or those its Ray trials ran
    fp, seeds = state.get("fingerprint"), list(spec.grid[axis])
    ran = {name.split(f"{axis}=", 1)[1].split(",", 1)[0] for name in ray_trials(exp_dir, extensions=False)
           if f"{axis}=" in name}
    candidates = [seeds[:k] for k in range(len(seeds), 0, -1)] + [[s for s in seeds if str(s) in ran]]
    for cand in candidates:
        if cand and spec.with_seeds(cand).fingerprint() == fp:
            return cand, [], fp
    raise _changed(spec, exp_dir)


def _changed(spec: SweepSpec, exp_dir: Path) -> ConfigError:
    return ConfigError(f"{_where(spec)}: the sweep's trials changed since {exp_dir} was started (only seeds can be "
                       f"added: grid.seed, or --add-seeds N); restore the file, or delete {exp_dir} to start the "
                       "sweep over")


def prepare(spec: SweepSpec, exp_dir: Path, uri: str, add_seeds: int = 0, only: list | None = None) -> Launch:
    """``plan`` for a real launch, against the sweep's history: the cache, else (``lime_sweep.json``
    gone) the parent run's record. Caches the seeds in effect before anything runs (the record gets
    them once tracking is open: ``history.record_launch``); a growth that has not started simply
    starts on the next launch."""
    cached = read_state(exp_dir)
    launch = plan(spec, exp_dir, uri, add_seeds, only, cached or history.from_record(spec, uri))
    if launch.state and not cached:  # rebuilt from the record: cached again
        write_state(exp_dir, launch.state)
    if launch.record is not None and any(launch.state.get(k) != v for k, v in launch.record.items()):
        write_state(exp_dir, launch.record)
    return launch


# -- running the experiments ------------------------------------------------------------------------------
class Sequence:
    """The sweep's Ray experiments, fitted in turn; quacks like a ``Tuner`` (``fit`` returns the
    results of every experiment it ran). An experiment whose trials are all done (by Ray's saved
    state, or by the record: ``done``) is not restored."""

    def __init__(self, parts: list[Part], view, ctx: dict, make: Callable[..., Any], done: frozenset = frozenset()):
        self.parts, self.view, self.ctx, self.make, self.done = parts, view, ctx, make, done

    def fit(self) -> list:
        results: list = []
        final: dict[str, str] = {}
        for part in self.parts:
            if finished(part, self.done):
                continue
            self.view.total = part.spec.n_trials()
            tuner = self.make(part.spec, part.dir, self.view, {**self.ctx, "exp_dir": str(part.dir)})
            results.extend(tuner.fit())
            final.update(getattr(self.view, "final_status", {}) or {})
        self.view.final_status = final
        return results


def finished(part: Part, done: frozenset = frozenset()) -> bool:
    """Every trial of the experiment is done: by Ray's saved state, or (a grid's, its Ray folder
    perhaps gone) by the record (``done``: the trial ids whose runs finished, ``history.reconcile``)."""
    saved = ray_trials(part.dir, extensions=False)
    if len(saved) >= part.spec.n_trials() and all(s == RAY_DONE for s in saved.values()):
        return True
    if not done:
        return False
    states, ids = history.reconcile(saved, done), part.spec.trial_ids()
    return bool(ids) and all(states.get(i) == RAY_DONE for i in ids)


def tuners(launch: Launch, view, ctx: dict, make: Callable[..., Any], done: frozenset = frozenset()):
    """The Tuner of a launch (``make(spec, exp_dir, view, ctx)``), or a ``Sequence`` of them when its
    seeds grew or its trials are all done (``done``: the trial ids whose runs finished)."""
    if len(launch.parts) == 1 and not finished(launch.parts[0], done):
        return make(launch.spec, launch.exp_dir, view, ctx)
    return Sequence(launch.parts, view, ctx, make, done)
