"""Run a sweep file with Ray Tune (``lime sweep run``).

- The sweep is parsed and validated completely (``orchestrator.sweep.spec``) before Ray or MLflow is
  touched; a mistake is one ``ConfigError`` line and exit code 2.
- One Ray Tune ``Tuner`` per sweep: grid axes become ``tune.grid_search``, a ``search`` block
  becomes ``OptunaSearch`` (seeded TPE) wrapped in a ``Repeater`` (seeds), optionally with ASHA.
  Results and checkpoints live in ``<results>/ray/<sweep>/`` (``$LIME_RESULTS``, default
  ``results``); each trial folder also holds the trial's own log (``trial.log``).
- Every trial is ``orchestrator.sweep.trainable``'s trainable around the engine's ``run_trial``;
  a retried or resumed trial continues from its newest checkpoint and keeps its MLflow run.
  Tune reuses worker processes across trials (``reuse_actors``; ``LIME_REUSE_WORKERS=0``: a
  fresh process per trial), restored experiments too.
- The parent run gets the sweep's wall time (Tune's fit, summed over launches, a killed launch's
  up to its last beat: ``WallClock``), the slots (trials at once), Ray's start and the launch
  count (``sweep/*``): the report's efficiency ratio.
- MLflow (``orchestrator.sweep.mlflow_runs``): one parent run per sweep (its id is kept in
  ``<results>/ray/<sweep>/lime_sweep.json``, a cache: without it the record is searched), one child run per
  trial. Runs left ``RUNNING`` by a killed driver are closed on the next start and at the end;
  the summary at the end is ``orchestrator.sweep.finish``.
- Running the same sweep again resumes it (``Tuner.restore``): finished trials are not run again,
  unfinished ones continue from their checkpoints, errored ones are retried.
- An ``eval:`` block: its tasks are checked before anything starts, and after the fit every
  finished trial not yet evaluated under it is (``orchestrator.sweep.evaluate``), once.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from lime_arch import ConfigError
from orchestrator.core import dashboard, outbox, record
from orchestrator.core.record import child_runs, end_run
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, experiment_id, init_store, tracking_uri
from orchestrator.sweep import connect, evaluate, extend, history, preflight
from orchestrator.sweep.console import LOST_RETRIES, LOST_RETRIES_ENV, TrialNamer, launch_note, live_view
from orchestrator.sweep.finish import finish
from orchestrator.sweep.local_state import STATE_FILE, read_state, write_state  # noqa: F401 - moved there
from orchestrator.sweep.mlflow_runs import close_stale_runs, parent_run
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.trainable import make_trainable
from orchestrator.sweep.view import experiment_dir, ray_trials, upper_corner
from orchestrator.sweep.workers import concurrent_slots, reuse_workers, trials_that_fit, tune_resources

log = logging.getLogger(__name__)


# -- Ray ------------------------------------------------------------------------------------------------
def _quiet_ray() -> None:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy engine is silent at verbose=0
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")  # save the experiment state often
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "100000")
    import warnings

    warnings.filterwarnings("ignore", module=r"ray(\..*)?")
    for name in ("ray", "ray.tune", "ray.train", "ray.air", "ray.data", "ray._private"):
        logging.getLogger(name).setLevel(logging.ERROR)


# -- the driver -----------------------------------------------------------------------------------------
def run_sweep(spec: SweepSpec, *, address: str | None = None, results: str | Path | None = None,
              num_cpus: int | None = None, status_every: float = 15.0, add_seeds: int = 0,
              connect_timeout: float | None = None, only: list | None = None) -> dict:
    """Run (or resume, or grow by ``add_seeds`` seeds, for the values ``only`` of the compared axis
    when given: a wave of ``orchestrator.sweep.decide``) a validated sweep; returns a summary dict
    (``ok``, counts, parent run, best, and ``launch``: the ``extend.Launch`` that ran).

    Nothing is recorded before Ray is up: a failed connection leaves MLflow and the sweep's state
    as they were (``orchestrator.sweep.connect``: one line, exit 2)."""
    uri = tracking_uri()
    exp_dir = experiment_dir(spec.name, results)
    if address:
        connect.split_address(address)  # a ray:// or malformed address: one line, before any other output
    else:
        preflight.check_local(spec)  # the CLI checked it before Ray loaded; run_sweep's other callers here
    lost_retries()  # a bad $LIME_LOST_WORKER_RETRIES: one line, before anything is recorded
    evaluate.preflight(spec)  # the eval: block's tasks and data, before anything is recorded
    launch = extend.prepare(spec, exp_dir, uri, add_seeds, only)  # planned once; refuses changed trials
    if launch.message:
        print(launch.message, flush=True)
    spec = launch.spec
    timeout = connect.connect_timeout(connect_timeout)
    _quiet_ray()
    log = exp_dir / connect.DRIVER_LOG
    started = False
    try:
        t0 = time.monotonic()
        with connect.output_to(log):  # Ray's own lines (a connection's, its warnings) go to the driver log
            started = connect.start_ray(address, uri=uri, num_cpus=num_cpus, timeout=timeout, log=log)
            if address:  # a trial no node can hold would wait forever: refuse it before anything is recorded
                r = spec.resources
                connect.check_fits({"CPU": r.cpu, "GPU": r.gpu}, address, r.workers)
        if address and uri.startswith("sqlite:"):  # after the checks: a refusal stays one line
            print(f"note: MLflow store {uri} is a local file; workers on other machines need the same path "
                  "(a shared filesystem) or an `mlflow server` (MLFLOW_TRACKING_URI=http://...)")
        return _run(launch, address, log, status_every, time.monotonic() - t0)
    finally:
        if started:
            import ray

            with connect.output_to(log):
                ray.shutdown()


def _run(launch: extend.Launch, address: str | None, log: Path, status_every: float, ray_start_s: float) -> dict:
    spec, uri, exp_dir, state = launch.spec, launch.uri, launch.exp_dir, launch.state
    cl, stale, before = _open_tracking(launch)
    exp_id, parent = launch.exp_id, launch.parent
    metric = spec.search.metric if spec.search else spec.report.metric
    mode = spec.search.mode if spec.search else spec.report.mode
    r = spec.resources
    workers = f" x {r.workers} workers ({r.parallel})" if r.workers > 1 else ""
    done = frozenset(history.done_trials(child_runs(cl, exp_id, parent)))  # the record's finished trials
    resumed = launch_note(history.reconcile(ray_trials(exp_dir), done), spec.n_trials(), stale) if state else ""
    print(f"sweep {spec.name}: {spec.n_trials()} trials, {r.cpu:g} CPU / {r.gpu:g} GPU each{workers}, Ray "
          f"{'at ' + address if address else 'local'}; results {exp_dir}; MLflow {uri} (experiment {spec.name}, "
          f"parent run {parent}){resumed}; Ray's own log {log}", flush=True)
    print("\n".join(dashboard.ui_lines(uri, exp_id, view=True)), flush=True)
    # launched: the trials' clocks count a fresh worker's start from here at the earliest
    ctx = {"uri": uri, "parent_run_id": parent, "exp_dir": str(exp_dir), "metric": metric, "launched": time.time()}
    fitting = False
    clock = WallClock(cl, parent, spec, ray_start_s, int(state.get("launches", 0)) + 1)
    try:
        view = _live_view(spec, metric, mode, status_every)
        tuner = _tuner(launch, view, ctx, done)
        fitting = True
        clock.start()  # a beat every WALL_BEAT_S: a killed driver's launch counts up to its last beat
        with connect.output_to(log):
            grid = tuner.fit()
        elapsed = clock.stop()
        wait_for_senders(cl, exp_id, parent, view.handed_off)
        evaluate.finished_trials(spec, cl, exp_id, parent, exp_dir, uri)  # the eval: block, if any
    except BaseException as e:  # nothing may stay RUNNING: the parent and any started trial
        if fitting:
            clock.stop()
        if fitting or before is None:
            end_run(cl, parent, TrialStatus.KILLED if isinstance(e, KeyboardInterrupt) else TrialStatus.FAILED)
        else:  # nothing ran: the parent goes back to what it was (a finished sweep stays finished)
            end_run(cl, parent, before)
        close_stale_runs(cl, exp_id, parent)
        raise
    summary = finish(launch, cl, grid, elapsed=elapsed, metric=metric, mode=mode,
                     final_status=dict(view.final_status))
    return {**summary, "launch": launch}


def _open_tracking(launch: extend.Launch) -> tuple[Any, int, TrialStatus | None]:
    """The MLflow client, the number of stale runs closed and the parent's state before this launch
    reopened it (None: a new parent); the launch gets its parent run and experiment, the parent the
    launch's seeds (``history.record_launch``), and the cache its state."""
    spec, uri, state = launch.spec, launch.uri, launch.state
    init_store(uri)
    # a server away at the end of a sweep is waited for, not a traceback; said as the driver's wait
    cl = outbox.PatientClient(client(uri), outbox.Health(uri, who="the sweep's driver"))
    exp_id = experiment_id(spec.name, cl)
    before = _status_of(cl, state.get("parent_run_id"))
    parent = parent_run(spec, cl, exp_id, state)
    if parent != state.get("parent_run_id"):
        before = None
    launch.parent, launch.exp_id = parent, exp_id
    history.record_launch(cl, parent, launch)
    write_state(launch.exp_dir, {"name": spec.name, "fingerprint": spec.fingerprint(), "parent_run_id": parent,
                                 "tracking_uri": uri, "experiment_id": exp_id, "file": spec.path,
                                 "launches": int(state.get("launches", 0)) + 1})
    stale = close_stale_runs(cl, exp_id, parent)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return cl, stale, before


