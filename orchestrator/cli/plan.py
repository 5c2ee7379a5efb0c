"""``lime plan SWEEP_FILE``: what a sweep design can show, and how many seeds it needs.

The file is loaded and validated by the sweep layer; its numbers (the compared axis and its
values, the seeds per arm, alpha, the metric and its direction, the paper result it mirrors)
go to the torch-free planner (``orchestrator.report.planner``). The spread of the per-seed paired
differences comes from ``--sigma``, ``--pilot SWEEP`` (that sweep's finished MLflow runs), or by
default the sweep's own data: its finished runs, else its committed ``results/<name>/summary.csv``.

The planner (scipy, pandas, statsmodels) loads after the file has passed validation
(``importlib``), so a bad file is refused as fast as by ``lime sweep run``.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.core.keys import dotted
from orchestrator.core.tracking import tracking_uri
from orchestrator.sweep.spec import load_spec


def _planner():
    """``orchestrator.report.planner`` (scipy, pandas, statsmodels), loaded on first use."""
    return importlib.import_module("orchestrator.report.planner")


def design_of(spec, alpha: float | None = None):
    """A loaded sweep's comparison as the planner's plain numbers (a ``planner.Design``)."""
    rep = spec.report
    axis_key = dotted(str(rep.axis))
    values: list[Any] = next((v for a, v in spec.grid.items() if dotted(a) == axis_key), [])
    if not values and spec.search is not None:
        param = next((p for p in spec.search.space.values() if dotted(p.name) == axis_key), None)
        values = list(param.values) if param is not None and param.kind == "choice" else []
    seeds = next((len(v) for a, v in spec.grid.items() if dotted(a) == "train.seed"), None)
    if seeds is None:
        seeds = spec.search.repeat if spec.search is not None else 1
    paper = getattr(rep, "paper", None)
    refs = importlib.import_module("orchestrator.report.paper.refs")
    return _planner().Design(name=spec.name, metric=rep.metric, axis=str(rep.axis), baseline=rep.baseline,
                             variants=tuple(values) or (rep.baseline,), seeds=int(seeds),
                             alpha=alpha if alpha is not None else float(getattr(rep, "alpha", None) or 0.05),
                             mode=getattr(rep, "mode", None), paper=refs.reference_for(spec.name, paper))


def dry_run_block(spec) -> str:
    """The planner's reachability block for ``lime sweep run --dry-run``."""
    d, planner = design_of(spec), _planner()
    return planner.plan_block(d.name, d.metric, d.axis, d.baseline, list(d.variants), d.seeds, d.alpha, d.mode, d.paper)


def _check(args) -> None:
    if args.sigma is not None and not args.sigma > 0:
        raise ConfigError(f"plan: --sigma must be > 0 (a standard deviation in metric units), got {args.sigma}")
    if args.sigma is not None and args.pilot:
        raise ConfigError("plan: give --sigma or --pilot, not both")
    if args.effect is not None and (args.effect == 0 or abs(args.effect) >= 1):
        raise ConfigError(f"plan: --effect is relative (0.01 = 1%): nonzero and below 1 in size, got {args.effect}")
    if args.delta is not None and args.delta == 0:
        raise ConfigError("plan: --delta must be nonzero (an absolute difference in metric units)")
    if args.effect is not None and args.delta is not None:
        raise ConfigError("plan: give --effect (relative) or --delta (absolute), not both")
    if not 0 < args.power < 1:
        raise ConfigError(f"plan: --power must be between 0 and 1, got {args.power}")
    if args.alpha is not None and not 0 < args.alpha < 1:
        raise ConfigError(f"plan: --alpha must be between 0 and 1, got {args.alpha}")


def own_spread(name: str, metric: str):
    """The sweep's own data (a ``planner.Spread``): its finished MLflow runs, else its committed
    summary.csv, else None (a local store that does not exist is not created)."""
    planner, uri = _planner(), tracking_uri()
    if not uri.startswith("sqlite:///") or Path(uri[len("sqlite:///"):]).is_file():
        try:
            return planner.pilot(name, metric)
        except ConfigError:
            pass
    root = Path(os.environ.get("LIME_RESULTS") or "results")
    return planner.committed(root / name / "summary.csv")


def cmd_plan(args) -> int:
    _check(args)
    spec = load_spec(args.file)  # every check; ConfigError -> one line, exit 2
    design, planner = design_of(spec, args.alpha), _planner()  # the planner loads once the file has passed
    cell_text = importlib.import_module("orchestrator.core.fmt").cell_text
    if args.sigma is not None:
        spread = planner.Spread({}, None, f"--sigma {args.sigma:g} (given: no upper bound applied)")
        spread = planner.Spread({cell_text(v): (args.sigma, None) for v in design.variants}, None, spread.source)
    elif args.pilot:
        spread = planner.pilot(args.pilot, design.metric)
    else:
        spread = own_spread(spec.name, design.metric)
    print(f"sweep {spec.name}: {spec.description}")
    print(planner.plan_text(design, spread, effect=args.effect, delta=args.delta, target=args.power))
    return 0
