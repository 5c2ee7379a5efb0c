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


def test_ranked_on_the_paired_seeds():
    # first-4 stopped at 8 seeds: its own mean 1.946 is -2.70% against the baseline's 32-seed mean 2.0,
    # but on the 8 seeds it shares with the baseline (whose mean there is 2.0122) it is -0.0658 = -3.27%;
    # b ran all 32 seeds: mean 1.94 (-3.00%), paired -0.06 (-3.00%). Paired, first-4 ranks first.
    rows = [_row("llama", 2.0, True, "baseline"), _row("first-4", 1.946), _row("b", 1.94)]
    rows[1].update(diff_mean=1.946 - 2.0118, diff_pct=100 * (1.946 - 2.0118) / 2.0118, n_pairs=8)
    rows[2].update(diff_mean=-0.06, diff_pct=-3.0, n_pairs=32)
    lines = ranking_table(rows, {}, "min", "final/val_loss")
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in lines if x.startswith("| ") and "rank" not in x]
    assert [c[1] for c in cells] == ["first-4", "b", "llama (baseline)"]
    assert cells[0][3] == "-3.27% (8 seeds)" and cells[1][3] == "-3.00% (32 seeds)" and cells[2][3] == "-"
    assert "paired change (seeds)" in lines[0] and "by the paired change" in lines[-1]
    # by the means b (1.94) would rank before first-4 (1.946): the table does not
    unpaired = ranking_table([dict(r, diff_mean=math.nan) for r in rows], {}, "min", "final/val_loss")
    assert [c.strip() for c in unpaired[2].strip("|").split("|")][1] == "b"
