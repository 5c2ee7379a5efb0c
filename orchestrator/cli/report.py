"""``lime report``: statistics, tables and plots of a sweep, from its MLflow runs."""
from __future__ import annotations

from orchestrator.report.build import build_report


def cmd_report(args) -> int:
    path = build_report(args.sweep, out=args.out, metric=args.metric, axis=args.axis,
                        baseline=args.baseline)
    print(path)
    return 0
