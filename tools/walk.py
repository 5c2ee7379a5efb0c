"""The walk of a ``lime`` command through the project's code, counted (docs/ARCHITECTURE.md, "The
walk of a sweep").

    python -m tools.walk                      # lime sweep run sweeps/default.yaml --dry-run
    python -m tools.walk sweep run sweeps/default-decide.yaml --dry-run
    python -m tools.walk --list ...           # and each function, by file

Runs the ``lime`` CLI in this process under ``sys.setprofile`` (from the import of
``orchestrator.cli`` on, as the ``lime`` script does) and prints how many distinct functions of
``lime_arch/`` and ``orchestrator/`` it called, in how many files. A function is a named code
object (a method is one, a module body, comprehension or lambda is not); called while a module
loads, it counts as any other. The command's own output is not shown. Stdlib only; it counts the
code of the checkout it lives in.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tuple(str(ROOT / p) + "/" for p in ("lime_arch", "orchestrator"))
DEFAULT = ["sweep", "run", "sweeps/default.yaml", "--dry-run"]


def walk(argv: list[str]) -> tuple[int, set[tuple[str, int, str]]]:
    """(the command's exit code, the project functions it called: (file, first line, name))."""
    seen: set[tuple[str, int, str]] = set()

    def profile(frame, event, _arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(PACKAGES) and not code.co_name.startswith("<"):
            seen.add((code.co_filename, code.co_firstlineno, getattr(code, "co_qualname", code.co_name)))

    sys.path.insert(0, str(ROOT))
    out = io.StringIO()
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            from orchestrator.cli import main

            rc = main(argv)
    finally:
        sys.setprofile(None)
    if rc:
        print(out.getvalue()[-2000:], file=sys.stderr)
    return rc, seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print each function, by file")
    args, rest = ap.parse_known_args(argv)
    command = rest or DEFAULT
    rc, seen = walk(command)
    files: dict[str, list[str]] = defaultdict(list)
    for path, line, name in sorted(seen):
        files[str(Path(path).relative_to(ROOT))].append(f"{name}:{line}")
    if args.list:
        for f, names in sorted(files.items()):
            print(f"{f} ({len(names)}): {', '.join(names)}")
    print(f"lime {' '.join(command)}: {len(seen)} project functions in {len(files)} files (exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
