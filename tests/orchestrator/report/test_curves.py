"""The final metric as the mean of a trial's last k evaluations (``report.final_evals``)."""
import math

import numpy as np
import pandas as pd
import pytest

from lime_arch.errors import ConfigError
from orchestrator.core.record import ReportSettings, SweepRecord
from orchestrator.report.curves import apply_final_evals, history_key, last_k_mean
from orchestrator.report.settings import choose
from orchestrator.sweep.mlflow_runs import sweep_record
from orchestrator.sweep.spec import parse_spec


def test_history_key():
    assert history_key("final/val_loss") == "val/loss" and history_key("final/val_ppl") == "val/ppl"
    assert history_key("val/accuracy") is None and history_key("final/accuracy") is None


def test_last_k_mean_by_hand():
    steps = np.array([40.0, 20.0, 60.0, 80.0])  # unsorted: the last steps are 80, 60, 40
    vals = np.array([2.0, 3.0, 1.0, 1.6])
    assert last_k_mean(steps, vals, 1) == 1.6
    assert last_k_mean(steps, vals, 3) == pytest.approx((1.6 + 1.0 + 2.0) / 3)
    assert last_k_mean(steps, vals, 10) == pytest.approx(7.6 / 4)  # fewer than k: all of them
    assert math.isnan(last_k_mean(np.zeros(0), np.zeros(0), 3))


def _frame():
    frame = pd.DataFrame({"trial_id": ["a", "b", "c"], "run_id": ["ra", "rb", "rc"],
                          "final/val_loss": [1.9, 1.65, 1.7]})
    histories = {
        # a spikes at its last evaluation (step 200): 1.62, 1.64, then 1.90
        "ra": {"val/loss": (np.array([100.0, 150.0, 180.0, 200.0]), np.array([2.0, 1.62, 1.64, 1.9]))},
        "rb": {"val/loss": (np.array([200.0, 180.0]), np.array([1.65, 1.71]))},  # two evaluations only
        "rc": {},  # no curve
    }
    return frame, histories


def test_apply_final_evals_on_a_hand_made_history():
    frame, histories = _frame()
    notes = apply_final_evals(frame, histories, "final/val_loss", 3)
    assert frame["final/val_loss"].tolist() == pytest.approx([(1.62 + 1.64 + 1.9) / 3, (1.65 + 1.71) / 2, 1.7])
    assert notes[0].startswith("final/val_loss is the mean of each trial's last 3 evaluations of val/loss")
    assert notes[1] == "1 trial(s) had fewer than 3 evaluations (the mean of those they have): b"
    assert notes[2] == "1 trial(s) without a val/loss curve keep their last value: c"


def test_one_evaluation_is_the_last_value_and_other_metrics_are_left_alone():
    frame, histories = _frame()
    assert apply_final_evals(frame, histories, "final/val_loss", 1) == []
    assert frame["final/val_loss"].tolist() == [1.9, 1.65, 1.7]
    frame["val/accuracy"] = [0.5, 0.6, 0.7]
    notes = apply_final_evals(frame, histories, "val/accuracy", 3)
    assert frame["val/accuracy"].tolist() == [0.5, 0.6, 0.7] and "val/accuracy is the last value" in notes[0]


def _spec(report):
    return parse_spec({"name": "k", "description": "final_evals", "base": {"preset": "tiny"},
                       "grid": {"router": ["none", "full"], "seed": [0, 1]}, "report": report})


def test_final_evals_goes_from_the_file_to_the_report():
    rec = sweep_record(_spec({"final_evals": 3}))
    params = rec.to_params()
    assert params["sweep.report.final_evals"] == "3"
    assert SweepRecord.from_params(params) == rec
    settings = ReportSettings.from_params(params)
    assert settings.final_evals == 3 == rec.report_settings().final_evals
    assert choose(settings).final_evals == 3
    # not set: not recorded, and read back as 1 (the last evaluation), as a parent of an older sweep
    plain = sweep_record(_spec({})).to_params()
    assert "sweep.report.final_evals" not in plain and ReportSettings.from_params(plain).final_evals == 1


@pytest.mark.parametrize("value, message", [
    (0, "report.final_evals: must be an integer >= 1 (evaluations averaged), got 0"),
    (2.5, "report.final_evals: must be an integer >= 1 (evaluations averaged), got 2.5"),
])
def test_final_evals_must_be_a_positive_int(value, message):
    with pytest.raises(ConfigError) as e:
        _spec({"final_evals": value})
    assert str(e.value) == message


def test_a_bad_recorded_final_evals_is_one_line():
    params = sweep_record(_spec({})).to_params() | {"sweep.report.final_evals": "0"}
    with pytest.raises(ConfigError, match=r"^sweep.report.final_evals: must be an integer >= 1, got 0$"):
        ReportSettings.from_params(params)
