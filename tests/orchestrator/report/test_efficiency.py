"""The compute section's sweep efficiency (sweep wall / (sum of trial wall / slots)) and start-up
breakdown, on hand-made frames, and in a report built from MLflow."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from orchestrator.core import tracking
from orchestrator.report import efficiency
from orchestrator.report.build import build_report
from tests.orchestrator.report.test_report import T0, add_trial, log_sweep_params

NAN = float("nan")


def frame(**cols) -> pd.DataFrame:
    return pd.DataFrame(cols)


def test_the_ratio_is_the_sweep_wall_over_the_ideal_packing_of_the_trial_walls():
    # trial walls 60 + 60 + 30 + 30 = 180 s (the running trial has none) at 4 slots: ideal 45 s
    df = frame(wall_time_s=[60.0, 60.0, 30.0, 30.0, NAN])
    eff = efficiency.efficiency(df, {"sweep/wall_s": 54.0, "sweep/slots": 4.0, "sweep/launches": 1.0,
                                     "sweep/ray_start_s": 6.5})
    assert (eff.trial_wall_s, eff.trials, eff.slots, eff.launches) == (180.0, 4, 4, 1)
    assert eff.ideal_s == 45.0 and eff.ratio == pytest.approx(1.2)
    text = "\n".join(efficiency.lines(df, {"sweep/wall_s": 54.0, "sweep/slots": 4.0, "sweep/ray_start_s": 6.5}))
    assert "54.0 s of sweep wall time" in text and "180.0 s of trial wall time (4 trials" in text
    assert "at 4 concurrent slots: the ideal is 45.0 s" in text and "= **1.20**" in text
    assert "Ray's start (6.5 s) not included" in text and "1 launch" in text
    one = efficiency.efficiency(frame(wall_time_s=[10.0, 20.0]), {"sweep/wall_s": 36.0, "sweep/slots": 1.0,
                                                                  "sweep/launches": 3.0})
    assert one.ratio == pytest.approx(1.2) and math.isnan(one.ray_start_s)
    assert "3 launches; a resumed sweep's numbers are approximate" in "\n".join(
        efficiency.lines(frame(wall_time_s=[10.0, 20.0]), {"sweep/wall_s": 36.0, "sweep/slots": 1.0,
                                                          "sweep/launches": 3.0}))


def test_no_ratio_without_the_parent_numbers_or_trial_walls():
    df = frame(wall_time_s=[60.0, 30.0])
    assert efficiency.efficiency(df, {}) is None
    assert efficiency.efficiency(df, {"sweep/wall_s": 50.0}) is None  # no slots
    assert efficiency.efficiency(frame(wall_time_s=[NAN]), {"sweep/wall_s": 50.0, "sweep/slots": 2.0}) is None
    assert efficiency.lines(df, {}) == []  # a sweep from before these metrics: the report is unchanged


def test_the_start_up_table_has_the_median_max_and_total_of_each_phase_the_trials_logged():
    df = frame(**{"wall_time_s": [60.0, 60.0, 30.0, 30.0],
                  "startup/process_s": [5.0, 0.0, 0.0, 7.0],
                  "startup/import_s": [3.0, 0.0, 0.0, 4.0],
                  "startup/data_s": [0.5, 0.25, NAN, 0.5],  # a trial without the metric is left out
                  "startup/to_first_step_s": [6.0, 1.0, 2.0, 9.0],
                  "startup/worker_trial": [1.0, 2.0, 3.0, 1.0],
                  "trial/wall_s": [70.0, 61.0, 31.0, 40.0]})
    rows = {r[0]: r for r in efficiency.startup_rows(df)}
    assert list(rows) == ["process", "import", "data", "to_first_step", "trial wall"]  # in phase order
    assert rows["process"][2:] == ["4", "2.5", "7", "12"]
    assert rows["import"][2:] == ["4", "1.5", "4", "7"]
    assert rows["data"][2:] == ["3", "0.5", "0.5", "1.25"]
    assert rows["to_first_step"][2:] == ["4", "4", "9", "18"]
    assert rows["trial wall"][2:] == ["4", "50.5", "70", "202"]
    text = "\n".join(efficiency.lines(df, {}))
    assert "2 of 4 trials ran in a worker process that had run a trial before" in text
    assert "| phase | what | trials | median | max | total |" in text and "Sweep efficiency" not in text


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    return tmp_path, tracking.client()


def test_the_report_shows_the_ratio_from_the_parent_run_and_the_trials(store):
    root, cl = store
    name = "efficiency-test"
    exp = tracking.experiment_id(name, cl)
    parent = cl.create_run(exp, start_time=T0, tags={"sweep": name, "sweep_role": "parent"}).info.run_id
    log_sweep_params(cl, parent, axes="router,seed", axis="router", baseline="none", n_trials=4)
    for i, (router, seed) in enumerate([("none", 0), ("none", 1), ("full", 0), ("full", 1)]):
        rid = add_trial(cl, exp, parent, name, router, seed, final=3.0 - 0.1 * i, status="finished",
                        start=T0 + 1000 * i)  # each run lasts 60 s
        cl.log_metric(rid, "startup/to_first_step_s", 2.0 + i, step=10)
        cl.log_metric(rid, "startup/worker_trial", 1.0 + (i >= 2), step=10)
    for launch, wall in ((1, 50.0), (2, 96.0)):  # the driver logs the sum over launches
        cl.set_tag(parent, "sweep/wall_s", str(wall))  # as the driver does: tags, the latest launch's
        cl.set_tag(parent, "sweep/launches", str(launch))
    cl.set_tag(parent, "sweep/slots", "2.0")
    md = build_report(name, out=root / "out").read_text()
    compute = md.split("## Compute", 1)[1].split("## ", 1)[0]
    # 4 runs of 60 s at 2 slots: ideal 120 s; the last launch's sum, 96 s: 0.8
    assert "96.0 s of sweep wall time" in compute and "2 launches" in compute
    assert "240.0 s of trial wall time (4 trials" in compute and "= **0.80**" in compute
    assert "| to_first_step |" in compute and "2 of 4 trials ran in a worker process" in compute
    assert "above the ideal" not in compute  # 0.80: nothing above it


def test_the_start_up_share_of_the_time_above_the_ideal():
    df = frame(wall_time_s=[60.0, 60.0], **{"startup/to_first_step_s": [6.0, 2.0]})
    text = "\n".join(efficiency.lines(df, {"sweep/wall_s": 70.0, "sweep/slots": 2.0}))
    assert "= **1.17**" in text  # 70 / (120 / 2)
    assert "Of the 10.0 s above the ideal, the trials' start-up (sum of to_first_step / slots, below) accounts " \
           "for about 4.0 s." in text
