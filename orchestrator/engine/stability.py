"""The stability monitor of a trial (``StabilityHook``): loss and gradient-norm spikes.

A spike is a value that jumps above where its own recent past puts it. Over the trailing
``WINDOW`` finite values ``w`` of the same series, with ``d`` their successive differences,

    expected = median(w[-3:]) + 2 * median(d)        (the local level, carried on by the trend)
    z = (x - expected) / max(1.4826 * MAD(d), REL_FLOOR * |expected|),

and the value is a spike when z is at least ``Z_THRESHOLD``. Differences, not the window's own
spread: a loss still falling fast has a wide window but steady differences, and a spike judged
against the window's spread would hide there. Medians, not means, so that one earlier spike moves
neither the level nor the spread, and one-sided: a loss or gradient norm that drops is no
failure. The floor keeps a flat stretch (MAD 0) from turning a 1% wiggle or the curvature of a
falling loss into a spike. A value is checked once its series has ``MIN_POINTS`` earlier values:
a validation loss needs that many evaluations before the one checked (the default sweep's 4
evaluations in 200 steps leave it unchecked: evaluate more often to watch it), and
``stability/<series>_checked`` says how many values of each series were checked, so that "no
spike" and "not watched" differ.

The series watched are the trainer's own metrics: ``train/loss`` and ``train/grad_norm`` at every
log point (each the mean over the ``log_interval`` steps since the last one) and ``val/loss`` at
every evaluation, the final one included (the one the report reads: a flip at the last step is
what moved a verdict in issue 34). The final metrics of a finished trial carry the counts
(``stability/train_loss_spikes``, ``stability/grad_norm_spikes``, ``stability/val_loss_spikes``),
the values checked (``stability/train_loss_checked``, ...) and the largest z over all checked
points (``stability/max_z``); its MLflow run gets the tags ``stability`` (``spiky`` when any series
spiked, else ``stable``) and ``stability_steps`` (``train/loss@120,val/loss@200``: each spike's
series and step, the first ``MAX_LISTED``). A trial whose loss goes non-finite is ``diverged`` by
the trainer's own check, not here.

State across a resume: the monitor keeps nothing a checkpoint lacks. Its windows are rebuilt on
``on_start`` from the trial's metric history (which the checkpoint carries), so a resumed trial
ends with the counts of an uninterrupted one.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from orchestrator.engine.trainer import Hook, Trainer

WINDOW = 16  # trailing values a new one is judged against (log points, or evaluations for val/loss)
MIN_POINTS = 8  # earlier values a series needs before its values are checked (past the first fast fall)
Z_THRESHOLD = 6.0  # robust z at or above which a value is a spike (far beyond a normal series' noise)
# the spread's floor, relative to the expected level: a change of 1% is z <= 1 however smooth the
# series (a falling loss's curvature is no spike; the spikes of issue 34 were +25%)
REL_FLOOR = 0.01
MAD_TO_SD = 1.4826  # MAD of a normal sample -> its sd
MAX_LISTED = 100  # spikes named in the stability_steps tag (the counts have them all)

# series watched -> the name of its count among the final metrics
SERIES = {"train/loss": "stability/train_loss_spikes", "train/grad_norm": "stability/grad_norm_spikes",
          "val/loss": "stability/val_loss_spikes"}
MAX_Z = "stability/max_z"
TAG, STEPS_TAG = "stability", "stability_steps"
SPIKY, STABLE = "spiky", "stable"


def robust_z(x: float, window: list[float]) -> float:
    """The robust z of ``x`` against the trailing ``window`` (at least 3 values; see the module
    docstring); NaN for a shorter window or a zero spread."""
    if len(window) < 3:
        return math.nan
    diffs = [b - a for a, b in zip(window, window[1:])]
    slope = statistics.median(diffs)
    expected = statistics.median(window[-3:]) + 2 * slope
    mad = statistics.median(abs(d - slope) for d in diffs)
    spread = max(MAD_TO_SD * mad, REL_FLOOR * abs(expected))
    return (x - expected) / spread if spread > 0 else math.nan


@dataclass
class Spike:
    series: str
    step: int
    value: float
    z: float


@dataclass
class SpikeDetector:
    """The running state of the watched series: trailing windows, the spikes found, the largest z."""

    window: int = WINDOW
    min_points: int = MIN_POINTS
    threshold: float = Z_THRESHOLD
    recent: dict[str, deque] = field(default_factory=dict)
    spikes: list[Spike] = field(default_factory=list)
    max_z: float = math.nan
    checked: dict[str, int] = field(default_factory=dict)  # values checked per series

    def observe(self, series: str, step: int, value) -> Spike | None:
        """Check one value against its series' window, then add it; the spike, if it is one."""
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None  # a non-finite loss is the trainer's divergence, not a spike
        past = self.recent.setdefault(series, deque(maxlen=self.window))
        spike = None
        if len(past) >= self.min_points:
            z = robust_z(float(value), list(past))
            self.checked[series] = self.checked.get(series, 0) + 1
            if math.isfinite(z):
                self.max_z = z if math.isnan(self.max_z) else max(self.max_z, z)
                if z >= self.threshold:
                    spike = Spike(series, int(step), float(value), z)
                    self.spikes.append(spike)
        past.append(float(value))
        return spike

    def counts(self) -> dict[str, float]:
        out = {name: float(sum(s.series == series for s in self.spikes)) for series, name in SERIES.items()}
        out.update({name.replace("_spikes", "_checked"): float(self.checked.get(series, 0))
                    for series, name in SERIES.items()})
        out[MAX_Z] = self.max_z
        return out

    def tags(self) -> dict[str, str]:
        shown = [f"{s.series}@{s.step}" for s in self.spikes[:MAX_LISTED]]
        if len(self.spikes) > MAX_LISTED:  # an MLflow tag holds a few thousand characters
            shown.append(f"... {len(self.spikes) - MAX_LISTED} more")
        return {TAG: SPIKY if self.spikes else STABLE, STEPS_TAG: ",".join(shown)}


class StabilityHook(Hook):
    """Watches ``train/loss``, ``train/grad_norm`` and ``val/loss`` for spikes (module docstring).

    Validation losses are taken where they are computed (the hook wraps ``t.evaluate``, as a hook
    may wrap ``t.fwd``), so the final evaluation is checked before the final metrics are read;
    the training series come with every emitted metric dict."""

    def __init__(self, window: int = WINDOW, min_points: int = MIN_POINTS, threshold: float = Z_THRESHOLD):
        self.settings = (window, min_points, threshold)
        self.detector = SpikeDetector(*self.settings)

    def on_start(self, t: Trainer) -> None:
        self.detector = SpikeDetector(*self.settings)
        for h in t.history:  # a resumed trial: the windows as the interrupted run left them
            for series in SERIES:
                if series in h:
                    self.detector.observe(series, int(h["step"]), h[series])
        evaluate = t.evaluate

        def watched_evaluate(*args, **kwargs):
            out = evaluate(*args, **kwargs)
            self.detector.observe("val/loss", t.step, out.get("val/loss"))
            return out

        t.evaluate = watched_evaluate

    def on_log(self, t: Trainer, step: int, metrics: dict, checkpoint: str | None) -> None:
        for series in ("train/loss", "train/grad_norm"):  # val/loss: seen in evaluate
            if series in metrics:
                self.detector.observe(series, step, metrics[series])

    def final_metrics(self, t: Trainer) -> dict[str, float]:
        return self.detector.counts()

    def end_tags(self, t: Trainer) -> dict[str, str]:
        """The run's tags at the end (``MLflowHook`` sets them)."""
        return self.detector.tags()