WALL_BEAT_S = 5.0  # how often a launch adds its time so far to the parent's sweep/wall_s


class WallClock:
    """The parent run's ``sweep/wall_s`` (Tune's fit, summed over every launch), ``sweep/slots``
    (trials that run at once), ``sweep/ray_start_s`` and ``sweep/launches``: the report's
    efficiency ratio. Tags, not metrics: a parent metric is a chart section of its own beside the
    trials' (``orchestrator.sweep.finish``). The earlier launches' sum is read when this launch
    starts; this launch's seconds are added every ``WALL_BEAT_S`` while it fits (a driver killed
    mid-sweep has its time counted up to its last beat) and at its end. Never fails the sweep."""

    def __init__(self, cl, parent: str, spec: SweepSpec, ray_start_s: float, launch: int):
        self.cl, self.parent, self.spec, self.ray_start_s, self.launch = cl, parent, spec, ray_start_s, launch
        self.prior = 0.0
        if launch > 1:
            try:
                self.prior = record.ParentTags.of(cl.get_run(parent).data.tags).wall_s or 0.0
            except Exception as e:  # noqa: BLE001 - a timing number never fails a sweep
                log.warning("earlier launches' wall time not read: %s", e)
        self.t0 = time.monotonic()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._beat, name="lime-wall-clock", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.done.wait(WALL_BEAT_S):
            self.write(time.monotonic() - self.t0, beat=True)

    def stop(self) -> float:
        """This launch's seconds, written (the beats end first); a second call changes nothing."""
        if self.done.is_set():
            return self.elapsed
        elapsed = self.elapsed = time.monotonic() - self.t0
        self.done.set()
        if self.thread is not None:
            self.thread.join(30)
        self.write(elapsed)
        return elapsed

    def write(self, elapsed: float, beat: bool = False) -> None:
        """A beat does not wait for an absent server (the next beat writes it; the console's watch
        says the outage); the last write does (``PatientClient``)."""
        try:
            import ray

            cluster = ray.cluster_resources() if ray.is_initialized() else {}
            slots = concurrent_slots(self.spec, cluster, self.spec.n_trials())
            cl = getattr(self.cl, "_cl", self.cl) if beat else self.cl  # a PatientClient's own client: no wait
            record.ParentTags(wall_s=self.prior + elapsed, slots=slots, ray_start_s=self.ray_start_s,
                              launches=self.launch).write(cl, self.parent)
        except Exception as e:  # noqa: BLE001 - a timing number never fails a sweep
            if not (beat and outbox.is_outage(e)):
                log.warning("sweep wall time not logged: %s", e)


