"""The trainer's standard hooks: MLflow tracking, a progress callback, end-of-trial analysis.

``MLflowHook`` keeps one MLflow run per trial (continued on resume), logs the params once, every
emitted metric dict at its step, and at the end the resolved config, the router weights and
their heatmap as artifacts; the run's ``status`` tag is the trial's ``TrialStatus``. What the
dashboard compares is named plainly: the config's aliases (``router``, ``seed``, ``n_layers``,
``depth_mix``, ``lr``, ...; ``orchestrator.core.keys``) are params beside the dotted keys, a
per-trial path (``train.checkpoint_dir``) is a tag, not a param, and the end-of-trial numbers
(``final/*``, ``analysis/*``) are logged at step 0, MLflow's step for a scalar that is no time
series, so its charts draw them as bars rather than as one dot at the last step.
``CallbackHook`` hands every metric dict to ``on_log(step, metrics, checkpoint_dir)`` (the CLI's
progress bar, the sweep's Ray reporting). ``AnalysisHook`` adds the representation analysis of
the final model (``train.analyze``) to the final metrics. ``CostHook`` adds the trial's cost as
two final numbers: ``final/step_time_ms`` (median of ``perf/step_time_ms`` over the run) and
``final/train_mem_mb`` (max of ``perf/train_mem_mb``, the model's training memory). A hook with an
``end_tags(t)`` method (``orchestrator.engine.stability.StabilityHook``) has its tags set on the
run at the end; ``stability/*`` numbers are end-of-trial numbers like ``final/*``.
"""
from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lime_arch import flops_per_token, param_counts
from orchestrator.analysis.analyze import analyze_model
from orchestrator.analysis.metrics import router_source_map
from orchestrator.analysis.plots import plot_router_map
from orchestrator.analysis.routes import mixing_maps
from orchestrator.core import record
from orchestrator.core.keys import ALIASES
from orchestrator.core.outbox import TrackingUnavailable, wait_bound
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import RunLogger, flatten, git_sha
from orchestrator.engine import final_names
from orchestrator.engine.trainer import Hook, Trainer


class CallbackHook(Hook):
    """``fn(step, metrics, checkpoint_dir_or_None)`` at every emitted metric dict."""

    def __init__(self, fn: Callable[[int, dict, str | None], None]):
        self.fn = fn

    def on_log(self, t: Trainer, step: int, metrics: dict, checkpoint: str | None) -> None:
        self.fn(step, metrics, checkpoint)


class AnalysisHook(Hook):
    """Representation analysis of the final model (``analysis/*`` metrics, see
    ``orchestrator.analysis.analyze``) on ``train.analyze_sequences`` validation sequences."""

    def final_metrics(self, t: Trainer) -> dict[str, float]:
        tr = t.cfg.train
        return analyze_model(t.model, t.data, sequences=tr.analyze_sequences, seq_len=tr.seq_len).metrics


class CostHook(Hook):
    """The trial's step time and training memory as two final numbers (over the whole run: the
    history comes back with a resumed checkpoint)."""

    def final_metrics(self, t: Trainer) -> dict[str, float]:
        out = {}
        times = _finite(h.get("perf/step_time_ms") for h in t.history)
        if times:
            out[final_names.STEP_TIME] = statistics.median(times)
        mem = _finite(h.get("perf/train_mem_mb") for h in t.history)
        if mem:
            out[final_names.TRAIN_MEM] = max(mem)
        return out


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and v == v and abs(v) != float("inf")]


SCALAR_PREFIXES = ("final/", "analysis/", "stability/")  # end-of-trial numbers: logged at step 0
ERROR_WAIT_S = 60.0  # how long a failing trial waits for an absent tracking server
PATH_PARAMS = ("train.checkpoint_dir",)  # differ per trial and say nothing about it: tags


