"""Resume state has one source of truth, the MLflow record (orchestrator.core.record): a sweep
whose local state file is gone finds its parent run by fingerprint, and a trial whose run finished
is never trained again, even with its checkpoints and Ray folder deleted."""
from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.core import record
from orchestrator.core.tracking import client, experiment_id
from orchestrator.sweep.mlflow_runs import parent_run
from orchestrator.sweep.spec import load_spec
from tests.orchestrator.sweep.test_reuse import _env, _result, _sweep, _worker


def test_the_parent_is_found_in_the_record_when_the_local_state_is_gone(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spec = load_spec(_sweep(tmp_path, "rec"))
    cl = client(uri)
    exp = experiment_id(spec.name, cl)
    first = parent_run(spec, cl, exp, {})
    assert parent_run(spec, cl, exp, {}) == first  # no lime_sweep.json: the record's parent with this fingerprint
    assert parent_run(spec, cl, exp, {"parent_run_id": "gone"}) == first
    other = spec.with_seeds([0, 1, 2])  # other trials, another fingerprint: another sweep's parent
    assert parent_run(other, cl, exp, {}) != first
    runs = cl.search_runs([exp], f"tags.{record.ROLE} = '{record.PARENT}'")
    assert len(runs) == 2


def test_a_finished_trial_reports_its_recorded_result_without_its_checkpoints(tmp_path):
    d = tmp_path
    sweep = _sweep(d, "done")
    params = {"router": "full", "seed": 0}
    attempt = {"sweep": sweep, "params": params, "exp_dir": str(d / "ray")}
    env = _env(d, "store")
    (first,) = _result(_worker(d, [attempt], env))
    assert first["error"] is None
    final = [r for r in first["reports"] if r.get("status") == "finished"]
    assert len(final) == 1 and any(r.get("status") == "running" for r in first["reports"])
    shutil.rmtree(d / "ray")  # Ray's folder with every checkpoint: only the record is left
    (again,) = _result(_worker(d, [attempt], env))
    assert again["error"] is None
    assert [r["status"] for r in again["reports"]] == ["finished"]  # nothing trained
    assert again["reports"][0]["final/val_loss"] == final[0]["final/val_loss"]
    cl = client(env["MLFLOW_TRACKING_URI"])
    trial_runs = [r for r in cl.search_runs([cl.get_experiment_by_name("done").experiment_id])
                  if record.role(r.data.tags) == record.TRIAL]
    assert len(trial_runs) == 1  # the recorded run, not deleted and not duplicated
    assert Path(d / "ray").is_dir()
