"""Growing a sweep's seed axis (``orchestrator.sweep.extend``): which launches continue a sweep,
which Ray experiments they run, what the state remembers, and end to end with Ray: only the new
trials run, under the one parent run, and the report covers every seed."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.sweep import extend
from orchestrator.sweep.local_state import STATE_FILE, extension_dirs, read_state, write_state
from orchestrator.sweep.spec import load_spec, parse_spec
from orchestrator.sweep.view import ray_trials
from tests.sweeps import sweep_env

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
URI = "sqlite:////nowhere/mlflow.db"
BASE = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
        "data": {"source": "builtin"}, "optim": {"lr": 3.0e-3, "min_lr": 3.0e-4, "warmup_steps": 2},
        "train": {"steps": 10, "batch_size": 4, "seq_len": 32, "log_interval": 5, "eval_interval": 10,
                  "eval_batches": 2}}


def _spec(seeds, steps: int = 10, **grid):
    base = json.loads(json.dumps(BASE))
    base["train"]["steps"] = steps
    return parse_spec({"name": "g", "description": "growing", "base": base,
                       "grid": {**(grid or {"router": ["none", "full"]}), "seed": list(seeds)}})


def _launched(exp_dir: Path, spec) -> None:
    """The state a first launch of ``spec`` leaves (the driver's keys only, as before seed growth)."""
    write_state(exp_dir, {"name": spec.name, "fingerprint": spec.fingerprint(), "parent_run_id": "p1",
                          "tracking_uri": URI, "launches": 1})


def test_a_first_launch_is_one_experiment_and_records_nothing(tmp_path):
    p = extend.plan(_spec([0, 1]), tmp_path, URI)
    assert [(x.name, x.seeds, x.dir) for x in p.parts] == [("", [0, 1], tmp_path)]
    assert p.record is None and p.message is None and p.added == [] and p.spec.n_trials() == 4
    p = extend.plan(_spec([0, 1]), tmp_path, URI, add_seeds=2)
    assert p.spec.grid["seed"] == [0, 1, 2, 3] and p.added == [2, 3] and len(p.parts) == 1
    assert p.record == {"seeds": [0, 1, 2, 3], "base_seeds": [0, 1, 2, 3], "extensions": [],
                        "base_fingerprint": _spec([0, 1, 2, 3]).fingerprint()}
    assert "seeds 2, 3 added to the file's 0, 1: 8 trials" in p.message and "does not rewrite" in p.message
    assert not (tmp_path / STATE_FILE).exists()  # planning writes nothing


def test_more_seeds_in_the_file_are_one_more_experiment(tmp_path):
    _launched(tmp_path, _spec([0, 1, 2, 3]))
    same = extend.plan(_spec([0, 1, 2, 3]), tmp_path, URI)
    assert len(same.parts) == 1 and same.added == [] and same.message is None  # a plain resume
    p = extend.plan(_spec([0, 1, 2, 3, 4, 5]), tmp_path, URI)
    assert [(x.name, x.seeds) for x in p.parts] == [("", [0, 1, 2, 3]), ("extend-1", [4, 5])]
    assert p.parts[1].dir == tmp_path / "extend-1" and p.parts[1].spec.n_trials() == 4
    assert [t.trial_id for t in p.parts[1].spec.trials()] == ["router=none,seed=4", "router=none,seed=5",
                                                               "router=full,seed=4", "router=full,seed=5"]
    assert p.spec.n_trials() == 12 and p.added == [4, 5]
    assert p.record["base_seeds"] == [0, 1, 2, 3] and p.record["seeds"] == [0, 1, 2, 3, 4, 5]
    assert p.record["base_fingerprint"] == _spec([0, 1, 2, 3]).fingerprint()
    assert p.message.startswith("seeds 4, 5 added: 4 new trials in Ray experiment ")
    # once a launch of this version recorded the seeds, new ones may come anywhere in the list
    extend.prepare(_spec([0, 1, 2, 3]), tmp_path, URI)
    q = extend.plan(_spec([9, 0, 1, 2, 3]), tmp_path, URI)
    assert [(x.name, x.seeds) for x in q.parts] == [("", [0, 1, 2, 3]), ("extend-1", [9])]


def test_add_seeds_appends_after_the_largest_seed_in_effect(tmp_path):
    _launched(tmp_path, _spec([0, 1, 2, 3]))
    launch = extend.prepare(_spec([0, 1, 2, 3]), tmp_path, URI, add_seeds=2)
    spec, state, line = launch.spec, launch.state, launch.message
    assert spec.grid["seed"] == [0, 1, 2, 3, 4, 5] and state["parent_run_id"] == "p1"
    assert "seeds 4, 5 added" in line and "does not rewrite" in line and STATE_FILE in line
    saved = read_state(tmp_path)
    assert saved["extensions"] == [{"name": "extend-1", "seeds": [4, 5]}] and saved["seeds"] == [0, 1, 2, 3, 4, 5]
    assert saved["parent_run_id"] == "p1" and saved["fingerprint"] == _spec([0, 1, 2, 3]).fingerprint()  # kept
    # the file still lists 0-3: the sweep in effect keeps 4 and 5, and says so
    p = extend.plan(_spec([0, 1, 2, 3]), tmp_path, URI)
    assert p.spec.grid["seed"] == [0, 1, 2, 3, 4, 5] and p.added == [] and len(p.parts) == 2
    assert p.message.startswith("seeds in effect: 0, 1, 2, 3, 4, 5 (4, 5 added earlier and not in the file")
    # a second growth: after the largest seed in effect or in the file
    p = extend.plan(_spec([0, 1, 2, 3, 7]), tmp_path, URI, add_seeds=1)
    assert [(x.name, x.seeds) for x in p.parts] == [("", [0, 1, 2, 3]), ("extend-1", [4, 5]), ("extend-2", [7, 8])]
    # an unchanged relaunch after the growth: the same experiments, nothing new, nothing rewritten
    before = (tmp_path / STATE_FILE).read_text()
    spec = extend.prepare(_spec([0, 1, 2, 3, 4, 5]), tmp_path, URI).spec
    assert spec.grid["seed"] == [0, 1, 2, 3, 4, 5] and (tmp_path / STATE_FILE).read_text() == before


@pytest.mark.parametrize("file, add, expect", [
    (_spec([0, 1, 2, 3], steps=20), 0, "the sweep's trials changed since"),
    (_spec([0, 1, 2, 3, 4], steps=20), 0, "the sweep's trials changed since"),
    (_spec([0, 1, 2, 3], router=["none", "first-2"]), 0, "the sweep's trials changed since"),
    (_spec([0, 1, 3]), 0, "grid.seed: seed 2 ran in this sweep"),
    (_spec([1, 2, 3, 4]), 0, "grid.seed: seed 0 ran in this sweep"),
])
def test_any_other_change_is_refused(tmp_path, file, add, expect):
    _launched(tmp_path, _spec([0, 1, 2, 3]))
    extend.prepare(_spec([0, 1, 2, 3]), tmp_path, URI)  # a relaunch by this version records the seeds
    before = (tmp_path / STATE_FILE).read_text()
    with pytest.raises(ConfigError, match=expect):
        extend.prepare(file, tmp_path, URI, add)
    assert (tmp_path / STATE_FILE).read_text() == before  # nothing recorded


def test_another_store_and_bad_add_seeds_are_refused(tmp_path):
    _launched(tmp_path, _spec([0, 1]))
    with pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI: .* was started with the MLflow store "):
        extend.plan(_spec([0, 1]), tmp_path, "sqlite:////elsewhere.db")
    search = parse_spec({"name": "s", "description": "d", "base": BASE,
                         "search": {"space": {"lr": {"uniform": [1e-3, 1e-2]}}}})
    with pytest.raises(ConfigError, match=r"^--add-seeds: s is a search sweep; only a grid sweep's seed axis"):
        extend.plan(search, tmp_path / "s", URI, add_seeds=2)
    no_seeds = parse_spec({"name": "n", "description": "d", "base": BASE, "grid": {"router": ["none"]}})
    with pytest.raises(ConfigError, match=r"^--add-seeds: n has no seed axis \(grid.seed\)"):
        extend.plan(no_seeds, tmp_path / "n", URI, add_seeds=1)


def test_ray_trials_and_finished_parts_read_every_experiment(tmp_path):
    def saved(d: Path, trials: dict[str, str]) -> None:
        d.mkdir(parents=True, exist_ok=True)
        data = [[json.dumps({"custom_trial_name": n, "status": s}), "{}"] for n, s in trials.items()]
        (d / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": data}))

    _launched(tmp_path, _spec([0]))
    extend.prepare(_spec([0, 1]), tmp_path, URI)
    saved(tmp_path, {"router=none,seed=0": "TERMINATED", "router=full,seed=0": "TERMINATED"})
    saved(tmp_path / "extend-1", {"router=none,seed=1": "TERMINATED", "router=full,seed=1": "RUNNING"})
    assert ray_trials(tmp_path) == {"router=none,seed=0": "TERMINATED", "router=full,seed=0": "TERMINATED",
                                    "router=none,seed=1": "TERMINATED", "router=full,seed=1": "RUNNING"}
    assert len(ray_trials(tmp_path, extensions=False)) == 2
    parts = extend.plan(_spec([0, 1]), tmp_path, URI).parts
    assert [extend.finished(p) for p in parts] == [True, False]

    class View:
        final_status: dict = {}

    made = []

    def make(spec, exp_dir, view, ctx):
        made.append((exp_dir, ctx["exp_dir"], view.total, [t.trial_id for t in spec.trials()]))

        class Tuner:
            def fit(self):
                view.final_status = {"router=full,seed=1": "TERMINATED"}
                return ["result"]

        return Tuner()

    out = extend.Sequence(parts, View(), {"uri": URI, "exp_dir": str(tmp_path)}, make).fit()
    assert out == ["result"]  # the finished first experiment is not restored
    assert made == [(tmp_path / "extend-1", str(tmp_path / "extend-1"), 2,
                     ["router=none,seed=1", "router=full,seed=1"])]


def test_a_state_from_before_seed_growth_is_read_by_its_fingerprint(tmp_path):
    old = _spec([3, 5])
    (tmp_path / STATE_FILE).write_text(json.dumps({"name": "g", "fingerprint": old.fingerprint(),
                                                   "parent_run_id": "p0", "tracking_uri": URI, "launches": 3}))
    p = extend.plan(_spec([3, 5, 8]), tmp_path, URI)
    assert [(x.name, x.seeds) for x in p.parts] == [("", [3, 5]), ("extend-1", [8])]
    with pytest.raises(ConfigError, match="the sweep's trials changed"):
        extend.plan(_spec([8, 3, 5]), tmp_path, URI)  # not the first seeds of the file, and no Ray trials
    # with Ray's saved trials, the seeds that ran are known wherever they are in the file
    data = [[json.dumps({"custom_trial_name": f"router={r},seed={s}", "status": "TERMINATED"}), "{}"]
            for r in ("none", "full") for s in (3, 5)]
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": data}))
    p = extend.plan(_spec([8, 3, 5]), tmp_path, URI)
    assert [(x.name, x.seeds) for x in p.parts] == [("", [3, 5]), ("extend-1", [8])]


# -- end to end, with Ray --------------------------------------------------------------------------------
def _runs(uri: str, name: str):
    from mlflow.tracking import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    runs = cl.search_runs([cl.get_experiment_by_name(name).experiment_id], max_results=1000)
    return ([r for r in runs if r.data.tags.get("sweep_role") == "parent"],
            [r for r in runs if r.data.tags.get("sweep_role") == "trial"])


def _trainings(log: Path) -> int:
    text = log.read_text() if log.is_file() else ""
    return text.count("\nstarting;") + text.count("\nresuming from step ")


@pytest.mark.slow
def test_growing_the_seeds_runs_only_the_new_trials_under_one_parent(tmp_path):
    """Named variants x 4 seeds; then `--add-seeds 2` (one new trial crashes once and, with no
    retries, fails); then a plain relaunch resumes that growth. One parent run, one MLflow run per
    trial, nothing run twice, and the report compares the variants over all 6 seeds. About 90 s
    on an idle 2-core machine (three launches of Ray), hence slow."""
    name = "grow"
    doc = {"name": name, "description": "seed growth", "base": BASE, "resources": {"cpu": 0.5},
           "checkpoint_interval": 5, "max_failures": 0,
           "grid": {"variant": {"llama": {}, "lime": {"router": "full"}}, "seed": [0, 1, 2, 3]}}
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = sweep_env(tmp_path)
    exp = tmp_path / "results" / "ray" / name

    def lime(*args, **extra) -> subprocess.CompletedProcess:
        return subprocess.run([LIME, *args], capture_output=True, text=True, cwd=ROOT, env={**env, **extra},
                              timeout=900)

    r = lime("sweep", "run", str(path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parents, first = _runs(uri, name)
    first = {c.data.tags["trial_id"]: c for c in first}
    assert len(parents) == 1 and len(first) == 8

    marker = tmp_path / "fault.marker"
    r = lime("sweep", "run", str(path), "--add-seeds", "2", LIME_FAULT_ONCE=f"{marker}:5:variant=lime,seed=5")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # the crashed trial failed (no retries)
    assert "seeds 4, 5 added: 4 new trials in Ray experiment" in r.stdout and "does not rewrite" in r.stdout
    assert marker.is_file() and yaml.safe_load(path.read_text())["grid"]["seed"] == [0, 1, 2, 3]
    state = json.loads((exp / STATE_FILE).read_text())
    assert state["seeds"] == [0, 1, 2, 3, 4, 5] and state["extensions"] == [{"name": "extend-1", "seeds": [4, 5]}]

    r = lime("sweep", "run", str(path))  # the file still lists 0-3: resumes the growth
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "seeds in effect: 0, 1, 2, 3, 4, 5" in r.stdout and "resuming" in r.stdout
    parents, runs = _runs(uri, name)
    assert len(parents) == 1 and parents[0].info.run_id == state["parent_run_id"]
    assert parents[0].info.status == "FINISHED" and parents[0].data.params["sweep.seeds.extend-1"] == "4, 5"
    assert parents[0].data.tags["sweep.seeds"] == "0, 1, 2, 3, 4, 5"
    ids = sorted(c.data.tags["trial_id"] for c in runs)
    assert ids == sorted(f"variant={v},seed={s}" for v in ("llama", "lime") for s in range(6))  # one run each
    for c in runs:
        tid = c.data.tags["trial_id"]
        assert c.info.status == "FINISHED" and c.data.tags["variant"] == tid.split(",")[0].split("=")[1]
        assert c.data.tags["mlflow.parentRunId"] == state["parent_run_id"]
        seed = int(tid.rsplit("=", 1)[1])
        folder = exp / (tid if seed < 4 else f"extend-1/{tid}")
        assert _trainings(folder / "trial.log") == (2 if tid == "variant=lime,seed=5" else 1), tid
        if seed < 4:  # never touched again
            assert c.info.run_id == first[tid].info.run_id and c.info.end_time == first[tid].info.end_time
    assert "resuming from step 5" in (exp / "extend-1" / "variant=lime,seed=5" / "trial.log").read_text()

    r = lime("report", name, "--out", str(tmp_path / "reports"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [x for x in csv.DictReader(open(tmp_path / "reports" / name / "summary.csv")) if x["scope"] == "all"]
    assert {(x["axis"], x["variant"], x["n"]) for x in rows} == {("variant", "llama", "6"), ("variant", "lime", "6")}
    assert [x["variant"] for x in rows if x["baseline"] == "True"] == ["llama"]
    r = lime("sweep", "status", name)
    assert r.returncode == 0 and "finished 12" in r.stdout and "grown: extend-1: seeds 4, 5" in r.stdout


def test_the_shipped_default_sweep_plans_as_one_experiment(tmp_path):
    spec = load_spec(ROOT / "sweeps" / "default.yaml")
    p = extend.plan(spec, tmp_path, URI)
    assert len(p.parts) == 1 and p.spec is spec


def test_the_extension_folders_are_found_without_the_cache(tmp_path):
    for name in ("extend-10", "extend-2", "extend-1", "extend-x", "trial"):
        (tmp_path / name).mkdir()
    (tmp_path / "extend-3").write_text("")  # a file, not a Ray experiment
    assert [p.name for p in extension_dirs(tmp_path)] == ["extend-1", "extend-2", "extend-10"]
    assert not (tmp_path / STATE_FILE).exists()
