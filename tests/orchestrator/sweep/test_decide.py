"""``lime sweep run --until-decided`` (``orchestrator.sweep.decide``) in-process, with a stand-in for
the training: the stand-in launch plans each wave with the real ``extend`` machinery, opens the
parent run as the driver does and writes one finished MLflow run per new trial with a known value.
What is checked: a clear comparison stops at the first look, an undecided one gets waves until the
cap, the waves run only the baseline and the undecided variants (trial ids of the grid), the looks
are recorded on the parent run, a killed driver resumes the sequence where it was, the report reads
the sequence, and ``lime sweep status`` shows the waves."""
from __future__ import annotations

import json
import math

import pytest

from lime_arch import ConfigError
from orchestrator.core import record, tracking
from orchestrator.core.record import trial_tags
from orchestrator.decide.verdict import AT_BUDGET, BETTER, UNDECIDABLE, UNDECIDED, table_contradictions
from orchestrator.sweep import decide, driver, extend
from orchestrator.sweep.local_state import read_state
from orchestrator.sweep.spec import parse_spec
from orchestrator.sweep.view import experiment_dir, status_text

OFFSETS = [0.0, 0.3, -0.2, 0.5, -0.4, 0.1, 0.25, -0.3]
NOISE = [1.0, -1.0, 0.6, -0.6, 0.3, -0.3, 0.8, -0.8]


def value(router: str, seed: int) -> float:
    """first-4 is 0.1 better on every seed; full differs by +-0.02 noise around 0."""
    shared = 3.0 + OFFSETS[seed % 8] + 0.01 * seed
    own = {"none": 0.0, "first-4": -0.1 + 0.003 * NOISE[seed % 8], "full": 0.02 * NOISE[(seed * 3) % 8]}
    return shared + own[router]


def make_spec(tmp_path, decide_block=None, seeds=6):
    data = {"name": "dec", "description": "decide test",
            "base": {"preset": "tiny", "train": {"steps": 10, "batch_size": 4, "seq_len": 32}},
            "grid": {"router": ["none", "full", "first-4"], "seed": list(range(seeds))},
            "report": {"metric": "final/val_loss", "axis": "router", "baseline": "none"}}
    if decide_block is not None:
        data["decide"] = decide_block
    return parse_spec(data)


class StandIn:
    """``run_sweep`` without Ray: the launch's trials get finished runs with ``value``."""

    def __init__(self, fail_after: int | None = None, wall: float | None = None, stop_at: tuple | None = None):
        self.calls, self.fail_after, self.wall = [], fail_after, wall  # wall: each trial's trial/wall_s
        # stop_at (call, trials): that launch finishes only so many trials and returns, as Ray Tune does
        # on Ctrl-C (the experiment stopped, fit() returns, the summary counts the rest unfinished)
        self.stop_at = stop_at

    def __call__(self, spec, *, add_seeds=0, only=None, results=None, **_):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt  # the driver killed before this wave starts
        uri = tracking.tracking_uri()
        launch = extend.prepare(spec, experiment_dir(spec.name, results), uri, add_seeds, only)
        cl, _, _ = driver._open_tracking(launch)
        spec, exp_id, parent = launch.spec, launch.exp_id, launch.parent
        done = {r.data.tags[record.TRIAL_ID] for r in record.child_runs(cl, exp_id, parent)}
        new = [t for t in spec.trials() if t.trial_id not in done]
        self.calls.append([t.trial_id for t in new])
        unfinished = 0
        if self.stop_at is not None and len(self.calls) == self.stop_at[0]:
            new, unfinished = new[:self.stop_at[1]], len(new) - self.stop_at[1]
        for t in new:
            tags = trial_tags(spec.name, t.trial_id, t.params, **{record.PARENT_RUN: parent, record.STATUS: "finished"})
            rid = cl.create_run(exp_id, tags=tags).info.run_id
            cl.log_metric(rid, "final/val_loss", value(t.params["router"], t.params["seed"]))
            if self.wall is not None:
                cl.log_metric(rid, record.TRIAL_WALL, self.wall)
            cl.set_terminated(rid, "FINISHED")
        record.end_run(cl, parent, record.TrialStatus.KILLED if unfinished else record.TrialStatus.FINISHED)
        return {"ok": not unfinished, "unfinished": unfinished, "launch": launch}


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    return tmp_path


