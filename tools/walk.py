"""The walk of a ``lime`` command through the project's code, counted (docs/ARCHITECTURE.md, "The
walk of a sweep").

    python -m tools.walk                      # lime sweep run sweeps/default.yaml --dry-run
    python -m tools.walk sweep run sweeps/default-decide.yaml --dry-run
    python -m tools.walk --launch sweeps/default.yaml   # a launch that grows a sweep, Ray stubbed
    python -m tools.walk --list ...           # and each function, by file

Runs the ``lime`` CLI in this process under ``sys.setprofile`` and prints how many distinct
functions of ``lime_arch/`` and ``orchestrator/`` it called, in how many files, and how many calls
of them it made. A function is a named code object (a method is one; a module body, comprehension
or lambda is not). A command is traced from the import of ``orchestrator.cli`` on, as the ``lime``
script runs it, so what runs while modules load counts too.

``--launch FILE``: a first ``lime sweep run FILE`` (not traced), then ``lime sweep run FILE
--add-seeds 1`` traced: the driver's whole launch (planning, tracking, the tuner, finish) with
Ray's start and each Ray experiment's fit stubbed, so nothing trains and nothing is imported in
the traced part; in a temporary MLflow store and results folder. The command's own output is not
shown. Stdlib only; it counts the code of the checkout it lives in.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tuple(str(ROOT / p) + "/" for p in ("lime_arch", "orchestrator"))
DEFAULT = ["sweep", "run", "sweeps/default.yaml", "--dry-run"]


@contextlib.contextmanager
def traced(calls: Counter):
    """Count the calls of each project function, (file, first line, name), into ``calls``."""
    def profile(frame, event, _arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(PACKAGES) and not code.co_name.startswith("<"):
            calls[(code.co_filename, code.co_firstlineno, getattr(code, "co_qualname", code.co_name))] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def _lime(argv: list[str], calls: Counter | None = None) -> int:
    out = io.StringIO()
    trace = traced(calls) if calls is not None else contextlib.nullcontext()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), trace:
        from orchestrator.cli import main

        rc = main(argv)
    if rc not in (0, 1):
        print(out.getvalue()[-2000:], file=sys.stderr)
    return rc


def launch(file: str, calls: Counter) -> tuple[list[str], int]:
    """The traced second launch of ``file`` (see the module); (its arguments, its exit code)."""
    from orchestrator.sweep import connect, driver

    tmp = tempfile.mkdtemp(prefix="lime-walk-")
    os.environ.update(LIME_RESULTS=f"{tmp}/results", MLFLOW_TRACKING_URI=f"sqlite:///{tmp}/mlflow.db")
    connect.start_ray = lambda *a, **k: False  # no Ray: the launch's own steps only
    driver._one_tuner = lambda spec, exp_dir, view, ctx: SimpleNamespace(fit=lambda: [])
    try:
        _lime(["sweep", "run", file])  # the first launch: nothing trains, so every trial is left to do
        argv = ["sweep", "run", file, "--add-seeds", "1"]
        return argv, _lime(argv, calls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print each function, by file")
    ap.add_argument("--launch", metavar="FILE", help="count a launch that grows FILE's sweep, Ray stubbed")
    args, rest = ap.parse_known_args(argv)
    sys.path.insert(0, str(ROOT))
    calls: Counter = Counter()
    if args.launch:
        command, rc = launch(args.launch, calls)
    else:
        command = rest or DEFAULT
        rc = _lime(command, calls)
    files: dict[str, list[str]] = defaultdict(list)
    for path, line, name in sorted(calls):
        files[str(Path(path).relative_to(ROOT))].append(f"{name}:{line}")
    if args.list:
        for f, names in sorted(files.items()):
            print(f"{f} ({len(names)}): {', '.join(names)}")
    print(f"lime {' '.join(command)}: {len(calls)} project functions in {len(files)} files, "
          f"{sum(calls.values())} calls (exit {rc})")
    return 0 if rc in (0, 1) else rc


if __name__ == "__main__":
    sys.exit(main())
