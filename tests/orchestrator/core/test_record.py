"""The sweep's record (orchestrator.core.record): what the parent run's params hold, written by the
sweep layer and read back by the report, round-trips for every shipped sweep file; the names are
the ones MLflow stores (pinned by hand, so a rename that would orphan old stores fails here)."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import record
from orchestrator.core.record import ParentTags, ReportSettings, SweepRecord, cast_param
from orchestrator.sweep.files import sweep_files
from orchestrator.sweep.mlflow_runs import sweep_record
from orchestrator.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]
SWEEPS = sweep_files(ROOT / "sweeps")


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_spec_to_params_to_settings_round_trips(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(path.relative_to(ROOT))
    rec = sweep_record(spec)
    params = rec.to_params()
    assert all(isinstance(v, str) for v in params.values())  # what MLflow stores
    assert SweepRecord.from_params(params) == rec
    settings = ReportSettings.from_params(params)
    assert settings == rec.report_settings()
    # the report's view agrees with the file on what is compared
    assert (settings.metric, settings.axis, settings.alpha, settings.mode) == \
        (spec.report.metric, spec.report.axis, spec.report.alpha, spec.report.mode)
    assert settings.baseline == spec.report.baseline or str(settings.baseline) == str(spec.report.baseline)
    assert bool(settings.search) == (spec.search is not None)


def test_the_default_sweep_records_these_params(monkeypatch):
    # written by hand from sweeps/default.yaml: 3 routers x 8 seeds, half a CPU each, 4 at a time
    monkeypatch.chdir(ROOT)
    spec = load_spec("sweeps/default.yaml")
    params = sweep_record(spec).to_params()
    assert params == {
        "sweep.n_trials": "24", "sweep.axes": "router,seed", "sweep.resources.cpu": "0.5",
        "sweep.resources.gpu": "0.0", "sweep.max_failures": "2", "sweep.max_concurrent": "4",
        "sweep.report.metric": "final/val_loss", "sweep.report.axis": "router", "sweep.report.baseline": "none",
        "sweep.report.explicit": "metric,axis,baseline", "sweep.fingerprint": spec.fingerprint(),
        "sweep.report.alpha": "0.05", "sweep.report.mode": "min"}
    s = ReportSettings.from_params(params)
    assert s.axes == ("router", "seed") and s.stated == frozenset({"metric", "axis", "baseline"}) and not s.search


def test_settings_of_an_older_parent_default_what_it_lacks():
    old = {"sweep.report.metric": "val/accuracy", "sweep.report.axis": "model.n_layers",
           "sweep.report.baseline": "12", "sweep.axes": "model.n_layers,train.seed"}
    s = ReportSettings.from_params(old)
    assert (s.baseline, s.axes, s.stated, s.alpha, s.mode, s.tune) == (12, ("n_layers", "seed"), None, 0.05, None, None)
    assert ReportSettings.from_params({"sweep.report.metric": "x/y"}) is None


def test_parent_tags_round_trip_and_keep_full_precision():
    t = ParentTags(wall_s=123.456789012345, slots=4, ray_start_s=1.5, launches=2, seeds="0,1,2",
                   n_trials="6", counts={"trials_finished": 5, "trials_failed": 1, "trials_unfinished": 0},
                   best={"best_trial_id": "router=full,seed=1", "best_run_id": "abc", "best_metric": "final/val_loss",
                         "best_value": "1.6356"})
    items = t.items()
    assert items["sweep/wall_s"] == "123.456789012345" and items["sweep/slots"] == "4.0"
    assert ParentTags.of(items) == t
    assert ParentTags.of({}) == ParentTags()


def test_cast_param_and_role():
    assert cast_param("12") == 12 and cast_param("0.05") == 0.05 and cast_param("None") is None
    assert cast_param("True") is True and cast_param("first-4") == "first-4" and cast_param(3) == 3
    assert record.role({"sweep_role": "Parent"}) == "parent" and record.role({"lime.role": "trial"}) == "trial"
    assert record.role({}) == ""


def test_names_are_what_mlflow_stores():
    # renaming any of these orphans every store written before: pinned by hand
    assert (record.SWEEP, record.ROLE, record.TRIAL_ID, record.STATUS, record.PARENT_RUN) == \
        ("sweep", "sweep_role", "trial_id", "status", "mlflow.parentRunId")
    assert (record.SWEEP_WALL, record.SLOTS, record.TRIAL_WALL) == ("sweep/wall_s", "sweep/slots", "trial/wall_s")
    assert record.REPORT == "sweep.report." and record.FINGERPRINT == "sweep.fingerprint"


def test_the_decide_sweep_records_its_margin_and_waves(monkeypatch):
    # written by hand from sweeps/default-decide.yaml: report.margin 0.5%, decide {max_seeds: 32, wave: 2}
    monkeypatch.chdir(ROOT)
    spec = load_spec("sweeps/default-decide.yaml")
    params = sweep_record(spec).to_params()
    assert params["sweep.report.margin"] == "0.5%"
    assert (params["sweep.decide.max_seeds"], params["sweep.decide.wave"]) == ("32", "2")
    s = ReportSettings.from_params(params)
    assert s.margin == "0.5%" and s.decide == record.DecideRecord(max_seeds=32, wave=2)
    waves = {**params, "sweep.decide.wave-2": "{}", "sweep.decide.wave-10": "{\"n\":{}}", "sweep.decide.wave-x": "?"}
    assert list(record.decide_waves(waves)) == [2, 10]
    assert ReportSettings.from_params({k: v for k, v in params.items() if "decide" not in k}).decide is None
    assert "sweep.decide.budget" not in params  # no budget: no param (as on parents before budgets)
    budgeted = record.DecideRecord(max_seeds=32, wave=2, budget="trials=60,core_hours=2.0")
    assert budgeted.to_params()["sweep.decide.budget"] == "trials=60,core_hours=2.0"
    assert record.DecideRecord.from_params(budgeted.to_params()) == budgeted
