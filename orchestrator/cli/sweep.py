"""``lime sweep run`` and ``lime sweep status``."""
from __future__ import annotations

import os

from orchestrator.cli.plan import dry_run_block
from orchestrator.sweep.driver import run_sweep
from orchestrator.sweep.spec import load_spec
from orchestrator.sweep.view import dry_run_text, status_text


def cmd_run(args) -> int:
    spec = load_spec(args.file)  # every check; ConfigError -> one line, exit 2, nothing started
    if args.dry_run:
        print(dry_run_text(spec))
        print(dry_run_block(spec))  # what the design can show (lime plan has the rest)
        return 0
    address = getattr(args, "address", None) or os.environ.get("RAY_ADDRESS") or None
    summary = run_sweep(spec, address=address)
    return 0 if summary["ok"] else 1


def cmd_status(args) -> int:
    print(status_text(args.name))
    return 0
