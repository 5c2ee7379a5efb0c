"""``lime analyze``: representation analysis of one or more checkpoints, side by side: entropies,
probes, router maps (a dynamic router's: averaged over the evaluation tokens, and their spread over
tokens), the strongest routes with the tokens where they fire and the logit lens of a dynamic
router's keys (``orchestrator.analysis.routes``); with ``--ablate`` each route's causal effect on the
validation loss beside its mass, over the seeds of each variant
(``orchestrator.cli.analyze_ablation``)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from lime_arch import ConfigError, build_model
from orchestrator.analysis.ablate import candidate_routes, route_masses
from orchestrator.analysis.analyze import analyze_model
from orchestrator.analysis.plots import plot_entropy, plot_expected_source, plot_probe, plot_router_map
from orchestrator.analysis.routes import routes_markdown
from orchestrator.cli import analyze_ablation as ablation
from orchestrator.core.outputs import check_out_folder
from orchestrator.core.tracking import client, existing_client, existing_run, missing_store, tracking_uri
from orchestrator.engine.checkpoint import read_model_checkpoint
from orchestrator.engine.data import make_batches
from orchestrator.engine.trial_config import TrialConfig


def _open(spec: str) -> tuple[str, TrialConfig, dict]:
    """(label, trial config, checkpoint) of ``label=path`` or ``path``: read and checked, no model built.
    A path that exists is a path even with '=' in it (a sweep trial's folder, ``router=full,seed=0``);
    otherwise the label ends at the first '='."""
    label, _, path = ("", "", spec) if "=" not in spec or Path(spec).expanduser().exists() else spec.partition("=")
    if not path:
        raise ConfigError(f"checkpoints: {spec!r} names no checkpoint after its label; give label=path")
    _, ck = read_model_checkpoint(path)
    cfg = TrialConfig.from_dict(ck["config"])
    return label or cfg.model_config(vocab_size=ck.get("vocab_size")).router, cfg, ck


def _load(cfg: TrialConfig, ck: dict, cache: dict | None = None):
    """(data, model) of a checkpoint; ``cache``: the data of each data config, read once per command
    (``--ablate`` loads every model twice)."""
    key = json.dumps(cfg.to_dict()["data"], sort_keys=True)
    data = cache.get(key) if cache is not None else None
    if data is None:
        data = make_batches(cfg.data)
        if cache is not None:
            cache[key] = data
    model = build_model(cfg.model_config(vocab_size=data.vocab_size))
    model.load_state_dict(ck["model"])
    return data, model


def write_outputs(results: dict, out: Path) -> list[Path]:
    """Plots across variants and a markdown table of the per-layer numbers."""

    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_entropy({k: r.value_entropy for k, r in results.items()}, out / "value_entropy.png",
                          "Value-space Renyi entropy by layer"),
             plot_entropy({k: r.hidden_entropy for k, r in results.items()}, out / "hidden_entropy.png",
                          "Hidden-state Renyi entropy by layer"),
             plot_expected_source({k: r.expected_source for k, r in results.items() if len(r.expected_source)},
                                  out / "expected_source.png")]
    probes = {k: r.value_probe for k, r in results.items() if r.value_probe is not None}
    if probes:
        paths.append(plot_probe(probes, out / "value_probe.png", "Value probe accuracy (is/are/was/were)"))
        paths.append(plot_probe({k: r.hidden_probe for k, r in results.items() if r.hidden_probe is not None},
                                out / "hidden_probe.png", "Hidden-state probe accuracy"))
    for k, r in results.items():
        if r.source_map is None:  # a token-dependent router: no static source map
            continue
        paths.append(plot_router_map(r.source_map, out / f"router_map_{_safe(k)}.png", f"{k}: router source map"))
        if r.spread_map is not None:
            paths.append(plot_router_map(r.spread_map, out / f"router_spread_{_safe(k)}.png",
                                         f"{k}: std over tokens of the source map", label="std over tokens",
                                         vmax=None))
    lines = ["# Representation analysis", "",
             "| variant | layer | value entropy | hidden entropy | value probe | hidden probe | expected source |",
             "|---|---|---|---|---|---|---|"]
    for k, r in results.items():
        for l in range(len(r.value_entropy[0])):
            vp = f"{r.value_probe[0][l]:.3f}" if r.value_probe is not None else "-"
            hp = f"{r.hidden_probe[0][l]:.3f}" if r.hidden_probe is not None else "-"
            lines.append(f"| {k} | {l} | {r.value_entropy[0][l]:.4f} +- {r.value_entropy[1][l]:.4f} | "
                         f"{r.hidden_entropy[0][l]:.4f} +- {r.hidden_entropy[1][l]:.4f} | {vp} | {hp} | "
                         f"{r.expected_source[l]:.2f} |" if len(r.expected_source) else "- |")
    lines += ["", "# Routes (the paper's Table 2)", ""]
    for k, r in results.items():
        lines += routes_markdown(k, r.routes)
    notes = sorted({n for r in results.values() for n in r.notes})
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    (out / "analysis.md").write_text("\n".join(lines) + "\n")
    paths.append(out / "analysis.md")
    return paths


def log_to_run(run_id: str, metrics: dict[str, float], step: int) -> None:
    """Add metrics to an existing (usually finished) run without touching its status."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(k, float(v), ts, step) for k, v in sorted(metrics.items())]
    cl = client()
    for i in range(0, len(items), 500):
        cl.log_batch(run_id, metrics=items[i:i + 500])


def _reachable(run_id: str) -> bool:
    if missing_store() is not None:
        return False
    try:
        client().get_run(run_id)
    except Exception:  # noqa: BLE001 - deleted, or of another store
        return False
    return True


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def cmd_analyze(args) -> int:
    words = tuple(w.strip().lower() for w in args.words.split(",") if w.strip())
    if len(words) < 2:
        raise ConfigError("--words: need at least two comma-separated words")
    if not 0 < args.alpha < math.inf:  # the entropy of order inf would fail after the models are loaded
        raise ConfigError(f"--alpha: must be a finite number > 0 (the Renyi entropy's order), got {args.alpha}")
    if args.routes < 0:
        raise ConfigError(f"--routes: must be >= 0, got {args.routes}")
    if args.sequences < 1:
        raise ConfigError(f"--sequences: must be >= 1, got {args.sequences}")
    ablation.check_flags(args)
    check_out_folder(args.out, "--out")
    opened = {}  # every checkpoint read and checked, its label free and its run there, before any compute
    for spec in args.checkpoints:
        label, cfg, ck = _open(spec)
        if label in opened:
            raise ConfigError(f"checkpoints: two checkpoints are labelled {label!r}; name them label=path")
        opened[label] = (cfg, ck, args.run_id or ck.get("run_id"))
        if args.ablate:
            ablation.check_routes(label, cfg, ck)
    if args.run_id:  # a run named on the command line must be there
        instead = "or leave out --run-id (each checkpoint's own run is logged to where the store has it)"
        existing_run(args.run_id, existing_client(f"--run-id {args.run_id}", instead=instead), instead=instead)
    else:  # a checkpoint's own run: logged to when its store has it, else said (nothing is created)
        for label, (cfg, ck, run) in list(opened.items()):
            if run and not _reachable(run):
                print(f"{label}: not logged: its run {run} is not in the MLflow store {tracking_uri()}")
                opened[label] = (cfg, ck, None)
    results, masses, cache = {}, {}, {}
    for label, (cfg, ck, target) in opened.items():
        data, model = _load(cfg, ck, cache)
        r = analyze_model(model, data, sequences=args.sequences, seq_len=cfg.train.seq_len, alpha=args.alpha,
                          words=words, routes=args.routes)
        results[label] = r
        if args.ablate:  # the routes' masses over the windows their effects are measured on
            routes = candidate_routes(model.router, args.ablate_heads)
            masses[label] = route_masses(model, [x for x, _ in ablation.val_windows(cfg, data)], routes)
        if target:
            log_to_run(target, r.metrics, step=cfg.train.steps)
            print(f"{label}: logged {len(r.metrics)} analysis metrics to MLflow run {target}")
    paths = write_outputs(results, Path(args.out))
    if args.ablate:
        paths += _ablate(args, opened, masses, cache)
    for p in paths:
        print(f"wrote {p}")
    mean_ve = {k: float(np.mean(r.value_entropy[0])) for k, r in results.items()}
    print("mean value entropy by variant: " + ", ".join(f"{k}={v:.3f}" for k, v in mean_ve.items()))
    return 0


def _ablate(args, opened: dict, masses: dict, cache: dict) -> list[Path]:
    """Each variant's routes zeroed one at a time on each of its checkpoints (the same routes on all)."""
    renormalize = bool(args.renormalize)
    limit = args.ablate_max_routes if args.ablate_max_routes is not None else ablation.DEFAULT_MAX_ROUTES
    done = []
    for name, labels in ablation.variants({k: v[0] for k, v in opened.items()}).items():
        cfg0 = opened[labels[0]][0]
        v = ablation.select(name, cfg0.model_config().router, {k: masses[k] for k in labels},
                            list(masses[labels[0]]), limit)
        routes = sorted(v.why, key=lambda r: r.order())
        for label in labels:
            cfg, ck, target = opened[label]
            data, model = _load(cfg, ck, cache)
            a = ablation.ablate_checkpoint(model, cfg, data, routes, masses[label], renormalize=renormalize)
            v.ablations[label] = a
            print(f"{label}: validation loss {a.loss:.4f}; {len(routes)} routes ablated "
                  f"({'renormalised' if renormalize else 'zeroed'}), Spearman(mass, effect) {a.spearman:+.2f}")
            if target:
                m = ablation.metrics(a)
                log_to_run(target, m, step=cfg.train.steps)
                print(f"{label}: logged {len(m)} ablation metrics to MLflow run {target}")
        done.append(v)
    return ablation.write(done, Path(args.out))
