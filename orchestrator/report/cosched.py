"""Were a sweep's step times measured alone? Trials that run at the same time on one host share its
cores and memory bandwidth, so their ``perf/step_time_ms`` measures the contention as much as the
model (issue 35: in the committed field sweep four trials shared two cores, and two variants looked
21-22% faster than the baseline). A report labels its step times **co-scheduled** where that happened;
overhead is measured by ``lime bench`` (interleaved, paired rounds in one process), never by this.

A trial is co-scheduled when its MLflow run (start to end) overlapped another trial's run of the
same sweep on the same host: the ``ray_node_id`` tag, else ``host`` (``orchestrator.sweep.trainable``);
runs without either are taken as one host, and the report says so. Every trial counts as an
occupant (a failed one used the cores too); the label is of the finished trials, whose step times
the tables show.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from orchestrator.core.fmt import norm_value, to_float
from orchestrator.report.render.figures import finished

HOST_TAGS = ("tags.ray_node_id", "tags.host")


@dataclass(frozen=True)
class CoScheduled:
    trials: int  # finished trials with a start and an end
    shared: int  # of them, ran while another trial of the sweep ran on the same host
    most: int  # the most trials running at once on one host, over the finished trials' runs
    hosts_known: bool  # every trial carries a host tag
    by_variant: dict[str, float] = field(default_factory=dict)  # axis value as text -> share co-scheduled

    @property
    def any(self) -> bool:
        return self.shared > 0


def _host(r: pd.Series) -> str | None:
    for tag in HOST_TAGS:
        v = r.get(tag)
        if isinstance(v, str) and v:
            return v
    return None


def most_at_once(own: tuple[float, float], others: list[tuple[float, float]]) -> int:
    """The most runs at once during ``own`` (itself included); runs that only touch do not overlap."""
    s0, e0 = own
    events = [(s0, 1), (e0, -1)]
    for s, e in others:
        if s < e0 and s0 < e:
            events += [(max(s, s0), 1), (min(e, e0), -1)]
    best = now = 0
    for _, step in sorted(events, key=lambda t: (t[0], t[1])):  # an end before a start at the same time
        now += step
        best = max(best, now)
    return best


def find(df: pd.DataFrame, axis: str) -> CoScheduled | None:
    """The co-scheduling of a sweep's trials; None when its runs have no start and end times."""
    if "start_ms" not in df.columns or "end_ms" not in df.columns:
        return None
    spans = {i: (to_float(r["start_ms"]), to_float(r["end_ms"])) for i, r in df.iterrows()}
    spans = {i: se for i, se in spans.items() if math.isfinite(se[0]) and math.isfinite(se[1]) and se[1] > se[0]}
    hosts = {i: _host(df.loc[i]) for i in spans}
    fin = [i for i in finished(df).index if i in spans]
    if not fin:
        return None
    at_once = {i: most_at_once(spans[i], [spans[j] for j in spans if j != i and hosts[j] == hosts[i]]) for i in fin}
    per: dict[str, list[bool]] = {}
    for i in fin:
        per.setdefault(str(norm_value(df.loc[i, axis])) if axis in df.columns else "", []).append(at_once[i] > 1)
    return CoScheduled(len(fin), sum(at_once[i] > 1 for i in fin), max(at_once.values()),
                       all(h is not None for h in hosts.values()),
                       {k: sum(v) / len(v) for k, v in per.items()})


def text(c: CoScheduled | None) -> str:
    """The sentence that labels the step times ("" when the runs have no times)."""
    if c is None:
        return ""
    if not c.any:
        return (f"Step times were measured one trial at a time per host (none of the {c.trials} finished trials ran "
                "beside another trial of the sweep): not co-scheduled.")
    hosts = "" if c.hosts_known else "; the runs carry no host tag, so they are taken as one host"
    return (f"**Step times are co-scheduled**: {c.shared} of {c.trials} finished trials ran while other trials of this "
            f"sweep ran on the same host (up to {c.most} at once{hosts}), sharing its cores and memory bandwidth, so "
            "the step columns measure that contention as much as each variant's cost: they are not overhead "
            "measurements (`lime bench` measures overhead in interleaved, paired rounds in one process).")


def add_column(rows: list[dict], c: CoScheduled | None) -> None:
    """summary.csv's ``step_time_co_scheduled``: the share of a variant's finished trials that were (in place)."""
    for row in rows:
        row["step_time_co_scheduled"] = math.nan if c is None else c.by_variant.get(str(norm_value(row["variant"])),
                                                                                    math.nan)