def trial_params(cfg, mcfg, data_info: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(params, tags) of a trial's run: the aliases with their resolved values first (the names a
    reader compares by), then the flattened config, the resolved model and the data's description;
    the per-trial paths as tags."""
    flat = flatten({**cfg.to_dict(), "resolved": {"model": mcfg.to_dict()}, "data_info": data_info})
    plain = {}
    for alias, key in ALIASES.items():
        full = "resolved." + key if key.startswith("model.") else key
        if full in flat:
            plain[alias] = flat[full]
    tags = {k.rsplit(".", 1)[-1]: flat.pop(k) for k in PATH_PARAMS if k in flat}
    return {**plain, **flat}, {k: v for k, v in tags.items() if v != "None"}


class MLflowHook(Hook):
    """One MLflow run per trial: created on start (or continued: ``run_id`` given, or the
    checkpoint's, whose history is replayed so the server gets what an earlier attempt could not
    send), the params and model size once, metrics at every log point (sent in the background,
    kept through an outage: ``orchestrator.core.outbox``), artifacts and the final status at the
    end (waiting for an absent server up to ``$LIME_TRACKING_WAIT_S``, then ``TrackingUnavailable``:
    the trial fails with its last checkpoint written; with ``spool``, a sweep trial's, what is left
    goes to a background sender instead). A run that cannot be created at the start (the server is
    away) is created when the server answers, the trial training meanwhile; ``trial`` names the
    sweep trial whose record that late opening reads."""

    def __init__(self, experiment: str, *, run_name: str | None = None, parent_run_id: str | None = None,
                 tags: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
                 trial: str | None = None, spool: str | None = None):
        self.experiment, self.run_name, self.parent_run_id = experiment, run_name, parent_run_id
        self.tags, self.params = dict(tags or {}), dict(params or {})
        self.trial, self.spool = trial, spool  # RunLogger's: a late opening's record lookup, the hand-off folder
        self.logger: RunLogger | None = None

    def on_start(self, t: Trainer) -> None:
        with t.timed("mlflow"):
            self._open(t)

    def _open(self, t: Trainer) -> None:
        mcfg, cfg = t.mcfg, t.cfg
        tags = {"router": mcfg.router, "preset": cfg.preset, "n_layers": mcfg.n_layers, "seed": cfg.train.seed,
                record.GIT_SHA: git_sha(), record.STATUS: TrialStatus.RUNNING.value, **self.tags}
        self.logger = RunLogger(self.experiment, run_id=t.run_id, run_name=self.run_name, tags=tags,
                                parent_run_id=self.parent_run_id, trial=self.trial, resumed=t.resumed,
                                spool=self.spool)
        t.run_id = self.logger.run_id or t.run_id  # None until the server answers (the run is opened late)
        if t.resumed:  # what an earlier attempt logged but its server never stored (an outage, a kill)
            for h in t.history:
                self.on_log(t, int(h["step"]), {k: v for k, v in h.items() if k != "step"}, None)
        else:  # a continued run has its params and model size already
            params, path_tags = trial_params(cfg, mcfg, t.data.describe())
            self.logger.log_params({**self.params, **params})
            self.logger.set_tags(path_tags)
            counts = param_counts(mcfg)
            self.logger.log_metrics({"model/params": counts["total"], "model/router_params": counts["router"],
                                     "model/flops_per_token": flops_per_token(mcfg, cfg.train.seq_len)["total"]},
                                    0, flush=True)

    def on_log(self, t: Trainer, step: int, metrics: dict, checkpoint: str | None) -> None:
        t.run_id = t.run_id or self.logger.run_id  # a run opened late: the next checkpoint names it
        scalars = {k: v for k, v in metrics.items() if k.startswith(SCALAR_PREFIXES)}
        if scalars:
            self.logger.log_metrics(scalars, 0)
        series = {k: v for k, v in metrics.items() if k not in scalars}
        self.logger.log_metrics(series, step, flush=checkpoint is not None)

    def on_stop(self, t: Trainer) -> None:
        self.logger.pause()  # the run stays RUNNING: the trial continues on resume

    def on_end(self, t: Trainer, status: TrialStatus) -> None:
        # where the final checkpoint is, so that a run id finds its model (lime eval, lime export);
        # the other hooks' verdicts on the whole trial (StabilityHook: stability=spiky|stable)
        tags = {"checkpoint_dir": str(t.ckpt_dir)}
        for h in t.hooks:
            if hasattr(h, "end_tags"):
                tags.update(h.end_tags(t))
        self.logger.set_tags(tags)
        with tempfile.TemporaryDirectory() as d:
            for path in write_artifacts(t, Path(d)):
                self.logger.log_artifact(path)
        self.logger.end(status)
        t.run_id = t.run_id or self.logger.run_id

    def on_error(self, t: Trainer, exc: BaseException) -> None:
        if self.logger is None:
            return
        # SystemExit: Ray stopped the trial (ASHA, an interrupted sweep); Ray may kill the process
        # right after, so the first status written must already be the right one
        status = (TrialStatus.KILLED if isinstance(exc, KeyboardInterrupt)
                  else TrialStatus.STOPPED if isinstance(exc, SystemExit) else TrialStatus.FAILED)
        # the trial fails anyway: wait for an absent server briefly (not at all if its absence is
        # the failure); what is not sent is in the checkpoint's history, sent when the trial resumes
        wait = 0.0 if isinstance(exc, TrackingUnavailable) else min(ERROR_WAIT_S, wait_bound())
        try:
            self.logger.end(status, wait=wait)
        except TrackingUnavailable as e:
            self.logger.outbox.detach()  # its sender stops: what is left is in the checkpoint's history
            print(f"note: the run's end was not recorded: {e}", flush=True)


MAP_BATCHES = 4  # validation batches a token-dependent router's mixing is averaged over


def write_artifacts(t: Trainer, folder: Path) -> Iterator[Path]:
    """Writes and yields, one by one: the resolved config (YAML), the final router weights (npz,
    one dense (R, (l+1)R[, Hd]) array per layer; a token-dependent router's per-token mixing
    averaged over the first ``MAP_BATCHES`` validation batches, ``orchestrator.analysis.routes``)
    and, when the weights are finite, their heatmap: the mean |w| by source layer (as in the LIMe
    paper's Figure 5); for a token-dependent router also the spread of that map over the tokens
    (``router_spread.npz``, its heatmap)."""
    mcfg = t.mcfg
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump({**t.cfg.to_dict(), "resolved_model": mcfg.to_dict()}, sort_keys=True))
    yield config
    maps = mixing_maps(t.model, [x for x, _ in t.val[:MAP_BATCHES]])
    dense = maps.dense
    weights = folder / "router_weights.npz"
    np.savez(weights, **{f"layer_{l}": w for l, w in enumerate(dense)})
    yield weights
    if not all(np.isfinite(w).all() for w in dense):
        return  # a diverged trial's NaN/inf weights have no source map: no heatmap, not an error
    heatmap = folder / "router_heatmap.png"
    m = router_source_map([None] + dense[1:], mcfg.kv_heads)
    over = f" (mean over {maps.tokens} validation tokens)" if maps.spread is not None else ""
    plot_router_map(m, heatmap, title=f"{mcfg.router}: mean |w| by source layer{over}")
    yield heatmap
    if maps.spread is not None:
        spread = folder / "router_spread.npz"
        np.savez(spread, spread=maps.spread, tokens=maps.tokens)
        yield spread
        spread_map = folder / "router_spread_heatmap.png"
        plot_router_map(maps.spread, spread_map, title=f"{mcfg.router}: std over tokens of the source map",
                        label="std over tokens", vmax=None)
        yield spread_map
