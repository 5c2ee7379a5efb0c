"""The record is the one store of a sweep's history (``orchestrator.sweep.history``): after a sweep
grown by ``--add-seeds`` and by waves, ``lime_sweep.json`` and Ray's whole folder are deleted, and a
rerun finds the same seeds and waves in the parent run's params and trains nothing again.

In-process, without Ray: the driver's own steps (``extend.prepare``, ``driver._open_tracking``,
``driver._tuner``, ``finish``) run for real; only Ray's Tuner is a stand-in, which "trains" each
trial of its experiment that has no finished run (as the trainable does: a trial whose run finished
reports its recorded result) and counts the Tuners made and the trials trained."""
from __future__ import annotations

import shutil
from collections import Counter
from types import SimpleNamespace

import pytest

from orchestrator.core import record, tracking
from orchestrator.core.record import trial_tags
from orchestrator.sweep import decide, driver, extend, history
from orchestrator.sweep.finish import finish
from orchestrator.sweep.local_state import STATE_FILE, read_state
from orchestrator.sweep.spec import parse_spec
from orchestrator.sweep.view import experiment_dir, status_text
from tests.orchestrator.sweep.test_decide import make_spec, value


class Ray:
    """Stand-in for ``driver._one_tuner``: a Tuner per Ray experiment; its fit trains the trials of
    the experiment that have no finished run."""

    def __init__(self):
        self.made: list[str] = []  # the Ray experiment folders a Tuner was made for
        self.trained: Counter = Counter()

    def __call__(self, spec, exp_dir, view, ctx):
        self.made.append(exp_dir.name)

        def fit():
            cl = tracking.client(ctx["uri"])
            exp_id = cl.get_experiment_by_name(spec.name).experiment_id
            done = history.done_trials(record.child_runs(cl, exp_id, ctx["parent_run_id"]))
            for t in spec.trials():
                if t.trial_id in done:
                    continue
                self.trained[t.trial_id] += 1
                tags = trial_tags(spec.name, t.trial_id, t.params,
                                  **{record.PARENT_RUN: ctx["parent_run_id"], record.STATUS: "finished"})
                rid = cl.create_run(exp_id, tags=tags).info.run_id
                cl.log_metric(rid, "final/val_loss", value(t.params["router"], t.params["seed"]))
                cl.set_terminated(rid, "FINISHED")
            return []

        return SimpleNamespace(fit=fit)


def run_sweep(spec, *, add_seeds=0, only=None, results=None, **_):
    """``driver.run_sweep`` without starting Ray: the same launch, tracking, tuner and finish."""
    launch = extend.prepare(spec, experiment_dir(spec.name, results), tracking.tracking_uri(), add_seeds, only)
    cl, _, _ = driver._open_tracking(launch)
    view = SimpleNamespace(total=0, final_status={})
    ctx = {"uri": launch.uri, "parent_run_id": launch.parent, "exp_dir": str(launch.exp_dir)}
    done = frozenset(history.done_trials(record.child_runs(cl, launch.exp_id, launch.parent)))  # as _run
    grid = driver._tuner(launch, view, ctx, done).fit()
    summary = finish(launch, cl, grid, elapsed=0.0, metric="final/val_loss", mode="min", final_status={})
    return {**summary, "launch": launch}


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(decide, "run_sweep", run_sweep)
    return tmp_path


def _parts(launch) -> list[tuple]:
    return [(p.name, p.seeds, p.values) for p in launch.parts]


def test_a_rerun_without_the_cache_and_ray_folder_resumes_from_the_record(env, monkeypatch):
    ray = Ray()
    monkeypatch.setattr(driver, "_one_tuner", ray)
    plain = make_spec(env)  # seeds 0-5, no decide block: the same trials (fingerprint) as the waved sweep
    assert run_sweep(plain)["ok"]
    assert run_sweep(plain, add_seeds=1)["ok"]  # --add-seeds 1: extend-1 runs seed 6 for every router
    out = decide.run_until_decided(decide.with_options(make_spec(env), True, "12", None))
    assert out["ok"] and out["waves"][-1].done
    before = out["launch"]
    assert [(n, v) for n, _, v in _parts(before)][:2] == [("", None), ("extend-1", None)]
    assert len(before.parts) > 2 and before.parts[-1].values is not None  # waves: restricted experiments
    assert set(ray.trained.values()) == {1}  # every trial trained once
    runs = {r.info.run_id for r in record.child_runs(tracking.client(), before.exp_id, before.parent)}
    params = tracking.client().get_run(before.parent).data.params
    looks = record.decide_waves(params)

    exp_dir = experiment_dir("dec")
    assert (exp_dir / STATE_FILE).is_file()
    shutil.rmtree(exp_dir)  # the cache and Ray's folder: only the MLflow record is left
    ray.made.clear()
    again = decide.run_until_decided(decide.with_options(make_spec(env), True, "12", None))
    after = again["launch"]
    assert again["ok"] and after.parent == before.parent
    assert after.spec.grid["seed"] == before.spec.grid["seed"] and _parts(after) == _parts(before)
    assert after.spec.trial_ids() == before.spec.trial_ids()
    assert ray.made == [] and set(ray.trained.values()) == {1}  # no experiment restored, nothing trained
    assert {r.info.run_id for r in record.child_runs(tracking.client(), after.exp_id, after.parent)} == runs
    assert record.decide_waves(tracking.client().get_run(after.parent).data.params) == looks  # no new look
    assert again["waves"][-1].done and again["unfinished"] == 0
    cached = read_state(exp_dir)  # the cache is written again from the record
    assert cached["extensions"] == before.extensions and cached["parent_run_id"] == before.parent
    assert "grown: extend-1: seeds 6;" in status_text("dec")


def test_the_record_is_read_only_for_the_sweeps_trials(env, monkeypatch):
    monkeypatch.setattr(driver, "_one_tuner", Ray())
    plain = make_spec(env)
    run_sweep(plain)
    run_sweep(plain, add_seeds=2)
    uri = tracking.tracking_uri()
    state = history.from_record(plain, uri)
    assert state["base_seeds"] == [0, 1, 2, 3, 4, 5] and state["seeds"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert state["extensions"] == [{"name": "extend-1", "seeds": [6, 7]}]
    cached = read_state(experiment_dir("dec"))
    assert {k: state[k] for k in ("base_seeds", "base_fingerprint", "extensions", "parent_run_id")} == \
        {k: cached[k] for k in ("base_seeds", "base_fingerprint", "extensions", "parent_run_id")}
    # more seeds in the file are the same sweep; other trials (more steps) are another sweep's
    assert history.from_record(make_spec(env, seeds=9), uri)["parent_run_id"] == state["parent_run_id"]
    longer = parse_spec({"name": "dec", "description": "decide test",
                         "base": {"preset": "tiny", "train": {"steps": 20, "batch_size": 4, "seq_len": 32}},
                         "grid": {"router": ["none", "full", "first-4"], "seed": list(range(6))},
                         "report": {"metric": "final/val_loss", "axis": "router", "baseline": "none"}})
    assert history.from_record(longer, uri) == {}
    assert history.from_record(plain, f"sqlite:///{env / 'none.db'}") == {}
    assert not (env / "none.db").exists()  # looked up, not created