def _status_of(cl, run_id: str | None) -> TrialStatus | None:
    """A run's state (its status tag, else MLflow's status), None if there is no such run."""
    if not run_id:
        return None
    try:
        run = cl.get_run(run_id)
    except Exception:  # noqa: BLE001 - deleted, or another store
        return None
    st = TrialStatus.of_run(run.data.tags, run.info.status)
    return st if isinstance(st, TrialStatus) and st is not TrialStatus.RUNNING else TrialStatus.KILLED


def _live_view(spec: SweepSpec, metric: str, mode: str, every: float):
    steps = {t.trial_id: t.config.train.steps for t in spec.trials()}
    if spec.search is None:
        default_steps = spec.trial_config({}).train.steps
    else:
        default_steps = max(spec.trial_config(upper_corner(spec)).train.steps, 1)
    return live_view(total=spec.n_trials(), steps=steps, default_steps=default_steps, metric=metric, mode=mode,
                     every=every, uri=tracking_uri(), retries=spec.max_failures, lost_retries=lost_retries())


def lost_retries() -> int:
    """``$LIME_LOST_WORKER_RETRIES``: how often a trial whose worker is lost is retried in one launch."""
    raw = os.environ.get(LOST_RETRIES_ENV, "").strip()
    if not raw:
        return LOST_RETRIES
    if not raw.isdigit():
        raise ConfigError(f"${LOST_RETRIES_ENV}: must be a whole number >= 0, got {raw!r}")
    return int(raw)


