"""Where the final checkpoint of an MLflow run is, for ``lime eval``, ``lime export`` and a sweep's
evaluation of its finished trials.

- A sweep trial (tags ``sweep`` and ``trial_id``): the newest checkpoint in its Ray trial folder,
  ``<results>/ray/<sweep>/<trial folder>/checkpoint_*/`` (``train/checkpoint_*`` for a
  multi-worker trial), or in the folder of a seed extension (``extend-<k>/``). Ray keeps the last
  two checkpoints of a trial; a finished trial's newest one is its final model.
- Any other run (``lime train``): its ``checkpoint_dir`` tag, the folder the trainer wrote.

``<results>`` is ``$LIME_RESULTS`` (else ``results``) unless given.
"""
from __future__ import annotations

from pathlib import Path

from lime_arch import ConfigError
from orchestrator.core.tracking import client, missing_store
from orchestrator.engine.checkpoint import CKPT_NAME
from orchestrator.sweep.local_state import extension_dirs
from orchestrator.sweep.spec import trial_dirname
from orchestrator.sweep.tune_report import CHECKPOINT_GLOBS
from orchestrator.sweep.view import experiment_dir


def trial_checkpoint(exp_dir: Path, trial_id: str) -> Path | None:
    """The newest checkpoint folder of a trial of the sweep whose Ray folder is ``exp_dir``."""
    found = []
    for folder in [exp_dir, *extension_dirs(exp_dir)]:
        trial = folder / trial_dirname(trial_id)
        found += [f.parent for g in CHECKPOINT_GLOBS for f in trial.glob(g)]
    return max(found, key=lambda p: (p / CKPT_NAME).stat().st_mtime) if found else None


def run_checkpoint(run, results: str | Path | None = None) -> Path:
    """The final checkpoint folder of an MLflow run (see the module), or a ConfigError that says
    where it looked."""
    tags = run.data.tags
    looked = []
    sweep, trial_id = tags.get("sweep"), tags.get("trial_id")
    if sweep and trial_id:
        exp_dir = experiment_dir(sweep, results)
        found = trial_checkpoint(exp_dir, trial_id)
        if found is not None:
            return found
        looked.append(f"{exp_dir}/{trial_dirname(trial_id)}")
    ck = tags.get("checkpoint_dir")
    if ck and not (sweep and trial_id):  # a sweep trial's is a temporary folder, gone after the trial
        if (Path(ck) / CKPT_NAME).is_file():
            return Path(ck)
        looked.append(ck)
    where = f" (looked in {', '.join(looked)})" if looked else " (it is no sweep trial and has no checkpoint_dir tag)"
    raise ConfigError(f"run {run.info.run_id}: no checkpoint found{where}; pass the checkpoint folder instead")


def resolve_target(ref: str, results: str | Path | None = None) -> tuple[Path, str | None]:
    """A command's ``<run id | checkpoint>`` argument: (checkpoint folder or file, MLflow run id
    or None). A path that exists is a checkpoint; anything else is looked up as a run id."""
    p = Path(ref).expanduser()
    if p.exists():
        return p, None
    store = missing_store()
    if store is not None:  # looked up, never created: no folder, no new database
        raise ConfigError(f"{ref!r} is neither a checkpoint (file or folder) nor an MLflow run id: there is no "
                          f"MLflow store at {store} (nothing was created; set MLFLOW_TRACKING_URI to the store of "
                          "the run)")
    try:
        run = client().get_run(ref)
    except Exception:  # noqa: BLE001 - not a run of this store
        raise ConfigError(f"{ref!r} is neither a checkpoint (file or folder) nor an MLflow run id of the "
                          "store $MLFLOW_TRACKING_URI") from None
    return run_checkpoint(run, results), run.info.run_id