def test_waves_until_decided(env, monkeypatch):
    stand_in = StandIn()
    monkeypatch.setattr(decide, "run_sweep", stand_in)
    spec = decide.with_options(make_spec(env), True, "12", None)
    out = decide.run_until_decided(spec)
    waves = out["waves"]
    # look 1 after seeds 0-5: the median's sign sequence at 97.5% is finite from 8 seeds, so nothing is
    # decided; look 2 after seeds 0-7: first-4 better (all 8 signs agree); full undecided -> waves to 12
    assert waves[0].decisions[1].verdict.word == UNDECIDABLE and len(waves[0].decisions[1].seeds) == 6
    assert waves[1].decisions[1].verdict.word == BETTER and len(waves[1].decisions[1].seeds) == 8
    assert [w.next_seeds for w in waves] == [[6, 7], [8, 9], [10, 11], []]
    assert waves[-1].done and "not decided at the cap of 12" in waves[-1].why
    assert waves[-1].decisions[0].verdict.word == UNDECIDED and len(waves[-1].decisions[0].seeds) == 12
    # the waves ran only the baseline and full, with the grid's trial ids
    assert stand_in.calls[2] == ["router=none,seed=8", "router=none,seed=9", "router=full,seed=8",
                                 "router=full,seed=9"]
    state = read_state(experiment_dir("dec"))
    assert [e["values"] for e in state["extensions"]] == [["none", "full", "first-4"]] + [["none", "full"]] * 2
    params = tracking.client().get_run(state["parent_run_id"]).data.params
    assert params["sweep.decide.max_seeds"] == "12" and params["sweep.decide.wave"] == "2"
    # the record holds the waves as the cache does: their seeds and values, by name
    assert params["sweep.base_seeds"] == "0, 1, 2, 3, 4, 5"
    assert [params[f"sweep.seeds.extend-{k}"] for k in (1, 2, 3)] == ["6, 7", "8, 9", "10, 11"]
    assert json.loads(params["sweep.values.extend-3"]) == {"axis": "router", "values": ["none", "full"]}
    looks = record.decide_waves(params)
    assert list(looks) == [1, 2, 3, 4] and json.loads(looks[2])["verdict"] == {"full": UNDECIDED, "first-4": BETTER}


def test_a_killed_driver_resumes_the_sequence(env, monkeypatch):
    spec = decide.with_options(make_spec(env), True, "12", None)
    monkeypatch.setattr(decide, "run_sweep", StandIn(fail_after=2))  # dies before the second wave
    with pytest.raises(KeyboardInterrupt):
        decide.run_until_decided(spec)
    again = StandIn()
    monkeypatch.setattr(decide, "run_sweep", again)
    waves = decide.run_until_decided(spec)["waves"]
    assert [w.index for w in waves] == [2, 3, 4] and waves[-1].done  # look 1 was recorded before the kill
    assert again.calls[0] == []  # the resumed launch had nothing left to run
    params = tracking.client().get_run(read_state(experiment_dir("dec"))["parent_run_id"]).data.params
    assert list(record.decide_waves(params)) == [1, 2, 3, 4]


@pytest.mark.parametrize("call", [1, 2], ids=["first-wave", "second-wave"])
def test_an_interrupted_wave_gets_no_look_and_its_rerun_looks_as_an_uninterrupted_run(env, monkeypatch, capsys, call):
    """Ctrl-C makes Ray Tune stop the experiment and return: the launch ends with trials unfinished.
    No look may read that wave in part (peers-cpu, 2026-12-03: look 1 read 66 of 180 trials, said
    "not tested (0 seeds)" for 11 arms and launched the next wave); the rerun finishes it, then looks."""
    spec = decide.with_options(make_spec(env), True, "12", None)
    monkeypatch.setattr(decide, "run_sweep", StandIn(stop_at=(call, 2)))
    out = decide.run_until_decided(spec)
    assert not out["ok"] and [w.index for w in out["waves"]] == list(range(1, call))
    # the first wave has 18 trials, the second 6 (seeds 6 and 7 of none, full and first-4)
    left = 16 if call == 1 else 4
    assert (f"sweep dec: no look: the wave ended with {left} trial(s) unfinished; run the same command again to "
            "finish the wave, then look") in capsys.readouterr().out
    params = tracking.client().get_run(read_state(experiment_dir("dec"))["parent_run_id"]).data.params
    assert list(record.decide_waves(params)) == list(range(1, call))
    again = StandIn()
    monkeypatch.setattr(decide, "run_sweep", again)
    waves = decide.run_until_decided(spec)["waves"]
    assert len(again.calls[0]) == left  # the rerun finished the interrupted wave first
    assert [w.index for w in waves] == list(range(call, 5)) and waves[-1].done
    params = tracking.client().get_run(read_state(experiment_dir("dec"))["parent_run_id"]).data.params
    looks = record.decide_waves(params)  # the same looks as test_waves_until_decided's uninterrupted run
    assert list(looks) == [1, 2, 3, 4] and json.loads(looks[2])["verdict"] == {"full": UNDECIDED, "first-4": BETTER}


