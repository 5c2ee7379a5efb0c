"""How values and numbers are written in tables, labels and file names, in one place.

Two kinds of helpers:

- values of a key column (a router name, a depth, a seed), as they come back from MLflow or
  pandas: ``norm_value`` makes them plain Python values (NaN -> None, 12.0 -> 12), so 12 and
  12.0 are one group; ``same_value`` and ``order_key`` compare and sort them (numbers ascending,
  then strings, then missing);
- numbers in markdown: ``num`` (significant digits, large numbers in full, no ``-0``), ``pct``,
  ``sci``, and ``cell``/``cell_text``/``table`` for markdown table cells.

Every function is pure and deterministic: the same value always gives the same text, which is
what makes two reports of the same runs byte-identical.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

__all__ = ["norm_value", "same_value", "is_number", "order_key", "natural_key", "to_float", "slug",
           "num", "pct", "sci", "cell", "cell_text", "table"]


# ------------------------------------------------------------------------------ values

def norm_value(v: Any) -> Any:
    """Python scalars; NaN -> None; integral floats -> int (12.0 and 12 are one group)."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def same_value(a: Any, b: Any) -> bool:
    """Both present and written the same (MLflow params are strings: ``"12"`` is 12)."""
    a, b = norm_value(a), norm_value(b)
    return a is not None and b is not None and str(a) == str(b)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def order_key(v: Any, first: Any = None) -> tuple:
    """Numbers ascending, then strings (``first``, e.g. a baseline, before the others), then
    missing values."""
    v = norm_value(v)
    if v is None:
        return (2, 0.0, "")
    if is_number(v):
        return (0, float(v), "")
    return (1, 0 if first is not None and v == first else 1, str(v))


def natural_key(s: str) -> tuple:
    """``layer_2`` before ``layer_10``: digit runs compare as numbers."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s))


def to_float(v: Any) -> float:
    """A float, or NaN for None and anything that is not a number."""
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def slug(s: str) -> str:
    """A file-name-safe form of a label."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "x"


# ------------------------------------------------------------------------------ numbers

def num(x: Any, digits: int = 5, missing: str = "-") -> str:
    """``digits`` significant digits; numbers of more than ``digits`` integer digits in full
    (no exponent); 0 and -0.0 as ``0``; None and NaN as ``missing``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if abs(x) >= 10**digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def pct(x: float | None, missing: str = "-") -> str:
    """A signed percentage with two decimals (``+1.25%``; 0 as ``0.00%``)."""
    if x is None or math.isnan(x):
        return missing
    return "0.00%" if x == 0 else f"{x:+.2f}%"


def sci(x: float | None, missing: str = "-") -> str:
    """Scientific notation with four significant digits (FLOPs)."""
    return missing if x is None or math.isnan(x) else f"{x:.3e}"


# ------------------------------------------------------------------------------ markdown

def cell(v: Any) -> str:
    """A value as a markdown table cell, written as it is (``|`` escaped)."""
    return "(missing)" if v is None else str(v).replace("|", "\\|")


def cell_text(v: Any) -> str:
    """A key-column value as a cell: normalized first (12.0 -> ``12``, NaN -> ``(missing)``)."""
    return cell(norm_value(v))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table."""
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def human(n: float, unit: str = "") -> str:
    """A count with an SI suffix and three significant digits: ``human(8.1e12)`` -> ``8.1T``."""
    for div, suf in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suf}{unit}"
    return f"{n:.3g}{unit}"
