"""Multi-worker trials (``resources.workers > 1``): a Ray Train ``TorchTrainer`` inside the trial.

The trial's Tune function (``orchestrator.sweep.trainable``) starts a ``TorchTrainer`` with
``resources.workers`` workers of ``resources.cpu`` CPUs and ``resources.gpu`` GPUs each (NCCL on
GPUs, gloo on CPUs) and waits for it. Every worker runs the engine's ``Trainer`` with the
``DistributedHook`` (``orchestrator.engine.distributed``: DDP, or FSDP2 with
``resources.parallel: fsdp``) on its rows of each global batch. Rank 0 alone logs to the trial's
MLflow run and writes the checkpoints; every worker reports each log point to Ray Train
(``ray.train.report``), and ``TuneReportCallback`` hands rank 0's reports to Tune, so the live
view, ASHA and the sweep's end see a multi-worker trial like any other.

Checkpoints go to ``<trial folder>/train/checkpoint_*`` (Ray Train's storage, two kept); a
retried or resumed trial starts a new ``TorchTrainer`` from the newest one, found by the trial
like its own. A failed worker fails the Train run at once (its own retries are off) and the
trial is retried by Tune (``max_failures``), as a one-process trial is. The results folder must
be on storage that every node sees (as for any cluster sweep).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import types
from pathlib import Path

from orchestrator.core.status import TrialStatus
from orchestrator.engine.distributed import DistributedHook
from orchestrator.engine.startup import StartupHook, worker_clock
from orchestrator.engine.trainer import Trainer
from orchestrator.engine.trial import Tracking, trial_hooks
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.sweep import IMPORT_T0
from orchestrator.sweep.schema import SweepSpec
from orchestrator.sweep.tune_report import objective, output_to, reporter

IMPORT_S = time.perf_counter() - IMPORT_T0  # what importing the project cost this process
TRAIN_DIR = "train"  # Ray Train's storage inside the trial folder
RESULT = "result.json"  # rank 0's final result, read by the trial after the Train run
REUSE_ENV = "LIME_REUSE_WORKERS"  # 0: a fresh Ray worker process for every trial


def reuse_workers() -> bool:
    """Whether Tune runs a sweep's trials one after another in the same worker processes
    (``reuse_actors``): on unless ``$LIME_REUSE_WORKERS`` is 0, false, no or off."""
    return os.environ.get(REUSE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def tune_resources(spec: SweepSpec) -> dict:
    """What a trial's Tune function reserves: the workers reserve their own CPUs and GPUs, and a
    one-byte memory request keeps the function from holding a CPU a worker needs."""
    r = spec.resources
    if r.workers > 1:
        return {"cpu": 0, "memory": 1}
    return {"cpu": r.cpu, "gpu": r.gpu}


def trials_that_fit(spec: SweepSpec, cluster: dict) -> int:
    """How many multi-worker trials the cluster holds at once (Tune would start them all and
    let their workers wait for each other's resources)."""
    r = spec.resources
    fits = [int(cluster.get("CPU", 0) // (r.cpu * r.workers))]
    if r.gpu:
        fits.append(int(cluster.get("GPU", 0) // (r.gpu * r.workers)))
    return max(1, min(fits))


def concurrent_slots(spec: SweepSpec, cluster: dict, n_trials: int) -> int:
    """How many trials run at once: ``max_concurrent``, what the cluster's CPUs and GPUs hold
    (Ray's fixed-point units: 0.1 CPU is 1000 of them) and the number of trials, the least."""
    r = spec.resources
    fits = [n_trials]
    for have, need in ((cluster.get("CPU", 0), r.cpu), (cluster.get("GPU", 0), r.gpu)):
        if need > 0:
            fits.append(_units(have) // _units(need * r.workers))
    if spec.max_concurrent:
        fits.append(spec.max_concurrent)
    return max(1, min(fits))


def _units(x: float) -> int:
    return int(round(float(x) * 10_000))


def fit_workers(spec: SweepSpec, ctx: dict, cfg: TrialConfig, tracking: Tracking, base: dict, trial_dir: Path,
                resume: Path | None) -> dict:
    """Run the trial on ``resources.workers`` Ray Train workers; rank 0's final result."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    r = spec.resources
    result = trial_dir / TRAIN_DIR / RESULT
    result.unlink(missing_ok=True)
    payload = {"config": cfg.to_dict(), "tracking": vars(tracking), "base": base, "metric": ctx["metric"],
               "uri": ctx["uri"], "trial_dir": str(trial_dir), "resume": str(resume) if resume else None,
               "parallel": r.parallel, "launched": ctx.get("launched")}
    per_worker = {"CPU": r.cpu, **({"GPU": r.gpu} if r.gpu else {})}
    trainer = TorchTrainer(
        worker_main, train_loop_config=payload,
        scaling_config=ScalingConfig(num_workers=r.workers, use_gpu=r.gpu > 0, resources_per_worker=per_worker),
        run_config=RunConfig(name=TRAIN_DIR, storage_path=str(trial_dir), callbacks=[TuneReportCallback()],
                             failure_config=FailureConfig(max_failures=0),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)))
    trainer.fit()
    return json.loads(result.read_text())


def worker_main(payload: dict) -> None:
    """One Ray Train worker: the engine's trainer on this worker's rows of every global batch."""
    import ray.train

    clock = worker_clock(payload.get("launched"), IMPORT_S)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    os.environ["MLFLOW_TRACKING_URI"] = payload["uri"]
    trial_dir = Path(payload["trial_dir"])
    with output_to(trial_dir / f"worker-{rank}.log"):
        print(f"rank {rank} of {world} on Ray node {ray.get_runtime_context().get_node_id()}", flush=True)
        work = Path(tempfile.mkdtemp(prefix=f"lime-worker{rank}-"))
        try:
            _train(payload, rank, world, work, ray.train, clock)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _train(payload: dict, rank: int, world: int, work: Path, train, clock) -> None:
    cfg = TrialConfig.from_dict(payload["config"])
    cfg.train.checkpoint_dir = str(work / "ckpt")
    if cfg.train.device != "cpu" and train.torch.get_device().type == "cuda":
        cfg.train.device = str(train.torch.get_device())  # this worker's GPU
    tracking = Tracking(**payload["tracking"]) if rank == 0 else Tracking(enabled=False)
    latest: dict[str, float] = {}
    api = types.SimpleNamespace(report=train.report, Checkpoint=train.Checkpoint)
    on_log = reporter(payload["base"], latest, payload["metric"], work, api)
    hooks = [DistributedHook(rank, world, payload["parallel"]), *trial_hooks(cfg, tracking, on_log),
             StartupHook(clock)]
    res = Trainer(cfg, hooks, run_id=tracking.run_id).run(resume=payload["resume"])
    final = {**payload["base"], "step": res.step, "status": str(res.status), "run_id": res.run_id or "", **latest,
             "objective": objective(latest, payload["metric"])}
    train.report(final)  # every worker: a report is a barrier of the whole group
    if rank == 0:
        out = Path(payload["trial_dir"]) / TRAIN_DIR / RESULT
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**final, "final/val_loss": res.final_val_loss}))
    print(f"{TrialStatus(res.status)} at step {res.step}", flush=True)