def test_the_report_reads_the_sequence(env, monkeypatch, capsys):
    from orchestrator.report.build import build_report

    monkeypatch.setattr(decide, "run_sweep", StandIn())
    decide.run_until_decided(decide.with_options(make_spec(env), True, "10", "0.5%"))
    said = capsys.readouterr().out
    # full's +-0.02 noise against a margin of 0.5% of ~3.07 (0.0154): out of reach at 10 seeds, said at look 1
    first_margin = 0.005 * sum(value("none", s) for s in range(6)) / 6
    assert f"look 1: full: the margin +-{first_margin:g} is out of reach at the cap of 10 seeds" in said
    assert "first-4: the margin" not in said  # decided at the first look
    out = build_report("dec", out=env / "reports", log_to_mlflow=False).parent
    md = (out / "report.md").read_text()
    assert "## Sequential seeds" in md and "confidence sequence" in md and "Compute:" in md
    import csv

    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert {r["seeds_design"] for r in rows} == {"sequential"} and table_contradictions(rows) == []
    first4 = [r for r in rows if r["variant"] == "first-4"][0]
    assert first4["verdict"] == BETTER and first4["n_pairs"] == "8" and first4["estimand"] == "median"
    assert math.isfinite(float(first4["margin"]))  # 0.5% of the baseline's mean, fixed at the first look
    # the margin the report applies is the waves' one: 0.5% of the baseline's mean over the first look's
    # 6 seeds, not over the 10 it has at the end (full was not decided, so the baseline got more seeds)
    first = 0.005 * sum(value("none", s) for s in range(6)) / 6
    final = 0.005 * sum(value("none", s) for s in range(10)) / 10
    assert abs(first - final) > 1e-6
    margins = {float(r["margin"]) for r in rows if r["margin"]}
    assert len(margins) == 1 and margins.pop() == pytest.approx(first, rel=1e-9)
    assert "fixed from `report.margin` at the first look" in md
    assert "(not valid after optional stopping)" in md and "Against a fixed design with the same cap" in md
    assert "dec" in status_text("dec") and "look 1" in status_text("dec")


def test_options_are_checked_before_anything_runs(env):
    spec = make_spec(env)
    with pytest.raises(ConfigError, match=r"--max-seeds: must be an integer in \[2, 1000\]"):
        decide.with_options(spec, True, "1", None)
    with pytest.raises(ConfigError, match="--margin: must be a number > 0"):
        decide.with_options(spec, True, None, "-1")
    with pytest.raises(ConfigError, match="only with --until-decided"):
        decide.with_options(spec, False, "8", None)
    for n in ("4", "6"):  # below or at the first wave's 6 seeds: no wave could add one
        with pytest.raises(ConfigError) as e:
            decide.with_options(spec, True, n, None)
        assert str(e.value) == (f"--max-seeds: {n} is not above the first wave's 6 seeds (grid.seed): no wave could "
                                "add a seed; give more than 6")
    assert decide.with_options(spec, False, None, None).decide is None
    with pytest.raises(ConfigError, match=r"decide: the grid's axes must be the compared one"):
        parse_spec({"name": "x", "description": "x", "base": {"preset": "tiny"},
                    "grid": {"router": ["none", "full"], "optim.lr": [1e-3, 2e-3], "seed": [0, 1]},
                    "decide": {"max_seeds": 8}})


