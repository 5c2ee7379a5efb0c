"""``lime sweep run`` and ``lime sweep status``.

Only the sweep file's validation is imported up front (``orchestrator.sweep.spec``: no torch,
Ray or MLflow), so a bad file is refused in a fraction of a second; the driver, the dry run's
view and the planner load after the file has passed (``importlib``, the CLI's lazy path).
"""
from __future__ import annotations

import importlib
import os

from lime_arch.errors import ConfigError
from orchestrator.cli.plan import dry_run_block
from orchestrator.core.tracking import tracking_uri
from orchestrator.sweep import connect, metric_names, preflight
from orchestrator.sweep.blocks import check_name, with_options
from orchestrator.sweep.spec import load_spec


def cmd_run(args) -> int:
    add = _add_seeds(getattr(args, "add_seeds", None))
    spec = load_spec(args.file)  # every check; ConfigError -> one line, exit 2, nothing started
    options = (getattr(args, "until_decided", False), getattr(args, "max_seeds", None), getattr(args, "margin", None),
               getattr(args, "budget", None))
    spec = with_options(spec, *options)  # the wave options, checked with the file: still torch-free
    if options[2] is not None:  # --margin's metrics are ones the trials log, as the file's are
        found = metric_names.unknown(spec, [t.config for t in spec.trials()])
        if found:
            raise ConfigError(f"--margin: {found[1]}")
    if spec.decide is not None and add:
        raise ConfigError("--add-seeds: a sweep run until decided adds its own seeds (waves); drop --add-seeds")
    address = getattr(args, "address", None) or os.environ.get("RAY_ADDRESS") or None
    if address:
        connect.split_address(address)  # ray:// or not HOST:PORT: one line, exit 2
    connect.connect_timeout(getattr(args, "connect_timeout", None))  # a number of seconds, bounded
    if args.dry_run:
        print(_dry_run(spec, address, add))
        return 0
    if not address:  # more CPUs or GPUs per trial than this machine has: one line before Ray loads
        preflight.check_local(spec)
    timeout = getattr(args, "connect_timeout", None)
    if spec.decide is not None:  # Ray, MLflow, torch from here on: the file is valid
        decide = importlib.import_module("orchestrator.sweep.decide")
        return 0 if decide.run_until_decided(spec, address=address, connect_timeout=timeout)["ok"] else 1
    driver = importlib.import_module("orchestrator.sweep.driver")
    summary = driver.run_sweep(spec, address=address, add_seeds=add, connect_timeout=timeout)
    return 0 if summary["ok"] else 1


def _add_seeds(value: str | None) -> int:
    """``--add-seeds N``: a positive integer (parsed here, so a bad one is one line and exit 2)."""
    if value is None:
        return 0
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1 or str(value).strip() != str(n):
        raise ConfigError(f"--add-seeds: must be a positive integer (how many seeds to add), got {value!r}")
    return n


def _dry_run(spec, address: str | None, add: int) -> str:
    """The dry run of the sweep a run would launch: with the seeds in effect, and what a run of
    this file would add to (or refuse about) the sweep it continues. Writes nothing."""
    if spec.eval is not None:  # its tasks resolve and their data can be had, as a launch checks them
        importlib.import_module("orchestrator.sweep.evaluate").preflight(spec)
    view = importlib.import_module("orchestrator.sweep.view")
    extend = importlib.import_module("orchestrator.sweep.extend")
    exp_dir = view.experiment_dir(spec.name)
    try:
        p = extend.plan(spec, exp_dir, tracking_uri(), add)
    except ConfigError as e:
        if add and "--add-seeds" in str(e):
            raise
        text = _before_last(view.dry_run_text(spec, address), dry_run_block(spec))
        return _before_last(text, f"warning: a run would refuse: {e}")
    # what the design can show (lime plan has the rest), then what a run would do to the sweep
    text = _before_last(view.dry_run_text(p.spec, address), dry_run_block(p.spec))
    if spec.eval is not None:
        text = _before_last(text, eval_line(spec))
    return _before_last(text, p.message) if p.message else text


def eval_line(spec) -> str:
    """The eval: block in one line (its tasks and data were checked: ``evaluate.preflight``)."""
    tasks = ", ".join(f"{t} ({'default' if n is None else n}-shot)" for t, n in spec.eval.plan())
    return (f"eval: after the trials, each finished trial's final checkpoint on {tasks}"
            + (", with the gold-answer bits per byte of the multiple-choice ones" if spec.eval.gold_loss else "")
            + "; tasks and data checked")


def _before_last(text: str, line: str) -> str:
    """``line`` inserted before the dry run's last line (``dry run: nothing was started``)."""
    head, _, last = text.rpartition("\n")
    return f"{head}\n{line}\n{last}"


def cmd_status(args) -> int:
    name = check_name(args.name, "sweep status")  # it becomes a path: checked first
    print(importlib.import_module("orchestrator.sweep.view").status_text(name))
    return 0
