"""What a trial process shares with Ray, single- or multi-worker: its output in the trial's log,
the newest checkpoint of a trial folder, the objective the scheduler sees, and the ``on_log``
that reports every log point (with a checkpoint when the engine wrote one).

``reporter`` takes the reporting API as an argument: ``ray.tune`` in a one-process trial,
``ray.train`` in the workers of a multi-worker trial (same ``report``/``Checkpoint`` calls).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from orchestrator.core.status import TrialStatus
from orchestrator.engine.trial import CKPT_NAME, load_checkpoint
from orchestrator.sweep.mlflow_runs import FAULT_ENV

CHECKPOINT_GLOBS = (f"checkpoint_*/{CKPT_NAME}", f"train/checkpoint_*/{CKPT_NAME}")  # Tune's, Ray Train's


@contextlib.contextmanager
def output_to(path: Path):
    """Send this process's stdout and stderr (fd level: Python, C, warnings) to the trial's log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        f.close()


def newest_checkpoint(ray_ck, trial_dir: Path, work: Path) -> tuple[Path | None, dict | None, Path | None]:
    """The newest loadable checkpoint, copied into ``work`` (its copy, its state, its folder): the
    newest one in the trial folder (Ray saves its experiment state only every few seconds, so
    after a killed driver Ray's own ``tune.get_checkpoint()`` can be older; a multi-worker trial's
    are in ``train/``), else Ray's (remote storage)."""
    def take(src: Path) -> tuple[Path, dict, Path] | None:
        try:
            state = load_checkpoint(src)
        except Exception:  # noqa: BLE001 - a checkpoint cut short by a kill: try an older one
            return None
        dst = work / "resume"
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / CKPT_NAME, dst / CKPT_NAME)
        return dst, state, src

    found = [f for g in CHECKPOINT_GLOBS for f in trial_dir.glob(g)]
    for f in sorted(found, key=_mtime, reverse=True):
        got = take(f.parent)
        if got:
            return got
    if ray_ck is not None:
        with ray_ck.as_directory() as d:
            if (Path(d) / CKPT_NAME).is_file():
                got = take(Path(d))
                if got:
                    return got[0], got[1], None
    return None, None, None


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def objective_key(metric: str) -> str:
    """The metric a trial reports to the scheduler before its end: a ``final/...`` metric exists
    only when the trial ends, so until then its validation counterpart stands in for it
    (``final/val_loss`` -> ``val/loss``, ``final/val_ppl`` -> ``val/ppl``, ``final/accuracy`` ->
    ``val/accuracy``)."""
    if not metric.startswith("final/"):
        return metric
    name = metric.split("/", 1)[1]
    return "val/" + (name[len("val_"):] if name.startswith("val_") else name)


def objective(latest: dict, metric: str) -> float:
    for key in (metric, objective_key(metric)):
        if key in latest:
            return float(latest[key])
    return float("nan")


def fault(step: int, trial_id: str) -> None:
    """Test hook: ``LIME_FAULT_ONCE=<marker>:<step>[:<trial substring>]`` crashes one trial once,
    right after a checkpoint at or past ``step`` was reported."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    marker, at = Path(parts[0]), int(parts[1])
    if len(parts) > 2 and parts[2] not in trial_id:
        return
    if step >= at and not marker.exists():
        marker.write_text(f"{trial_id} {step}\n")
        raise RuntimeError(f"injected fault at step {step} ({FAULT_ENV})")


def reporter(base: dict, latest: dict, metric: str, work: Path, tune):
    """The engine's ``on_log``: every log point to Ray, with a checkpoint when the engine wrote one."""
    def on_log(step: int, metrics: dict, ck_dir: str | None) -> None:
        latest.update(metrics)
        rep = {**base, "step": step, "status": TrialStatus.RUNNING.value, **latest,
               "objective": objective(latest, metric)}
        print(f"step {step}: " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()
                                          if isinstance(v, (int, float))), flush=True)
        if ck_dir is None:
            tune.report(rep)
            return
        fresh = Path(tempfile.mkdtemp(prefix="ck-", dir=work))  # a new folder for every report
        shutil.copy2(Path(ck_dir) / CKPT_NAME, fresh / CKPT_NAME)
        tune.report(rep, checkpoint=tune.Checkpoint.from_directory(str(fresh)))
        shutil.rmtree(fresh, ignore_errors=True)
        fault(step, base["trial"])

    return on_log
