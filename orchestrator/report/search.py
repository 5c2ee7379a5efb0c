"""Search sweeps in the report: the searched configurations are what is compared.

An Optuna search samples configurations (a value of every searched key) and runs each with the
same seeds, so the question a search report answers is which configuration wins, and by how much
over its seeds, not how one searched key's 17-digit values compare as categories. So, unless the
sweep file names a ``report.axis`` (or ``--axis`` is given):

- the compared axis is ``configuration``: one label per sampled configuration,
  ``sample 3: lr=0.006466, router=full`` (the sample number from the trial id, numbers to 4
  significant digits), and the searched keys are part of it, not blocks or factors of their own;
- the baseline is the best configuration by its mean metric over the finished seeds (the
  direction of the search), so every other configuration gets a verdict against the winner;
- a "Search" section names the winner (with its exact values, to reproduce it) and ranks every
  configuration with its searched values as numbers; ``search.png`` draws the metric against
  each numeric searched key (a log axis when the values span a factor of 10 or more).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.style  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from orchestrator.core.fmt import is_number, norm_value, num, table  # noqa: E402
from orchestrator.core.status import TrialStatus  # noqa: E402

CONFIG = "configuration"
_SAMPLE = re.compile(r"^sample=(\d+)(?:,|$)")


def value_text(v) -> str:
    """A searched value as the report writes it: numbers to 4 significant digits."""
    v = norm_value(v)
    return num(v, 4) if is_number(v) else str(v)


def add_configurations(df: pd.DataFrame, keys: Sequence[str]) -> None:
    """The ``configuration`` column: the sample number and the searched values of each trial."""
    samples = [_sample(t) for t in df["trial_id"]]
    width = len(str(max((s for s in samples if s is not None), default=0)))
    labels = []
    for s, (_, row) in zip(samples, df.iterrows()):
        values = ", ".join(f"{k}={value_text(row[k])}" for k in keys if k in df.columns)
        labels.append(f"sample {s:0{width}d}: {values}" if s is not None else values or "(no values)")
    df[CONFIG] = pd.Series(labels, dtype=object, index=df.index)


def _sample(trial_id) -> int | None:
    m = _SAMPLE.match(str(trial_id))
    return int(m.group(1)) if m else None


def ranking(df: pd.DataFrame, metric: str, mode: str) -> list[tuple[str, float, float, int]]:
    """(configuration, mean, std, finished seeds), best first, over the finished trials with a
    finite metric (ties broken by the label)."""
    fin = df[(df["status"] == TrialStatus.FINISHED) & df[metric].map(lambda v: is_number(v) and math.isfinite(v))]
    out = []
    for label, part in fin.groupby(CONFIG, sort=True):
        vals = part[metric].astype(float).to_numpy()
        out.append((str(label), float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
                    len(vals)))
    sign = 1.0 if mode == "min" else -1.0
    return sorted(out, key=lambda r: (sign * r[1], r[0]))


def best(df: pd.DataFrame, metric: str, mode: str) -> str | None:
    ranked = ranking(df, metric, mode)
    return ranked[0][0] if ranked else None


def section(df: pd.DataFrame, keys: Sequence[str], metric: str, mode: str) -> list[str]:
    """The "Search" section: the winner in words, then every configuration ranked."""
    ranked = ranking(df, metric, mode)
    lines = ["", "## Search", ""]
    if not ranked:
        return lines + ["No configuration finished with a finite metric: there is no winner."]
    label, mean, std, n = ranked[0]
    row = df[df[CONFIG] == label].iloc[0]
    exact = ", ".join(f"{k}={norm_value(row[k])!r}" if isinstance(norm_value(row[k]), str)
                      else f"{k}={norm_value(row[k])}" for k in keys if k in df.columns)
    spread = f" ± {num(std, 4)}" if not math.isnan(std) else ""
    lines.append(f"**Best configuration: {label}**: `{metric}` {num(mean, 5)}{spread} (mean ± std over {n} "
                 f"finished seed(s); {'lower' if mode == 'min' else 'higher'} is better). Exact values, to "
                 f"reproduce it: `{exact}`. The verdicts below compare every other configuration with it.")
    lines.append("")
    body = []
    for rank, (lab, m, s, k) in enumerate(ranked, 1):
        r = df[df[CONFIG] == lab].iloc[0]
        body.append([str(rank), lab.split(":")[0], *[value_text(r[c]) for c in keys if c in df.columns],
                     str(k), num(m, 5), num(s, 4)])
    head = ["rank", "sample", *[c for c in keys if c in df.columns], "seeds", f"mean {metric}", "std"]
    return lines + table(head, body)


def plot(df: pd.DataFrame, keys: Sequence[str], metric: str, path: Path, title: str) -> bool:
    """The metric of every finished trial against each numeric searched key (a point per seed,
    the configuration's mean as a cross); False when no key is numeric."""
    fin = df[df["status"] == TrialStatus.FINISHED]
    numeric = [k for k in keys if k in fin.columns and len(fin) and all(is_number(norm_value(v)) for v in fin[k])]
    if not numeric:
        return False
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(4.2 * len(numeric) + 0.6, 3.8))
        for i, key in enumerate(numeric):
            ax = fig.add_subplot(1, len(numeric), i + 1)
            x = fin[key].astype(float).to_numpy()
            y = fin[metric].astype(float).to_numpy()
            ax.scatter(x, y, s=18, color="#1f77b4", alpha=0.7, label="trial (one seed)")
            means = fin.groupby(CONFIG, sort=True).agg({key: "first", metric: "mean"})
            ax.scatter(means[key].astype(float), means[metric].astype(float), marker="x", s=50, color="#d62728",
                       label="configuration mean")
            if np.all(x > 0) and x.max() >= 10 * x.min():
                ax.set_xscale("log")
            else:
                ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.tick_params(axis="x", labelrotation=30, labelsize=8)
            ax.set_xlabel(key)
            ax.set_ylabel(metric)
            ax.grid(True, alpha=0.3)
            if i == 0:
                ax.legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
    return True
