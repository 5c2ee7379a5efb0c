"""``lime report SWEEP``: statistics, tables and plots of a sweep, from its MLflow runs.

SWEEP is a sweep name (the report takes what it compares from the sweep's parent MLflow run) or
a sweep file path: then the file, loaded and validated by the sweep layer, says what is compared
and is shown in the report. A file that no longer validates (a data file moved, a key renamed)
is still shown, and the report falls back to the parent run's settings, with a note.
``--metric/--axis/--baseline`` override either. ``--pool A,B,...`` pools the pre-registered comparisons
of several sweeps into one family (``orchestrator.report.pool``). The file's optional report keys (``alpha``,
``mode``, ``paper``, ``tune``) are used when the sweep layer knows them. Reports go to
``--out``/<sweep>/, by default ``$LIME_RESULTS`` or ``results``.

Before anything is read or written: a sweep name is checked like a sweep file's ``name`` (it
becomes a path), a sqlite store that does not exist is an error (never created), and a sweep
whose artifacts an MLflow server serves (``mlflow-artifacts:``) needs that server as the tracking
URI, not its database file (the report could not be logged to the parent run).
Only the sweep file's validation is imported up front; the report builder (pandas, scipy,
MLflow) loads after the file has been read (``importlib``), so a missing file is refused at once.
``--throughput`` (``orchestrator.bench.throughput``: torch) measures the throughput ratios of the
wall-clock speedups (``orchestrator.report.wallclock``); ``--throughput-rounds`` is checked first.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from lime_arch.errors import ConfigError
from orchestrator.core import tracking
from orchestrator.core.outputs import check_out_folder
from orchestrator.core.record import ReportSettings
from orchestrator.sweep.blocks import check_name
from orchestrator.sweep.spec import load_spec
from orchestrator.sweep.view import experiment_dir, require_store

SERVED = "mlflow-artifacts:"  # an experiment whose artifacts only its MLflow server can reach
MAX_ROUNDS = 200  # orchestrator.report.wallclock.MAX_ROUNDS (not imported here: it loads pandas and scipy)


def throughput_rounds(args) -> int | None:
    """``--throughput-rounds``, checked before anything is read: None for the default (or no measurement)."""
    n = getattr(args, "throughput_rounds", None)
    if n is None:
        return None
    if not getattr(args, "throughput", False):
        raise ConfigError("report --throughput-rounds: only with --throughput (it sets the measurement's rounds)")
    text = str(n).strip()
    if not (text.isdigit() and 1 <= int(text) <= MAX_ROUNDS):
        raise ConfigError(f"report --throughput-rounds: must be an integer between 1 and {MAX_ROUNDS}, got {n!r}")
    return int(text)


def cmd_report(args) -> int:
    rounds = throughput_rounds(args)
    if getattr(args, "pool", None):
        if getattr(args, "throughput", False):
            raise ConfigError("report --pool: no --throughput (a wall-clock speedup is measured for one sweep's "
                              "shape: run lime report SWEEP --throughput for each)")
        if args.sweep or args.metric or args.axis or args.baseline:
            raise ConfigError("report --pool: name the sweeps in --pool only (each is compared as its own report "
                              "compares it; no SWEEP, --metric, --axis or --baseline)")
        names = [n.strip() for n in args.pool.split(",") if n.strip()]
        if len(names) < 2 or len(set(names)) != len(names):  # before the stores are looked at
            raise ConfigError(f"report --pool: name two or more different sweeps, got {args.pool!r}")
        for n in names:  # each becomes a path and is looked up: checked before anything is read or written
            check_name(n, "report --pool")
        check_out_folder(args.out, "--out")
        check_out_folder(Path(args.out) / ("pool-" + "-".join(names)), "--out")  # report.pool.pool_name
        for n in names:
            check_store(n)
        pool = importlib.import_module("orchestrator.report.pool")
        print(pool.build_pool(names, out=args.out))
        return 0
    if not args.sweep:
        raise ConfigError("report: name a sweep (or a sweep file), or --pool A,B,...")
    name, settings, sweep_file = args.sweep, None, None
    if _is_file(args.sweep):
        name, settings, sweep_file = settings_from_file(Path(args.sweep))
    else:
        check_name(name, "report")
    check_out_folder(args.out, "--out")
    check_out_folder(Path(args.out) / name, "--out")  # the report's own folder: not a file either
    check_store(name)
    build = importlib.import_module("orchestrator.report.build")  # pandas, scipy, MLflow: the file is read
    # --throughput: the benchmark's timing (torch) measures; the report layer stays torch-free and calls it
    measure = None
    if getattr(args, "throughput", False):
        measure = importlib.import_module("orchestrator.bench.throughput").measure
    path = build.build_report(name, out=args.out, metric=args.metric, axis=args.axis, baseline=args.baseline,
                              settings=settings, sweep_file=sweep_file, measure=measure, rounds=rounds)
    print(path)
    return 0


def check_store(name: str) -> None:
    """The tracking URI can serve this report: the store exists, and reaches the artifacts."""
    uri = tracking.tracking_uri()
    require_store(uri, name, experiment_dir(name))
    if uri.startswith(("http://", "https://")):
        return
    exp = tracking.client(uri).get_experiment_by_name(name)
    where = getattr(exp, "artifact_location", "") or ""
    if where.startswith(SERVED):
        raise ConfigError(f"report: the artifacts of sweep {name!r} are served by an MLflow server ({where}), "
                          f"but MLFLOW_TRACKING_URI is its database ({uri}); set MLFLOW_TRACKING_URI to that "
                          "server (http://<host>:<port>)")


def _is_file(arg: str) -> bool:
    p = Path(arg)
    return p.suffix in (".yaml", ".yml") or p.is_file()


def settings_from_file(path: Path) -> tuple[str, ReportSettings | None, object]:
    """(sweep name, its report settings, the file to show: a ``report.settings.SweepFile``).
    Settings are None when the file does not validate: the report then takes them from the parent
    run, and notes why."""
    if not path.is_file():
        raise ConfigError(f"report: sweep file {path} does not exist")
    text = path.read_text()
    shown = importlib.import_module("orchestrator.report.settings")  # the file exists: the report layer loads
    try:
        spec = load_spec(path)
    except ConfigError as e:
        why = str(e).replace(str(path), path.name)  # no machine-specific paths in a report
        return path.stem, None, shown.SweepFile(text=text, source=path.name, notes=[
            f"the sweep file does not validate with this code ({why}); the report settings are the "
            "launched sweep's (MLflow)"])
    mlflow_runs = importlib.import_module("orchestrator.sweep.mlflow_runs")
    settings = mlflow_runs.sweep_record(spec).report_settings()
    return spec.name, settings, shown.SweepFile(text=text, source=path.name)


