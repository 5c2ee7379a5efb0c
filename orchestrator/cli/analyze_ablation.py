"""``lime analyze --ablate``: each route's causal effect beside its mass, over the seeds of a variant.

The checkpoints given are grouped into variants: those whose trial configs are equal but for the
seed and where and how they ran (``train.seed``, ``checkpoint_dir``, ``device``, ``threads``,
``compile``) are the seeds of one variant. Per variant the same routes are measured on every seed
(``orchestrator.analysis.ablate``): all of them, or with ``--ablate-max-routes N`` when there are
more, the ceil(N/2) of highest mass (the mean over the seeds) and a seeded random sample of the
rest. Each checkpoint's effect is the loss on its trial's own validation windows (those of
training's ``val/loss``: ``val_batches(batch_size, seq_len, eval_batches)``, the engine's
``window_losses``) with the route zeroed minus without it. Over two or more seeds each route gets
its mean effect and the reports' paired interval of it (``decide.intervals.paired_interval``, the
t and sign-flip hull, at 95%: the whole line below 6 seeds), and Spearman's rank correlation of
mass and effect per checkpoint and of the means. Written beside ``analysis.md``: ``ablation.md``,
``ablation.csv`` (one row per checkpoint and route) and ``ablation_summary.csv`` (one per variant
and route); logged to each checkpoint's run as ``ablate/<zeroed|renormalized>/...``.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lime_arch import ConfigError, build_router
from orchestrator.analysis.ablate import Ablation, RouteId, candidate_routes, measure, select_routes, spearman
from orchestrator.decide.intervals import Interval, min_seeds_finite, paired_interval
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.engine.val_loss import mean_and_se, window_losses

LEVEL = 0.95
DEFAULT_MAX_ROUTES = 64
RUNTIME = ("seed", "checkpoint_dir", "device", "threads", "compile")  # train keys that do not make a variant


def check_flags(args) -> None:
    """The ablation flags, refused with one line before any work."""
    if not args.ablate:
        given = {"--renormalize/--no-renormalize": args.renormalize is not None, "--ablate-heads": args.ablate_heads,
                 "--ablate-max-routes": args.ablate_max_routes is not None}
        for flag, was_given in given.items():
            if was_given:
                raise ConfigError(f"{flag}: only with --ablate (the route ablation it configures)")
    if args.ablate_max_routes is not None and args.ablate_max_routes < 1:
        raise ConfigError(f"--ablate-max-routes: must be >= 1, got {args.ablate_max_routes}")


def check_routes(label: str, cfg: TrialConfig, ck: dict) -> None:
    """A checkpoint whose router has no route (it reads only each layer's own K/V) is refused."""
    mc = cfg.model_config(vocab_size=ck.get("vocab_size"))
    router = build_router(mc.router, n_layers=mc.n_layers, n_kv_heads=mc.kv_heads, head_dim=mc.head_dim,
                          init=mc.router_init)  # the router alone (small): its sources
    if not candidate_routes(router):
        raise ConfigError(f"--ablate: {label}: router {mc.router!r} reads only each layer's own K/V; it has no route "
                          "to ablate")


def variant_key(cfg: TrialConfig) -> str:
    d = cfg.to_dict()
    d["train"] = {k: v for k, v in d["train"].items() if k not in RUNTIME}
    return json.dumps(d, sort_keys=True, default=str)


def variants(configs: dict[str, TrialConfig]) -> dict[str, list[str]]:
    """Variant name -> its checkpoints' labels, in the order given. A variant is named by its router,
    and by its router and first label when two variants share the router."""
    by_key: dict[str, list[str]] = {}
    for label, cfg in configs.items():
        by_key.setdefault(variant_key(cfg), []).append(label)
    router = {k: configs[labels[0]].model_config().router for k, labels in by_key.items()}
    shared = [r for r in router.values() if list(router.values()).count(r) > 1]
    return {(f"{router[k]} ({labels[0]})" if router[k] in shared else router[k]): labels
            for k, labels in by_key.items()}


def val_windows(cfg: TrialConfig, data) -> list:
    tr = cfg.train
    return data.val_batches(tr.batch_size, tr.seq_len, tr.eval_batches)


def ablate_checkpoint(model, cfg: TrialConfig, data, routes: list[RouteId], mass: dict[RouteId, float], *,
                      renormalize: bool) -> Ablation:
    val = val_windows(cfg, data)
    device = next(model.parameters()).device
    return measure(model, routes, mass, lambda m: window_losses(m, val, device, contextlib.nullcontext), mean_and_se,
                   renormalize=renormalize)


@dataclass
class RouteSummary:
    route: RouteId
    mass: float  # the mean over the checkpoints
    effect: float  # the mean over the checkpoints
    effects: list[float]
    interval: Interval | None  # the paired interval of the mean effect (two or more checkpoints)


def summarize(ablations: list[Ablation]) -> list[RouteSummary]:
    """Per route measured on every checkpoint of a variant: mean mass and effect and the paired
    interval of the effect over the checkpoints (each checkpoint's effect is already a paired
    difference: the same model and windows with and without the route); by mean effect, largest first."""
    out = []
    for r in ablations[0].routes:
        e = [a.effect[r] for a in ablations]
        iv = paired_interval(np.array(e, np.float64), LEVEL) if len(e) >= 2 else None
        out.append(RouteSummary(r, float(np.mean([a.mass[r] for a in ablations])), float(np.mean(e)), e, iv))
    return sorted(out, key=lambda s: (-s.effect if math.isfinite(s.effect) else math.inf, s.route.order()))


def metrics(a: Ablation) -> dict[str, float]:
    """What is logged on a checkpoint's run (finite values only)."""
    p = f"ablate/{'renormalized' if a.renormalize else 'zeroed'}"
    out = {f"{p}/val_loss": a.loss, f"{p}/routes_measured": float(len(a.routes)), f"{p}/spearman": a.spearman}
    for r in a.routes:
        out[f"{p}/effect/{r.key}"] = a.effect[r]
        out[f"{p}/mass/{r.key}"] = a.mass[r]
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _f(x: float, fmt: str = "+.4f") -> str:
    return format(x, fmt) if math.isfinite(x) else "nan"


def _interval(iv: Interval | None) -> str:
    if iv is None:
        return "-"
    if not iv.finite:
        return f"whole line (< {min_seeds_finite(LEVEL)} seeds)"
    return f"[{iv.low:+.4f}, {iv.high:+.4f}]"


@dataclass
class Variant:
    name: str
    router: str
    ablations: dict[str, Ablation]  # label -> its measurement
    candidates: int  # routes there are
    why: dict[RouteId, str]  # the routes measured and why each was taken
    limit: int | None


def measured_line(v: Variant) -> str:
    n, m = len(v.why), v.candidates
    if n == m:
        return f"Measured all {m} routes."
    top = sum(w == "top mass" for w in v.why.values())
    return (f"Measured {n} of {m} routes (--ablate-max-routes {v.limit}): the {top} of highest mean mass and a random "
            f"sample (seed 0) of {n - top} of the other {m - top}; the rank correlation is over these.")


def _section(v: Variant) -> list[str]:
    abl, labels = list(v.ablations.values()), list(v.ablations)
    a0, summ = abl[0], summarize(abl)
    how = ("the router's top-p pruning masks" if a0.mechanism == "mask"
           else "the mixing its kind reports (the mixer wrapped; weights untouched)")
    renorm = "renormalised (each row keeps its |weight| mass)" if a0.renormalize else "not renormalised"
    losses = "; ".join(f"{k} {a.loss:.4f} (se {_f(a.loss_se, '.4f')})" for k, a in v.ablations.items())
    rho = "; ".join(f"{k} {_f(a.spearman, '+.2f')}" for k, a in v.ablations.items())
    if len(abl) > 1:
        means = spearman([s.mass for s in summ], [s.effect for s in summ])
        rho += f"; of the means over the checkpoints {_f(means, '+.2f')}"
    lines = [f"## {v.name}: {len(abl)} checkpoint(s) ({', '.join(labels)})", "",
             f"Router `{v.router}`; zeroed through {how}; {renorm}. {measured_line(v)}", "",
             f"Validation loss without ablation: {losses}.", "",
             f"Spearman rank correlation of mass and effect: {rho}.", ""]
    if len(abl) == 1:
        lines += ["| layer | source | head | mass | effect | se (windows) | taken |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
    else:
        lines += [f"| layer | source | head | mass (mean) | effect (mean) | {LEVEL:.0%} interval (t ∪ sign-flip) | "
                  "per checkpoint | taken |", "|---:|---:|---:|---:|---:|---|---|---|"]
    for s in summ:
        r = s.route
        row = f"| {r.layer} | {r.source} | {'all' if r.head is None else r.head} | {s.mass:.4f} | {_f(s.effect)} | "
        if len(abl) == 1:
            row += f"{_f(a0.effect_se[r], '.4f')} |"
        else:
            row += f"{_interval(s.interval)} | {' '.join(_f(e) for e in s.effects)} |"
        lines.append(row + f" {v.why[r]} |")
    return lines + [""]


def markdown(variants_: list[Variant]) -> list[str]:
    lines = ["# Route ablation: the causal effect of each route beside its mass", "",
             "Effect: the validation loss (the trial's own validation windows, those of `val/loss`) with the route "
             "zeroed minus without it; mass: the route's share of the router's |weight| (the router map of "
             "`analysis.md`; per head: the head's share on the source layer), for a token-dependent router averaged "
             "over the same windows' tokens. Routing mass is not causal importance (arXiv 2606.13168).", ""]
    for v in variants_:
        lines += _section(v)
    return lines


def write(variants_: list[Variant], out: Path) -> list[Path]:
    """ablation.md, ablation.csv (checkpoint x route) and ablation_summary.csv (variant x route)."""
    out.mkdir(parents=True, exist_ok=True)
    md, per, summ = out / "ablation.md", out / "ablation.csv", out / "ablation_summary.csv"
    md.write_text("\n".join(markdown(variants_)) + "\n")
    with per.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "label", "layer", "source", "head", "mass", "effect", "effect_se", "val_loss",
                    "renormalize", "mechanism", "taken"])
        for v in variants_:
            for label, a in v.ablations.items():
                for r in a.routes:
                    w.writerow([v.name, label, r.layer, r.source, "" if r.head is None else r.head, repr(a.mass[r]),
                                repr(a.effect[r]), repr(a.effect_se[r]), repr(a.loss), a.renormalize, a.mechanism,
                                v.why[r]])
    with summ.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "layer", "source", "head", "checkpoints", "mass", "effect", "low", "high", "level",
                    "method", "taken"])
        for v in variants_:
            for s in summarize(list(v.ablations.values())):
                r, iv = s.route, s.interval
                w.writerow([v.name, r.layer, r.source, "" if r.head is None else r.head, len(s.effects), repr(s.mass),
                            repr(s.effect), "" if iv is None else repr(iv.low), "" if iv is None else repr(iv.high),
                            LEVEL if iv else "", iv.method if iv else "", v.why[r]])
    return [md, per, summ]


def select(name: str, router: str, masses: dict[str, dict[RouteId, float]], candidates: list[RouteId],
           limit: int | None) -> Variant:
    """The routes to measure on every checkpoint of a variant (by the mean mass over them)."""
    mean = {r: float(np.mean([m[r] for m in masses.values()])) for r in candidates}
    _, why = select_routes(candidates, mean, limit)
    return Variant(name, router, {}, len(candidates), why, limit)