def wait_for_senders(cl, exp_id: str, parent: str, trials: set[str]) -> None:
    """Trials that ended during an outage left their last metrics and their run's end to a
    background sender (``orchestrator.core.spool``): the summary waits until their runs have ended
    (at most ``$LIME_TRACKING_WAIT_S``)."""
    if not trials:
        return
    print(f"waiting for the background senders of {len(trials)} trial(s) that ended during an MLflow outage "
          f"(at most {outbox.wait_bound():g} s: ${outbox.WAIT_ENV})", flush=True)
    left, deadline = set(trials), time.monotonic() + outbox.wait_bound()
    while left and time.monotonic() < deadline:
        left = {t for t in left if not any(r.info.status != TrialStatus.RUNNING.mlflow
                                           for r in record.child_runs(cl, exp_id, parent, t))}
        if left:
            time.sleep(2.0)
    if left:
        print(f"note: the runs of {', '.join(sorted(left))} have not ended yet; their senders keep trying", flush=True)


def _tuner(launch: extend.Launch, view, ctx: dict, done: frozenset):
    """The launch's Tuner; a sweep whose seeds grew has one Ray experiment per growth, fitted in
    turn, and an experiment whose trials the record has all finished (``done``) is not restored
    (``orchestrator.sweep.extend``)."""
    return extend.tuners(launch, view, ctx, _one_tuner, done)


def _one_tuner(spec: SweepSpec, exp_dir: Path, view, ctx: dict):
    """One Ray experiment's Tuner: restored from an earlier launch's state, else new."""
    from ray import tune

    trainable = tune.with_resources(make_trainable(spec, ctx), tune_resources(spec))
    if not tune.Tuner.can_restore(str(exp_dir)):
        return _new_tuner(spec, trainable, exp_dir, view)
    try:
        tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True, resume_errored=True)
    except (AttributeError, ImportError, EOFError, ValueError) as e:  # state of another version
        raise ConfigError(f"{exp_dir}: cannot resume this Ray experiment ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); delete the folder to start "
                          "the sweep over") from None
    with contextlib.suppress(AttributeError):  # the view stored in tuner.pkl is replaced by this one
        tuner._local_tuner._run_config.callbacks = [view]
    with contextlib.suppress(AttributeError):  # as is the worker reuse of the launch that saved it
        tuner._local_tuner._tune_config.reuse_actors = reuse_workers()
    return tuner


def _new_tuner(spec: SweepSpec, trainable, exp_dir: Path, view):
    from ray import tune

    tc: dict[str, Any] = dict(trial_name_creator=TrialNamer(spec), trial_dirname_creator=TrialNamer(spec, True),
                              max_concurrent_trials=spec.max_concurrent, reuse_actors=reuse_workers())
    if spec.resources.workers > 1 and spec.max_concurrent is None:
        import ray

        tc["max_concurrent_trials"] = trials_that_fit(spec, ray.cluster_resources())
    if spec.search is None:
        space = {a: tune.grid_search(list(v)) for a, v in spec.grid.items()}
        tc["num_samples"] = 1
    else:
        space = _search_space(spec, tc)
    run_config = tune.RunConfig(
        name=exp_dir.name, storage_path=str(exp_dir.parent), verbose=0, callbacks=[view],
        # every failure is retried by Ray; the live view ends a trial whose own errors exceed
        # spec.max_failures (a lost worker or node spends none of them: orchestrator.sweep.console)
        failure_config=tune.FailureConfig(max_failures=-1),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2))
    return tune.Tuner(trainable, param_space=space, tune_config=tune.TuneConfig(**tc), run_config=run_config)


def _search_space(spec: SweepSpec, tc: dict) -> dict:
    """Ray's search space of a ``search`` block; sets the searcher (and ASHA) in ``tc``."""
    import optuna
    from optuna.samplers import TPESampler
    from ray import tune
    from ray.tune.search import Repeater
    from ray.tune.search.optuna import OptunaSearch

    s = spec.search
    make = {"loguniform": lambda p: tune.loguniform(*p.values), "uniform": lambda p: tune.uniform(*p.values),
            "int": lambda p: tune.randint(p.values[0], p.values[1] + 1),  # randint excludes its high end
            "choice": lambda p: tune.choice(list(p.values))}
    space = {n: make[p.kind](p) for n, p in s.space.items()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory" on the console
    searcher = OptunaSearch(sampler=TPESampler(seed=s.seed))
    tc.update(search_alg=Repeater(searcher, repeat=s.repeat, set_index=True), num_samples=s.num_samples * s.repeat,
              metric="objective", mode=s.mode)
    if s.asha:
        from ray.tune.schedulers import ASHAScheduler

        # above the longest trial: a trial that reaches its last step finishes on its own
        max_t = max(spec.trial_config(upper_corner(spec)).train.steps, s.asha.grace_period) + 1
        tc["scheduler"] = ASHAScheduler(time_attr="step", max_t=max_t, grace_period=s.asha.grace_period,
                                        reduction_factor=s.asha.reduction_factor)
    return space
