"""What a trial costs before its first step, and what a process that runs several trials resets.

**Measurement.** ``StartupClock`` times the phases of one trial attempt in the process that runs
it (``time.perf_counter``, injectable for tests); the trainer adds its own phases
(``Trainer.timings``: data, model, resume, mlflow), and ``StartupHook`` logs them all once, with
the first log point, as ``startup/<phase>_s``:

  process        a fresh worker process: from the process's start (or the sweep's launch, if
                 later) to the trial function: Ray's worker start, its imports, ours; 0 when the
                 process ran a trial before (a reused worker)
  import         the part of ``process`` spent importing the project (torch, lime_arch, ...)
  prepare        resetting the process for the trial (``prepare_process``)
  resume         finding and loading the newest checkpoint (~0 for a fresh start)
  mlflow         MLflow client, experiment, the trial's earlier runs, its run (created or
                 continued) and params
  data           building the data (~0 for a reused worker that built the same data config)
                 and the validation batches
  model          model and optimizer
  to_first_step  from the trial's start (the process's start for a fresh worker, the function's
                 entry for a reused one) to the end of the first step's backward

plus ``startup/worker_trial`` (1: the process's first trial; 2, 3, ...: a reused worker). The
clock costs a few ``perf_counter`` calls per attempt.

**Reuse.** A Ray worker that runs several trials one after the other (``reuse_actors``) must give
each the state of a fresh process wherever the state can change a result or a metric:
``prepare_process`` restores the process's first torch thread count (a trial's ``train.threads``
is process-global), clears torch.compile's caches (compiled code of an earlier model; its
recompile limit would otherwise send a later trial to eager), collects the last trial's garbage
(the imports' objects are frozen out of the collector's sight at the first trial) and resets
the peak-memory counters (``perf/peak_mem_mb`` is the peak since the trial started, not since
the process did). Seeds, RNG states and the routing buffers need nothing: every trial
seeds everything at set-up, and the routing pool hands out uninitialised tensors that are always
written before they are read (which is why a resumed trial equals an uninterrupted one).
``shared_data`` keeps the last data object a process built, so a reused worker does not rebuild
the same corpus: data objects are pure functions of (seed, step) with bounded memos.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from orchestrator.core import outbox
from orchestrator.engine.data import make_batches
from orchestrator.engine.trainer import Hook, Trainer
from orchestrator.engine.trial_config import DataConfig

PREFIX = "startup/"


class StartupClock:
    """The start-up phases of one trial attempt, in seconds.

    ``t0`` is the attempt's start in this process (the trial function's entry); ``before`` is
    time before ``t0`` that belongs to the attempt (a fresh worker's start), counted into
    ``to_first_step``."""

    def __init__(self, now: Callable[[], float] = time.perf_counter, *, before: float = 0.0, worker_trial: int = 1):
        self.now = now
        self.t0 = now()
        self.before = max(0.0, before)
        self.worker_trial = worker_trial
        self.phases: dict[str, float] = {}
        self.first_step: float | None = None  # seconds from t0 to the end of the first step's backward

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.add(name, self.now() - start)

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def elapsed(self) -> float:
        """Seconds since ``t0``."""
        return self.now() - self.t0

    def mark_first_step(self) -> None:
        if self.first_step is None:
            self.first_step = self.elapsed()

    def metrics(self, extra: dict[str, float] | None = None) -> dict[str, float]:
        """``startup/<phase>_s`` for every phase seen (``extra``: the trainer's, added to the
        clock's), ``startup/to_first_step_s`` once the first step ended, ``startup/worker_trial``."""
        phases = dict(self.phases)
        for k, v in (extra or {}).items():
            phases[k] = phases.get(k, 0.0) + v
        out = {f"{PREFIX}{k}_s": v for k, v in phases.items()}
        if self.first_step is not None:
            out[f"{PREFIX}to_first_step_s"] = self.before + self.first_step
        out[f"{PREFIX}worker_trial"] = float(self.worker_trial)
        return out


class StartupHook(Hook):
    """Logs the clock's and the trainer's start-up phases with the attempt's first log point;
    remembers the MLflow run (put it after ``MLflowHook``)."""

    def __init__(self, clock: StartupClock):
        self.clock = clock
        self.sent = False
        self.run_id: str | None = None
        self.step = 0  # the last step logged in this attempt

    def on_start(self, t: Trainer) -> None:
        self.run_id = t.run_id
        self.step = t.step

    def on_log(self, t: Trainer, step: int, metrics: dict, checkpoint: str | None) -> None:
        self.step = step
        self.run_id = t.run_id or self.run_id  # a run opened late (its server was away at the start)

    def after_backward(self, t: Trainer, loss: float) -> None:
        self.clock.mark_first_step()
        return None

    def log_metrics(self, t: Trainer) -> dict[str, float]:
        if self.sent:
            return {}
        self.sent = True
        return self.clock.metrics(t.timings)


# -- the process ------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Process:
    trials: int = 0  # trials this process started
    threads: int | None = None  # torch's intra-op threads before the first trial


_PROCESS = _Process()


def next_trial() -> int:
    """Count a trial started in this process; 1 for the first."""
    _PROCESS.trials += 1
    return _PROCESS.trials


def worker_clock(launched: float | None, import_s: float) -> StartupClock:
    """The clock of a trial starting now in this process: its first trial counts the process's
    start (from the later of the process's start and ``launched``, the sweep's ``time.time()``)
    and ``import_s``; a later trial (a reused worker) counts neither."""
    n = next_trial()
    if n > 1:
        clock = StartupClock(worker_trial=n)
        clock.add("process", 0.0)
        clock.add("import", 0.0)
        return clock
    waits = [w for w in (process_age_s(), time.time() - launched if launched else None) if w is not None]
    clock = StartupClock(before=min(waits, default=0.0), worker_trial=1)
    clock.add("process", clock.before)
    clock.add("import", min(import_s, clock.before) if waits else import_s)
    return clock


def prepare_process(worker_trial: int) -> None:
    """Give the ``worker_trial``-th trial of this process what a fresh process would have (see
    the module doc); the peak-memory counters are reset for every trial."""
    if _PROCESS.threads is None:
        _PROCESS.threads = torch.get_num_threads()
        # what the imports built (torch, sympy, ...) lives as long as the process: out of the
        # collector's sight, a full collection between trials takes ~0.1 s instead of ~0.4 s
        gc.freeze()
    if worker_trial > 1:
        torch.set_num_threads(_PROCESS.threads)
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        gc.collect()  # not frozen again: a finished trial's survivors could leak their cycles
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    reset_peak_memory()
    outbox.reset_health()  # the tracking server's outages are counted per trial


def reset_peak_memory() -> None:
    """The process's peak RSS (Linux: ``/proc/self/clear_refs`` restarts VmHWM, what
    ``schedule.peak_rss_mb`` reads) and CUDA's allocator peak start again from the current use."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    if torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux, 10 ms resolution), None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


# -- data built once per process -----------------------------------------------------------------------
_DATA: dict[str, Any] = {}  # the last data config's key -> its data object


def shared_data(cfg: DataConfig) -> Any:
    """``make_batches(cfg)``, reusing the object built for the same config by the last call in
    this process. One object is kept: a sweep's trials share one data config."""
    key = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    if key not in _DATA:
        _DATA.clear()  # before building: never two corpora in memory
        _DATA[key] = make_batches(cfg)
    return _DATA[key]
