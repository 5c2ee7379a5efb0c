"""What ``lime sweep`` prints without starting anything: the dry run (trials, resources, compute)
and the status of a sweep (from MLflow and Ray's saved experiment state). No Ray import here."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from lime_arch.errors import ConfigError
from lime_arch.size import TRAIN_STATE_BYTES, train_state_bytes
from orchestrator.core import record
from orchestrator.core.status import TrialStatus
from orchestrator.core.tracking import client, tracking_uri
from orchestrator.sweep import history, limits
from orchestrator.sweep.local_state import extension_dirs, read_state
from orchestrator.sweep.preflight import warnings
from orchestrator.sweep.spec import SweepSpec, estimate, human, vocab_for


def results_root() -> Path:
    return Path(os.environ.get("LIME_RESULTS") or "results").resolve()


def experiment_dir(name: str, results: str | Path | None = None) -> Path:
    return (Path(results).resolve() if results else results_root()) / "ray" / name


def fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# -- dry run --------------------------------------------------------------------------------------------
def dry_run_text(spec: SweepSpec, address: str | None = None) -> str:
    """The dry run: the trials, resources and compute, then one warning line per thing this
    machine may lack (``address``: the Ray cluster the run would use; None: a local Ray)."""
    r = spec.resources
    lines = [f"sweep {spec.name}: {spec.description}",
             f"file: {spec.path or '-'}   results: {experiment_dir(spec.name)}",
             f"resources per trial: cpu {r.cpu:g}, gpu {r.gpu:g}"
             + (f" per worker x {r.workers} workers ({r.parallel})" if r.workers > 1 else "") + "   max concurrent: "
             f"{spec.max_concurrent or 'as resources allow'}   max failures: {spec.max_failures}"]
    if spec.search is None:
        trials = spec.trials()
        rows = [(t.trial_id, t.config) for t in trials]
        axes = " x ".join(f"{a} ({len(v)})" for a, v in spec.grid.items()) or "none (one trial)"
        lines.append(f"trials: {len(trials)}   grid: {axes}")
    else:
        s = spec.search
        asha = f", ASHA grace {s.asha.grace_period} steps, reduction {s.asha.reduction_factor}" if s.asha else ""
        seeds = f"seeds {s.seeds}" if s.seeds else f"{s.repeat} seed(s) from the base seed"
        lines.append(f"search: Optuna TPE (seed {s.seed}), {s.num_samples} samples x {seeds} = "
                     f"{spec.n_trials()} trials, {s.metric} ({s.mode}){asha}")
        for p in s.space.values():
            lines.append(f"  {p.name} ({p.key}): {p.kind} {list(p.values)}")
        rows = [(f"(upper bound) x {spec.n_trials()}", spec.trial_config(upper_corner(spec, s.repeat - 1)))]
    first = rows[0][1]
    vocab, src = vocab_for(first)
    t = first.train
    lines.append(f"data: {first.data.source} ({src}: {vocab})   checkpoint every "
                 f"{t.checkpoint_interval} steps   torch threads per trial: {t.threads}")
    lines.append("")
    hdr = f"{'trial':<34} {'preset':<7} {'layers':>6} {'d_model':>7} {'router':<12} {'params':>8} " \
          f"{'steps':>6} {'tokens':>8} {'FLOPs/tok':>9} {'train FLOPs':>11}"
    lines += [hdr, "-" * len(hdr)]
    total_tok = total_flops = 0.0
    largest = 0
    for tid, cfg in rows:
        e = estimate(cfg)
        largest = max(largest, e["params"])
        m = e["model"]
        mult = spec.n_trials() if spec.search is not None else 1
        total_tok += e["tokens"] * mult
        total_flops += e["train_flops"] * mult
        lines.append(f"{tid[:34]:<34} {cfg.preset:<7} {m.n_layers:>6} {m.d_model:>7} {m.router:<12} "
                     f"{human(e['params']):>8} {cfg.train.steps:>6} {human(e['tokens']):>8} "
                     f"{human(e['flops_per_token']):>9} {human(e['train_flops']):>11}")
    lines.append("")
    lines.append(f"total: {spec.n_trials()} trials, {human(total_tok)} tokens, {human(total_flops)}FLOP "
                 "(training = 3 x forward FLOPs/token x steps x batch x seq x grad_accum)")
    lines.append(f"memory per trial: up to {human(train_state_bytes(largest))}B of training state ({human(largest)} "
                 f"parameters x {TRAIN_STATE_BYTES} bytes: fp32 weights, gradients, AdamW moments; activations come on "
                 f"top); {limits.describe()}")
    rep = spec.report
    tuned = f", each at its best {rep.tune}" if rep.tune else ""
    lines.append(f"report: {rep.metric} ({rep.mode}) by {rep.axis}, baseline {rep.baseline}{tuned}, alpha {rep.alpha:g}"
                 + (f", paper {rep.paper}" if rep.paper else "") + (f", margin {rep.margin}" if rep.margin else ""))
    if spec.decide is not None:
        d = spec.decide
        lines.append(f"until decided: the grid's seeds are the first wave, then {d.wave} more per wave for the "
                     f"baseline and the undecided variants, up to {d.max_seeds} seeds per arm"
                     + (f", margin {d.margin}" if d.margin else "")
                     + (f", budget {d.budget.words()} (the trials above count against it; a comparison the budget "
                        "cannot pay for ends inconclusive at budget)" if d.budget is not None else ""))
    lines += [f"warning: {w}" for w in warnings(spec, (cfg for _, cfg in rows), address)]
    # -- the statistics planner's block goes here: one call that appends its lines (what this
    #    design can show at these seed counts, loud when it cannot reach significance) --
    lines.append("dry run: nothing was started")
    return "\n".join(lines)


def upper_corner(spec: SweepSpec, index: int = 0) -> dict[str, Any]:
    """A search sweep's largest trial (every range at its high end, the largest choice), repeat ``index``."""
    return {n: (p.values[-1] if p.kind != "choice" else _largest(p.values)) for n, p in spec.search.space.items()} \
        | {"__trial_index__": index}


