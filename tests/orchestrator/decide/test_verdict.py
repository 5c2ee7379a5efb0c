"""Interval -> verdict, margins and the contradiction check, on hand-made intervals."""
from __future__ import annotations

import math

import pytest

from lime_arch.errors import ConfigError
from orchestrator.decide.families import BASELINE, Family
from orchestrator.decide.intervals import Interval
from orchestrator.decide.verdict import (
    BETTER,
    EQUIVALENT,
    UNDECIDABLE,
    UNDECIDED,
    UNTESTED,
    WORSE,
    Margin,
    contradiction,
    margin_for,
    margins_text,
    parse_margins,
    verdict,
)


def iv(lo, hi, n=8):
    return Interval(lo, hi, 0.975, n, "test")


@pytest.mark.parametrize("lo,hi,mode,margin,word,inside", [
    (-0.05, -0.01, "min", None, BETTER, False),
    (-0.05, -0.01, "max", None, WORSE, False),
    (0.01, 0.05, "min", None, WORSE, False),
    (-0.004, -0.001, "min", 0.01, BETTER, True),
    (-0.02, 0.01, "min", None, UNDECIDED, False),
    (-0.005, 0.008, "min", 0.01, EQUIVALENT, False),
    (-0.012, 0.008, "min", 0.01, UNDECIDED, False),
    (-math.inf, math.inf, "min", 0.01, UNDECIDABLE, False),
])
def test_the_verdict_is_read_off_the_interval(lo, hi, mode, margin, word, inside):
    v = verdict(iv(lo, hi), mode, margin)
    assert (v.word, v.within_margin) == (word, inside)
    assert contradiction(v.word, lo, hi, "lower" if mode == "min" else "higher", margin) is None


def test_one_seed_is_not_tested():
    assert verdict(iv(-1, 1, n=1), "min").word == UNTESTED


def test_the_check_finds_every_kind_of_contradiction():
    assert contradiction(BETTER, -0.02, 0.01, "lower", None)  # "better" whose interval holds 0
    assert contradiction(BETTER, 0.01, 0.02, "lower", None)  # the wrong side
    assert contradiction(UNDECIDED, -0.04, -0.005, "lower", None)  # the nine cases
    assert contradiction(EQUIVALENT, -0.02, 0.01, "lower", 0.01)
    assert contradiction(EQUIVALENT, -0.002, 0.001, "lower", math.nan)  # equivalence without a margin
    assert contradiction(UNDECIDABLE, -0.1, 0.1, "lower", None)
    assert contradiction(WORSE, 0.01, 0.02, "lower", None) is None


def test_margins_parse_and_round_trip_through_their_text():
    assert parse_margins(0.01) == {None: Margin(0.01, False)}
    assert parse_margins("1%") == {None: Margin(1.0, True)}
    assert parse_margins("2e-3") == {None: Margin(0.002, False)}
    m = parse_margins({"final/val_loss": 0.01, "val/accuracy": "1.5%"})
    assert parse_margins(margins_text(m)) == m and margins_text({}) is None
    assert Margin(1.0, True).absolute(1.6) == pytest.approx(0.016) and Margin(0.01, False).absolute(3.0) == 0.01
    assert margin_for(parse_margins("1%"), "final/val_loss", "final/val_loss") == Margin(1.0, True)
    assert margin_for(parse_margins("1%"), "val/accuracy", "final/val_loss") is None


@pytest.mark.parametrize("bad", [0, -0.1, "0%", "abc", True, "1%%", {}])
def test_a_bad_margin_is_one_clear_line(bad):
    with pytest.raises(ConfigError, match=r"report\.margin"):
        parse_margins(bad)


def test_a_margin_names_a_metric_as_logged():
    with pytest.raises(ConfigError) as e:
        parse_margins({"val_loss": 0.01})
    assert str(e.value) == ("report.margin: 'val_loss' is not a metric name; name metrics as logged, like "
                            "final/val_loss or eval/<task>/<metric>")
    assert list(parse_margins({"eval/arc_easy/acc_norm": "1%"})) == ["eval/arc_easy/acc_norm"]


def test_bonferroni_levels():
    assert Family(BASELINE, 4, 0.05).level == pytest.approx(0.9875)
    assert "4 comparison(s)" in Family(BASELINE, 4, 0.05).text()