def test_a_budget_ends_the_comparison_out_of_reach_and_decides_the_rest(env, monkeypatch, capsys):
    from orchestrator.report.build import build_report

    stand_in = StandIn(wall=360.0)  # 0.1 h a trial, 1 core each
    monkeypatch.setattr(decide, "run_sweep", stand_in)
    spec = decide.with_options(make_spec(env), True, "40", None, "trials=30,core_hours=3")
    waves = decide.run_until_decided(spec)["waves"]
    # look 1 (6 seeds: 18 trials, 1.8 core-hours spent): full's differences are 0.02 x noise, median -0.003 and sd
    # 0.017: a decision needs hundreds of seeds, far above the 12 trials left: inconclusive at budget. first-4
    # needs 8 seeds (the first with a finite sequence at 97.5%): 4 trials and 0.4 core-hours more; it continues
    full = waves[0].decisions[0]
    assert full.verdict.word == AT_BUDGET and full.projection.seeds > 100 and full.projection.left.trials == 12
    assert waves[0].next_variants == ["none", "first-4"] and waves[0].next_seeds == [6, 7]
    assert waves[1].decisions[1].verdict.word == BETTER and waves[1].done and len(waves) == 2
    assert waves[1].why == "1 comparison(s) inconclusive at budget"
    assert stand_in.calls[1] == ["router=none,seed=6", "router=none,seed=7", "router=first-4,seed=6",
                                 "router=first-4,seed=7"]
    said = capsys.readouterr().out
    assert ("look 1: budget 30 trials, 3 core-hours: spent 18 trials, 1.8 core-hours; the next wave costs 4 trials"
            in said)
    assert "look 1: full: inconclusive at budget: at look 1 (6 seeds, median -0.003, sd " in said
    assert ("look 1: first-4: at look 1 (6 seeds, median -0.1, sd 0.00228) a decision needs about 8 seeds per arm: 4 "
            "trials, 0.4 core-hours more, within the 12 trials, 1.2 core-hours left") in said
    params = tracking.client().get_run(read_state(experiment_dir("dec"))["parent_run_id"]).data.params
    assert params["sweep.decide.budget"] == "trials=30,core_hours=3.0"
    looks = record.decide_waves(params)
    assert json.loads(looks[1])["ended"]["full"]["need"] == full.projection.seeds
    assert json.loads(looks[1])["verdict"]["full"] == AT_BUDGET
    assert json.loads(looks[2])["spent"] == {"trials": 22, "core_hours": 2.2, "gpu_hours": 0}
    out = build_report("dec", out=env / "reports", log_to_mlflow=False).parent
    md = (out / "report.md").read_text()
    assert "Budget (`decide.budget`): 30 trials, 3 core-hours. Spent against it: 22 trials, 2.2 core-hours" in md
    assert "`full`: at look 1 (6 seeds, median -0.003, sd " in md and "above the 12 trials, 1.2 core-hours left" in md
    assert "cannot decide (inconclusive at budget)" in md
    assert "inconclusive at budget" in status_text("dec")


def test_the_budget_is_checked_with_the_file(env):
    spec = make_spec(env)
    with pytest.raises(ConfigError, match=r"^--budget: must be KEY=VALUE with KEY one of trials, core_hours, "
                                          r"gpu_hours \(such as trials=60"):
        decide.with_options(spec, True, None, None, "hours=2")
    with pytest.raises(ConfigError, match=r"^--budget: trials must be an integer >= 1 \(trials launched in all\), "
                                          r"as decide.budget.trials; got '0'$"):
        decide.with_options(spec, True, None, None, "trials=0")
    with pytest.raises(ConfigError, match=r"decide.budget.trials: 10 is below the first wave's 18 trials \(the "
                                          r"grid's 3 values x 6 seeds in grid.seed\)$"):
        decide.with_options(spec, True, None, None, "trials=10")
    with pytest.raises(ConfigError, match="only with --until-decided"):
        decide.with_options(spec, False, None, None, "trials=40")
    budget = decide.with_options(spec, True, None, None, "core-hours=2.5,trials=40").decide.budget
    assert budget.words() == "40 trials, 2.5 core-hours"
    for block, line in [
        ({}, "decide.budget: empty; give one or more of trials, core_hours, gpu_hours, such as {trials: 60} or "
             "{core_hours: 2}"),
        ({"trial": 40}, "decide.budget.trial: unknown key; allowed: core_hours, gpu_hours, trials"),
        ({"core_hours": -1}, "decide.budget.core_hours: must be > 0, got -1"),
        ({"core_hours": math.inf}, "decide.budget.core_hours: input should be a finite number, got inf"),
        ({"trials": 40.5}, "decide.budget.trials: must be an integer >= 1 or null, got 40.5"),
        (60, "decide.budget: must be a mapping like {trials: 60} or {core_hours: 2}, got 60"),
        ({"gpu_hours": 1}, "decide.budget.gpu_hours: the trials hold no GPU (resources.gpu is 0): a GPU-hours budget "
                           "would never be spent; give trials or core_hours"),
    ]:
        with pytest.raises(ConfigError) as e:
            make_spec(env, {"budget": block})
        assert str(e.value).endswith(line), (block, str(e.value))