def _largest(values) -> Any:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(nums) if len(nums) == len(values) else values[-1]


# -- status -----------------------------------------------------------------------------------------------
def status_text(name: str) -> str:
    """Trials by state from MLflow (runs tagged sweep=<name>) and Ray's saved experiment state.
    Reads only: a missing MLflow store is an error, never created."""
    uri, exp_dir = tracking_uri(), experiment_dir(name)
    require_store(uri, name, exp_dir)
    cl = client(uri)
    exp = cl.get_experiment_by_name(name)
    saved = ray_trials(exp_dir)
    if exp is None and not saved:
        raise ConfigError(f"sweep {name!r}: no MLflow experiment in {uri} and no Ray results in {exp_dir}")
    lines = [f"sweep {name}: MLflow {uri}, Ray results {exp_dir}"]
    runs = list(cl.search_runs([exp.experiment_id], f"tags.{record.SWEEP} = '{name}'", max_results=5000)) if exp else []
    parents = [r for r in runs if record.role(r.data.tags) == record.PARENT]
    children = [r for r in runs if record.role(r.data.tags) != record.PARENT]
    for p in parents:
        best = record.ParentTags.of(p.data.tags).best.get("best_trial_id")
        lines.append(f"parent run {p.info.run_id}: {p.info.status}" + (f", best {best}" if best else ""))
        lines += _grown(p)
        lines += [f"  look {k}: {_look(text)}" for k, text in record.decide_waves(p.data.params).items()]
    by: dict[str, list] = {}
    for r in children:
        by.setdefault(str(TrialStatus.of_run(r.data.tags, r.info.status)), []).append(r)
    seen = {r.data.tags.get(record.TRIAL_ID) for r in children}
    saved = history.reconcile(saved, history.done_trials(children))  # Ray's queue, the record's outcomes
    for tname, st in saved.items():
        if tname not in seen:
            by.setdefault(st.lower(), []).append(tname)
    lines.append("by state: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(by.items())) if by else "no trials yet")
    for st in sorted(by):
        lines.append(f"{st}:")
        for r in sorted(by[st], key=lambda r: r if isinstance(r, str) else r.data.tags.get(record.TRIAL_ID, "")):
            if isinstance(r, str):
                lines.append(f"  {r:<40} no MLflow run yet (Ray: {saved[r]})")
                continue
            tid = r.data.tags.get(record.TRIAL_ID, "?")
            v = r.data.metrics.get(record.FINAL_VAL_LOSS, r.data.metrics.get("val/loss"))
            loss = f"  val loss {v:.4f}" if v is not None else ""
            lines.append(f"  {tid:<40} run {r.info.run_id}  Ray: {saved.get(tid, '-')}{loss}")
    return "\n".join(lines)


def _grown(parent) -> list[str]:
    """A grown sweep's seeds, as its parent run records them (``orchestrator.sweep.history``)."""
    exts = history.extensions(parent.data.params)
    if not exts:
        return []
    grown = "; ".join(f"{e['name']}: seeds {history.fmt_seeds(e['seeds'])}"
                      + (f" for {', '.join(map(str, e['values']))}" if e.get("values") is not None else "")
                      for e in exts)
    seeds = record.ParentTags.of(parent.data.tags).seeds or ""
    return [f"  seeds in effect: {seeds} (grown: {grown})"]


def _look(text: str) -> str:
    """One recorded look of a sweep run until decided (``sweep.decide.wave-<k>``) in words."""
    try:
        w = json.loads(text)
        out = ", ".join(f"{v} {w['verdict'][v]} ({n} seeds)" for v, n in w["n"].items())
        return out + (f"; next: seeds {w['seeds']} for {', '.join(w['next'])}" if w.get("next") else "; done")
    except (ValueError, KeyError, TypeError, AttributeError):
        return text


def require_store(uri: str, name: str, exp_dir: Path) -> None:
    """A sqlite store that does not exist: one line naming it (and the store the sweep ran with)."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///"):])
    if path.is_file():
        return
    ran = read_state(exp_dir).get("tracking_uri")
    hint = (f"; sweep {name!r} ran with the store {ran}: set MLFLOW_TRACKING_URI to it" if ran and ran != uri else
            "; set MLFLOW_TRACKING_URI to the store the sweep ran with")
    raise ConfigError(f"sweep {name!r}: no MLflow store at {path} (nothing was created){hint}")


def ray_trials(exp_dir: Path, extensions: bool = True) -> dict[str, str]:
    """Trial name -> Ray status from the newest saved experiment state (best effort, no Ray import);
    with ``extensions``, also the trials of the sweep's seed extensions (``extend-<k>/``)."""
    out = _saved_trials(Path(exp_dir))
    for d in extension_dirs(exp_dir) if extensions else []:
        out.update(_saved_trials(d))
    return out


def _saved_trials(exp_dir: Path) -> dict[str, str]:
    files = sorted(exp_dir.glob("experiment_state-*.json"))
    if not files:
        return {}
    try:
        data = json.loads(files[-1].read_text())
        out = {}
        for item in data.get("trial_data", []):
            t = json.loads(item[0]) if isinstance(item, list) else json.loads(item)
            out[t.get("custom_trial_name") or t.get("trial_id")] = t.get("status", "?")
        return out
    except Exception:  # noqa: BLE001 - a format from another Ray version: MLflow alone is enough
        return {}

