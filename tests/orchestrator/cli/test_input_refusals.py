"""Wrong input that `lime sweep run`, `lime train` and `lime report --pool` used to accept, a valid
file they refused, and refusals that were slow or long (issue 39). Each is one line on stderr and
exit code 2; the expected value is that whole line, written out by hand."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.orchestrator.cli.probe import one_line, private, sweep_file
from tests.sweeps import tiny

ROOT = Path(__file__).resolve().parents[3]
LIMIT = "more than the limit of 20G parameters; make it smaller or raise $LIME_MAX_PARAMS"


_sweep, _line = sweep_file, one_line


@pytest.fixture(autouse=True)
def _private(tmp_path, monkeypatch):
    private(tmp_path, monkeypatch)


def test_the_size_guard_counts_the_depth_mix(tmp_path, capsys):
    # tiny (d_model 32, 2 layers, 4 sublayers): mHC's phi per sublayer is nC x n(n+2), n = 100,000:
    # 4 x 1e5 x 32 x 1e5 x 100,002 = 1.28e17 (128P); + 4 x (3 + 1e5 x 100,002) biases and gates, and
    # the dense 28.4k: 128P in all, 2.05E bytes at 16 per parameter
    path = _sweep(tmp_path, "mhc-giant", tiny(model={"depth_mix": "mhc-100000"}))
    assert _line(capsys, ["sweep", "run", str(path), "--dry-run"]) == (
        f"error: {path}: base.model: the model has at least 128P parameters (d_model 32, n_layers 2, ffn_dim 64, "
        f"vocab 256, depth_mix mhc-100000 (128P of them)), 2.05EB of training state at 16 bytes per parameter, {LIMIT}")
    # Hyper-Connections, n = 1e6, tiny preset (d_model 64, 4 layers: 8 sublayers): 8 x (n(n+1) + n + 64(n+2) + 2)
    # = 8.0000005e12 (8T)
    assert _line(capsys, ["train", "--preset", "tiny", "--set", "model.depth_mix=hyper-connections-1000000"]) == (
        "error: model: the model has at least 8T parameters (d_model 64, n_layers 4, ffn_dim 172, vocab 256, "
        "depth_mix hyper-connections-1000000 (8T of them)), 128TB of training state at 16 bytes per parameter, "
        + LIMIT)
    assert _line(capsys, ["train", "--preset", "tiny", "--set", "model.depth_mix=mhc-4-1000000000"]) == (
        "error: model.depth_mix: 'mhc-4-1000000000': iters 1000000000: at most 1000 Sinkhorn-Knopp rounds (the mHC "
        "paper uses 20)")


def test_pruning_that_would_never_start_is_refused(tmp_path, capsys):
    path = _sweep(tmp_path, "late", tiny(model={"router": "full", "router_prune": {"top_p": 0.9, "start": 500}}))
    assert _line(capsys, ["sweep", "run", str(path), "--dry-run"]) == (
        f"error: {path}: base.model.router_prune.start: 500 is beyond train.steps=20: the router would never be "
        "pruned; start at a step <= train.steps")


def test_a_base_that_needs_the_grid_is_validated_as_the_trials_see_it(tmp_path, capsys):
    base = tiny(model={"router_prune": {"top_p": 0.9, "start": 10}})  # the preset's router is none
    good = _sweep(tmp_path, "pruned", base, grid={"router": ["full", "first-2"], "seed": [0, 1]})
    assert main(["sweep", "run", str(good), "--dry-run"]) == 0
    assert "4 trials" in capsys.readouterr().out
    bad = _sweep(tmp_path, "pruned-none", base, grid={"router": ["full", "none"], "seed": [0, 1]})
    assert _line(capsys, ["sweep", "run", str(bad), "--dry-run"]) == (
        f"error: {bad}: grid.router[1] (none): model.router_prune: router 'none' (kind identity) cannot be pruned; "
        "prunable: routers of kind linear (full, first-<j>, last-<j>, dilated-<d>)")
    alone = _sweep(tmp_path, "pruned-alone", base)  # no grid to set the router: the base's own mistake
    assert _line(capsys, ["sweep", "run", str(alone), "--dry-run"]) == (
        f"error: {alone}: base.model.router_prune: router 'none' (kind identity) cannot be pruned; prunable: routers "
        "of kind linear (full, first-<j>, last-<j>, dilated-<d>)")


def test_the_dry_run_checks_the_eval_blocks_include_folders(tmp_path, capsys):
    path = _sweep(tmp_path, "ev-include", eval={"tasks": ["lime_kv"], "include": ["/nonexistent/tasks"]})
    assert _line(capsys, ["sweep", "run", str(path), "--dry-run"]) == (
        f"error: {path}: eval.include[0]: '/nonexistent/tasks' is not a folder (of harness task YAML files)")
    assert not (tmp_path / "cache").exists()  # refused before the local tasks were written


@pytest.mark.slow  # an unknown name reads the harness's own index of ~15,000 task files
def test_the_dry_run_checks_the_eval_blocks_task_names(tmp_path, capsys):
    path = _sweep(tmp_path, "ev-task", eval={"tasks": ["no_such_task_xyz"]})
    assert _line(capsys, ["sweep", "run", str(path), "--dry-run"]) == (
        f"error: {path}: eval.tasks: unknown task 'no_such_task_xyz' (neither a suite nor a task of the LM "
        "Evaluation Harness)")


DECIDE = {"grid": {"router": ["none", "full"], "seed": [0, 1]}, "report": {"baseline": "none"}}


def test_sequential_flags_are_checked_with_the_file_torch_free_and_fast(tmp_path):
    path = _sweep(tmp_path, "waves", **DECIDE)
    cases = {
        "max": (["--until-decided", "--max-seeds", "100000"],
                "error: --max-seeds: must be an integer in [2, 1000] (seeds per arm at most, as decide.max_seeds), "
                "got '100000'"),
        "empty-margin": (["--until-decided", "--margin", ""],
                         "error: --margin: empty; give an absolute margin (0.01) or a percentage of the baseline's "
                         "mean (1%), or leave the flag out"),
        "bad-max": (["--until-decided", "--max-seeds", "x"],
                    "error: --max-seeds: must be an integer in [2, 1000] (seeds per arm at most, as "
                    "decide.max_seeds), got 'x'"),
        "bad-budget": (["--until-decided", "--budget", "hours=2"],
                       "error: --budget: must be KEY=VALUE with KEY one of trials, core_hours, gpu_hours (such as "
                       "trials=60 or core_hours=2; several joined by ','), got 'hours=2'"),
        "low-budget": (["--until-decided", "--budget", "trials=3"],
                       f"error: {path}: decide.budget.trials: 3 is below the first wave's 4 trials (the grid's 2 "
                       "values x 2 seeds in grid.seed)"),
    }
    argvs = {k: ["sweep", "run", str(path), *flags] for k, (flags, _) in cases.items()}
    prog = ("import contextlib, io, json, sys, time\nfrom orchestrator.cli import main\nout = {}\n"
            f"for name, argv in json.loads({json.dumps(argvs)!r}).items():\n"
            "    err = io.StringIO()\n    t0 = time.perf_counter()\n"
            "    with contextlib.redirect_stderr(err):\n        rc = main(argv)\n"
            "    out[name] = [rc, err.getvalue(), time.perf_counter() - t0]\n"
            "out['heavy'] = sorted(m for m in ('torch', 'ray', 'mlflow') if m in sys.modules)\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out.pop("heavy") == []  # neither Ray nor torch loaded to refuse a flag
    for name, (_, line) in cases.items():
        rc, err, _ = out[name]
        assert (rc, err) == (2, line + "\n"), name
    assert sorted(out[n][2] for n in cases)[1] < 1.0  # the median refusal (after the first import), under a second


def test_argparse_errors_are_one_line(capsys):
    for argv, line in [
        (["sweep", "run", "x.yaml", "--bogus"], "error: lime: unrecognized arguments: --bogus (see lime --help)"),
        (["prune", "abc", "--top-p", "high"],
         "error: lime prune: argument --top-p: invalid float value: 'high' (see lime prune --help)"),
        (["eval", "abc"], "error: lime eval: the following arguments are required: --tasks (see lime eval --help)"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        out, err = capsys.readouterr()
        assert (e.value.code, out, err) == (2, "", line + "\n"), argv


def test_a_pool_of_sweeps_that_compare_different_metrics_is_refused(tmp_path, capsys):
    from orchestrator.core import tracking
    from tests.orchestrator.report.test_report import T0, add_trial, log_sweep_params

    cl = tracking.client()
    for name, metric in (("pool-loss", "final/val_loss"), ("pool-ppl", "final/val_ppl")):
        exp = tracking.experiment_id(name, cl)
        parent = cl.create_run(exp, tags={"sweep": name, "sweep_role": "parent"}).info.run_id
        log_sweep_params(cl, parent, axes="router,seed", axis="router", baseline="none", n_trials=2, metric=metric)
        for i, router in enumerate(("none", "full")):
            add_trial(cl, exp, parent, name, router, 0, final=3.0 + i, status="finished", start=T0 + 1000 * i)
    t0 = time.monotonic()
    assert _line(capsys, ["report", "--pool", "pool-loss,pool-ppl", "--out", str(tmp_path / "r")]) == (
        "error: report --pool: the sweeps compare different metrics (pool-loss: final/val_loss, pool-ppl: "
        "final/val_ppl); pooled comparisons share one metric")
    assert not (tmp_path / "r").exists() and time.monotonic() - t0 < 30


def test_more_than_this_machine_has_is_refused_before_ray_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    gpu = _sweep(tmp_path, "gpu-giant", resources={"cpu": 1, "gpu": 1000}, **DECIDE)
    cpu = _sweep(tmp_path, "cpu-giant", resources={"cpu": 100000})
    argvs = {"gpu": ["sweep", "run", str(gpu)], "cpu": ["sweep", "run", str(cpu)],
             "gpu-waves": ["sweep", "run", str(gpu), "--until-decided"]}
    prog = ("import contextlib, io, json, os, sys\nfrom orchestrator.cli import main\nout = {}\n"
            f"for name, argv in json.loads({json.dumps(argvs)!r}).items():\n"
            "    err, so = io.StringIO(), io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(so):\n        rc = main(argv)\n"
            "    out[name] = [rc, so.getvalue(), err.getvalue()]\n"
            "import torch\nout['gpus'], out['cpus'] = torch.cuda.device_count(), os.cpu_count()\n"
            "out['heavy'] = sorted(m for m in ('ray', 'mlflow') if m in sys.modules)\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["heavy"] == []  # neither Ray nor MLflow loaded to refuse it
    want = (f"error: resources.gpu: 1000 per trial, but this machine has {out['gpus']} GPUs (local Ray); use the "
            "sweep's -cpu version or connect to a GPU cluster (--address or RAY_ADDRESS)\n")
    assert out["gpu"] == out["gpu-waves"] == [2, "", want]
    assert out["cpu"] == [2, "", f"error: resources.cpu: 100000 per trial, but this machine has {out['cpus']} CPUs "
                                 "(local Ray); lower it or connect to a cluster (--address or RAY_ADDRESS)\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-giant.yaml", "gpu-giant.yaml"]  # no store, no results


def test_a_sequential_margin_must_be_the_compared_metrics(tmp_path, capsys):
    # the waves stop on final/val_loss: a margin for another metric only would leave them without one
    path = _sweep(tmp_path, "waves", **DECIDE)
    assert _line(capsys, ["sweep", "run", str(path), "--until-decided", "--margin", "foo/bar=0.1"]) == (
        "error: --margin: names a margin for 'foo/bar' only, but the waves compare final/val_loss; give its margin "
        "(0.01, 1% or final/val_loss=0.01)")
    other = _sweep(tmp_path, "waves-other", **DECIDE, decide={"margin": {"val/foo": 0.1}})
    assert _line(capsys, ["sweep", "run", str(other), "--dry-run"]) == (
        f"error: {other}: decide.margin: names a margin for val/foo only, but the waves compare final/val_loss; give "
        "its margin (0.01, 1% or final/val_loss: 0.01)")
    empty = _sweep(tmp_path, "waves-empty", **DECIDE, decide={"margin": ""})
    assert _line(capsys, ["sweep", "run", str(empty), "--dry-run"]) == (
        f"error: {empty}: decide.margin: empty; give an absolute margin (0.01) or a percentage of the baseline's "
        "mean (1%), or leave the key out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["waves-empty.yaml", "waves-other.yaml", "waves.yaml"]
