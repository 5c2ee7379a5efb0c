"""Wrong input that `lime sweep run` accepted and that only failed later, or never (issue 39): a
report metric or margin naming a metric no trial will log, a router reaching beyond the model's
depth, a relative margin as wide as the baseline's mean, and a seed cap no wave can exceed. Each
is one line on stderr, exit code 2, before any work; the expected value is that whole line,
written out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.sweep.spec import load_spec
from tests.orchestrator.cli.probe import one_line, private, sweep_file
from tests.sweeps import tiny

FINALS = "final/step_time_ms, final/train_mem_mb, final/val_loss, final/val_loss_se, final/val_ppl"
GRID = {"router": ["none", "full"], "seed": [0, 1]}


def _sweep(folder: Path, name: str, base: dict | None = None, **doc) -> Path:
    return sweep_file(folder, name, base, **{"grid": GRID, **doc})


_line = one_line


@pytest.fixture(autouse=True)
def _private(tmp_path, monkeypatch):
    private(tmp_path, monkeypatch)


def _nothing_written(tmp_path: Path) -> None:
    assert all(p.suffix == ".yaml" for p in tmp_path.iterdir()), sorted(p.name for p in tmp_path.iterdir())


def test_a_margin_or_metric_no_trial_logs_is_refused_with_the_file(tmp_path, capsys):
    margin = _sweep(tmp_path, "margin-nope", report={"margin": {"final/nope": "1%"}})
    assert _line(capsys, ["sweep", "run", str(margin), "--dry-run"]) == (
        f"error: {margin}: report.margin: 'final/nope' is not a metric this sweep's trials log; final metrics: "
        f"{FINALS}; eval metrics: none (no eval: block)")
    metric = _sweep(tmp_path, "metric-nope", report={"metric": "final/accuracy"})  # a task source's, not builtin's
    assert _line(capsys, ["sweep", "run", str(metric), "--dry-run"]) == (
        f"error: {metric}: report.metric: 'final/accuracy' is not a metric this sweep's trials log; final metrics: "
        f"{FINALS}; eval metrics: none (no eval: block)")
    no_eval = _sweep(tmp_path, "no-eval", report={"metric": "eval/arc_easy/acc"})
    assert _line(capsys, ["sweep", "run", str(no_eval), "--dry-run"]) == (
        f"error: {no_eval}: report.metric: 'eval/arc_easy/acc' needs an eval: block with the task 'arc_easy'; this "
        "sweep evaluates no downstream task")
    other = _sweep(tmp_path, "other-task", eval={"tasks": ["lime_kv"]},
                   report={"margin": {"final/val_loss": 0.01, "eval/arc_easy/acc": 0.02}})
    assert _line(capsys, ["sweep", "run", str(other), "--dry-run"]) == (
        f"error: {other}: report.margin: 'eval/arc_easy/acc': task 'arc_easy' is not evaluated; the eval: block's "
        "tasks: lime_kv")
    waves = _sweep(tmp_path, "waves-nope", report={"baseline": "none"}, decide={"margin": {"final/val_loss": 0.01},
                                                                               "max_seeds": 8})
    assert _line(capsys, ["sweep", "run", str(waves), "--until-decided", "--margin",
                          "final/val_loss=0.01;final/val_ppx=1%", "--dry-run"]) == (
        "error: --margin: 'final/val_ppx' is not a metric this sweep's trials log; final metrics: "
        f"{FINALS}; eval metrics: none (no eval: block)")
    _nothing_written(tmp_path)


def test_the_metrics_the_file_implies_are_accepted(tmp_path):
    task = {"source": "arithmetic", "task": {"n_ops": [3, 4], "max_value": 30}, "n_train": 300, "n_val": 40}
    base = tiny(data=task, model={"max_seq_len": 64, "router_prune": {"top_p": 0.9, "start": 10}})
    ok = _sweep(tmp_path, "task-metrics", base, grid={"router": ["full", "first-2"], "seed": [0, 1]},
                report={"metric": "final/accuracy", "baseline": "full",
                        "margin": {"final/accuracy_ops3": 0.05, "final/pruned_fraction": 0.1, "final/malformed": 0.1,
                                   "eval/lime_kv/acc": 0.1, "eval/lime_kv_bpb/bpb": 0.1, "val/loss": 0.1}},
                eval={"tasks": ["lime_kv"], "gold_loss": True})
    assert load_spec(ok).report.metric == "final/accuracy"


def test_the_engine_logs_exactly_the_final_metrics_the_check_knows(tmp_path):
    # a real trial of a task source with pruning: every final/ metric it logs is one the sweep
    # check accepts, and the check names none it does not log (the GPU's memory aside: CPU here)

    from orchestrator.engine.final_names import trial_finals
    from orchestrator.tasks import TASKS

    cfg = TrialConfig.from_dict(tiny(
        data={"source": "arithmetic", "task": {"n_ops": [3, 4], "max_value": 30}, "n_train": 64, "n_val": 16},
        model={"router": "full", "router_prune": {"top_p": 0.9, "start": 2}},
        train={"steps": 4, "log_interval": 2, "eval_interval": 2, "checkpoint_dir": str(tmp_path / "ck")}))
    res = run_trial(cfg, tracking=Tracking(enabled=False))
    logged = {k for k in res.metrics if k.startswith("final/")}
    names, prefixes = trial_finals(cfg, TASKS)
    grouped = {k for k in logged if any(k.startswith(p) for p in prefixes)}
    assert grouped == {"final/accuracy_ops3", "final/accuracy_ops4"}
    assert logged - grouped == names - ({"final/train_mem_mb"} if "final/train_mem_mb" not in logged else set())


def test_a_router_beyond_the_models_depth_is_refused(tmp_path, capsys):
    deep = _sweep(tmp_path, "deep", grid={"router": ["none", "full", "first-20"], "seed": [0, 1]})
    assert _line(capsys, ["sweep", "run", str(deep), "--dry-run"]) == (
        f"error: {deep}: grid.router[2]: 'first-20': j 20 is beyond the model's depth; allowed: 1 to 2 "
        "(model.n_layers)")
    base = _sweep(tmp_path, "deep-base", tiny(model={"router": "dilated-3"}), grid={"seed": [0, 1]},
                  report={"axis": "seed", "baseline": 0})
    assert _line(capsys, ["sweep", "run", str(base), "--dry-run"]) == (
        f"error: {base}: base.model.router: 'dilated-3': d 3 is beyond the model's depth; allowed: 1 to 2 "
        "(model.n_layers)")
    # the grid point as the trials see it: last-3 is fine at 4 layers, not at 2
    layers = _sweep(tmp_path, "deep-layers", tiny(model={"router": "last-3"}), grid={"model.n_layers": [4, 2]},
                    report={"axis": "model.n_layers", "baseline": 4})
    assert _line(capsys, ["sweep", "run", str(layers), "--dry-run"]) == (
        f"error: {layers}: grid.model.n_layers[1] (2): model.router: 'last-3': j 3 is beyond the model's depth; "
        "allowed: 1 to 2 (model.n_layers)")
    assert _line(capsys, ["train", "--preset", "tiny", "--set", "model.router=dynamic-last-5"]) == (
        "error: model.router: 'dynamic-last-5': j 5 is beyond the model's depth; allowed: 1 to 4 (model.n_layers)")
    _nothing_written(tmp_path)


def test_a_relative_margin_at_or_above_the_baselines_mean_is_refused(tmp_path, capsys):
    for pct in ("500%", "100%"):
        path = _sweep(tmp_path, f"wide-{pct[:-1]}", report={"margin": pct})
        assert _line(capsys, ["sweep", "run", str(path), "--dry-run"]) == (
            f"error: {path}: report.margin: a percentage must be above 0 and below 100% of the baseline's mean, such "
            f"as '1%' (or give an absolute margin in the metric's units), got '{pct}'")
    waves = _sweep(tmp_path, "wide-waves", report={"baseline": "none"})
    assert _line(capsys, ["sweep", "run", str(waves), "--until-decided", "--margin", "150%", "--dry-run"]) == (
        "error: --margin: a percentage must be above 0 and below 100% of the baseline's mean, such as '1%' (or give "
        "an absolute margin in the metric's units), got '150%'")
    assert load_spec(_sweep(tmp_path, "wide-ok", report={"margin": "99.5%"})).report.margin == "99.5%"


def test_a_seed_cap_no_wave_can_exceed_is_refused(tmp_path, capsys):
    path = _sweep(tmp_path, "capped", report={"baseline": "none"}, decide={"max_seeds": 2})
    assert _line(capsys, ["sweep", "run", str(path), "--dry-run"]) == (
        f"error: {path}: decide.max_seeds: 2 equals the 2 seeds of grid.seed (the first wave): no wave could add a "
        "seed; give more than 2 (or drop decide:)")
    free = _sweep(tmp_path, "uncapped", report={"baseline": "none"})
    for n in ("2", "1"):
        line = ("error: --max-seeds: 2 is not above the first wave's 2 seeds (grid.seed): no wave could add a seed; "
                "give more than 2") if n == "2" else (
                "error: --max-seeds: must be an integer in [2, 1000] (seeds per arm at most, as decide.max_seeds), "
                "got '1'")
        assert _line(capsys, ["sweep", "run", str(free), "--until-decided", "--max-seeds", n, "--dry-run"]) == line
    _nothing_written(tmp_path)
