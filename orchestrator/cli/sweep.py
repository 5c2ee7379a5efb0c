"""``lime sweep run`` and ``lime sweep status``."""
from __future__ import annotations

import os

from orchestrator.sweep.driver import run_sweep
from orchestrator.sweep.spec import load_spec
from orchestrator.sweep.view import dry_run_text, status_text


def cmd_run(args) -> int:
    spec = load_spec(args.file)  # every check; ConfigError -> one line, exit 2, nothing started
    if args.dry_run:
        print(dry_run_text(spec))
        return 0
    address = getattr(args, "address", None) or os.environ.get("RAY_ADDRESS") or None
    summary = run_sweep(spec, address=address, connect_timeout=getattr(args, "connect_timeout", None))
    return 0 if summary["ok"] else 1


def cmd_status(args) -> int:
    print(status_text(args.name))
    return 0
