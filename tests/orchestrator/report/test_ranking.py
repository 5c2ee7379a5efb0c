"""The report's ranking of a field (render/tables.ranking_table) on hand-made rows."""
from __future__ import annotations

import math

from orchestrator.report.render.tables import ranking_table


def _row(v, mean, base=False, verdict="not decided"):
    return {"variant": v, "baseline": base, "mean": mean, "change_pct": 0.0, "verdict": verdict,
            "step_time_change_pct": 1.0, "peak_mem_change_pct": 2.0}


def test_ranked_by_mean_and_by_the_metric_at_equal_flops():
    rows = [_row("llama", 2.0, True, "baseline"), _row("a", 1.9, verdict="better"), _row("b", 2.1), _row("c", math.nan)]
    iso = {"llama": (2.0, 0.0), "a": (2.05, 0.05), "b": (1.95, -0.05)}  # c's runs end before the budget
    lines = ranking_table(rows, iso, "min", "final/val_loss")
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| rank")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in body]
    assert [c[1] for c in cells] == ["a", "llama (baseline)", "b", "c"]  # lower mean first, NaN last
    assert [c[5] for c in cells] == ["3", "2", "1", "-"]  # at equal FLOPs b is best, a worst
    assert cells[0][4] == "better" and cells[3][6] == "-"
    higher = ranking_table(rows[:3], iso, "max", "val/accuracy")
    assert [c.strip() for c in higher[2].strip("|").split("|")][1] == "b"  # higher is better: b first
