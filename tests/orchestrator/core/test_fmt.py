"""orchestrator.core.fmt: values and numbers as the report writes them (hand-written expectations)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.core.fmt import (
    cell,
    cell_text,
    natural_key,
    norm_value,
    num,
    order_key,
    pct,
    same_value,
    sci,
    slug,
    table,
    to_float,
)


def test_norm_value_makes_one_group_of_12_and_12_0():
    assert norm_value(np.float64(12.0)) == 12 and type(norm_value(np.float64(12.0))) is int
    assert norm_value(np.int64(3)) == 3 and type(norm_value(np.int64(3))) is int
    assert norm_value(float("nan")) is None and norm_value(0.5) == 0.5 and norm_value("full") == "full"
    assert norm_value(True) is True
    assert same_value("12", 12.0) and same_value(np.int64(4), "4")
    assert not same_value(None, None) and not same_value(float("nan"), "nan") and not same_value(1, 2)


def test_order_key_numbers_then_strings_then_missing():
    values = ["full", None, 12, "none", 2.0, float("nan"), "average", 100]
    assert sorted(values, key=order_key)[:6] == [2.0, 12, 100, "average", "full", "none"]
    assert all(norm_value(v) is None for v in sorted(values, key=order_key)[6:])
    # a baseline goes first among the strings, numbers keep their order
    assert sorted(["full", "none", "average", 4], key=lambda v: order_key(v, first="none")) == \
        [4, "none", "average", "full"]
    assert sorted([True, 1.5], key=order_key) == [1.5, True]  # a bool is not a number: a string


def test_natural_key_and_slug():
    names = ["layer_10", "layer_2", "layer_1", "emb"]
    assert sorted(names, key=natural_key) == ["emb", "layer_1", "layer_2", "layer_10"]
    assert slug("full, n_layers=4") == "full_n_layers_4" and slug("a/b c") == "a_b_c" and slug("///") == "x"


def test_to_float():
    assert to_float("2.5") == 2.5 and to_float(3) == 3.0
    assert math.isnan(to_float(None)) and math.isnan(to_float("abc")) and math.isnan(to_float([1]))


@pytest.mark.parametrize("x, digits, text", [
    (3.14159265, 5, "3.1416"), (3.14159265, 4, "3.142"), (2.9, 5, "2.9"), (100000.0, 5, "100000"),
    (123456.7, 5, "123457"), (99999.4, 5, "99999"), (0.000123456, 3, "0.000123"), (1.5e-7, 3, "1.5e-07"),
    (0.0, 5, "0"), (-0.0, 5, "0"), (float("inf"), 5, "inf"), (float("-inf"), 3, "-inf"),
    (-2.25, 2, "-2.2"), (np.float32(0.5), 4, "0.5"), (7, 5, "7")])
def test_num(x, digits, text):
    assert num(x, digits) == text


def test_missing_numbers_and_percentages():
    assert num(None) == "-" and num(float("nan")) == "-" and num(float("nan"), 4, missing="nan") == "nan"
    assert pct(-7.936507) == "-7.94%" and pct(10.0) == "+10.00%" and pct(0.0) == "0.00%"
    assert pct(float("nan")) == "-" and pct(None) == "-" and pct(float("nan"), missing="nan") == "nan"
    assert sci(1.92e9) == "1.920e+09" and sci(float("nan")) == "-" and sci(None) == "-"


def test_markdown_cells_and_table():
    assert cell(None) == "(missing)" and cell("a|b") == "a\\|b" and cell(1.0) == "1.0"
    assert cell_text(1.0) == "1" and cell_text(float("nan")) == "(missing)" and cell_text("a|b") == "a\\|b"
    assert table(["a", "b"], [["1", "2"], ["3", "4"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]
    assert table(["x"], []) == ["| x |", "|---|"]
