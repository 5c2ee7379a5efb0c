"""The report's families under the verdict rule (issue 33): Holm over the whole family (every table),
zero-variance comparisons out of it as "not tested", and Tarone's exclusion of comparisons whose seeds
cannot reach the family's level; checked against statsmodels' Holm and Tarone worked by hand."""
from __future__ import annotations

import math

import pytest
from statsmodels.stats.multitest import multipletests

from orchestrator.report.compare import decisions, verdicts
from tests.orchestrator.report.test_verdicts import run, shifted


def test_holm_is_over_the_whole_family_not_per_table():
    _, a = run({"none": shifted(0), "full": shifted(-0.05, 0.01), "first-4": shifted(0.01, 0.02)})
    _, b = run({"none": shifted(0), "full": shifted(-0.03, 0.02), "first-4": shifted(0.0, 0.03)})
    out, fam = decisions.apply([a, b], 0.05, "min")
    rows = [r for pa in out for r in pa.rows]
    want = multipletests([r.p_perm for r in rows], method="holm")[1]
    assert [r.p_perm_holm for r in rows] == pytest.approx(list(want))
    assert fam.baseline.size == 4 and all(r.family_size == 4 for r in rows)
    # per table (the old way) the smallest p would be multiplied by 2, not 4
    assert min(r.p_perm_holm for r in rows) == pytest.approx(4 * min(r.p_perm for r in rows))


def test_zero_variance_leaves_the_family_and_tarone_drops_what_cannot_reach_it():
    # full: a constant difference (zero variance) -> not tested; first-4 on 8 seeds, average on 5 seeds
    groups = {"none": shifted(0), "full": shifted(-0.05), "first-4": shifted(-0.05, 0.01),
              "average": shifted(-0.05, 0.01)[:5] + [math.nan] * 3}
    _, pa = run(groups)
    out, fam = decisions.apply([pa], 0.05, "min")
    row = {r.variant: r for r in out[0].rows}
    assert row["full"].verdict == verdicts.UNTESTED and row["full"].note.startswith("not tested: zero variance")
    # testable: first-4 (8 seeds, smallest p 2/256) and average (5 seeds, 2/32 > 0.05): K = 1 keeps first-4 alone
    assert fam.baseline.size == 1 and row["first-4"].confidence == pytest.approx(0.95)
    assert row["first-4"].verdict == verdicts.BETTER and not row["first-4"].note
    assert row["average"].verdict == verdicts.UNDECIDABLE and math.isnan(row["average"].p_perm_holm)
    assert row["average"].note == "left out of the family (Tarone): needs 6 seeds at alpha 0.05"
    assert row["first-4"].p_perm_holm == pytest.approx(row["first-4"].p_perm)  # a family of one
