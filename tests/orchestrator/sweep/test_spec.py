"""Sweep files: every shipped file validates and dry-runs; bad files fail early with one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.sweep.files import sweep_files
from orchestrator.sweep.spec import ALIASES, load_spec, parse_spec, trial_dirname

ROOT = Path(__file__).resolve().parents[3]
SWEEPS = sweep_files(ROOT / "sweeps")  # runnable sweeps: shared bases (_name.yaml) left out
PAPER = ["router-ablation-150m", "router-structure-150m", "deep-routing-128", "depth-scaling", "router-lr"]


def _write(tmp_path: Path, name: str, doc: dict | str | bytes) -> Path:
    p = tmp_path / f"{name}.yaml"
    if isinstance(doc, bytes):
        p.write_bytes(doc)
    else:
        p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return p


def _good(name: str = "mini", **over) -> dict:
    d = {"name": name, "description": "a small sweep",
         "base": {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64,
                                              "max_seq_len": 64},
                  "data": {"source": "builtin"},
                  "train": {"steps": 20, "batch_size": 4, "seq_len": 32, "log_interval": 5, "eval_interval": 10}},
         "grid": {"router": ["none", "full"], "seed": [0, 1]},
         "resources": {"cpu": 1}}
    d.update(over)
    return d


# -- the shipped sweep files ---------------------------------------------------------------------------
def test_the_sweeps_folder_has_the_default_and_paper_sweeps():
    names = {p.stem for p in SWEEPS}
    assert "default" in names
    for n in PAPER:
        assert n in names and f"{n}-cpu" in names, n


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_shipped_sweep_validates_and_dry_runs(path, monkeypatch, tmp_path):
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    from orchestrator.sweep.view import dry_run_text

    spec = load_spec(path)
    assert spec.name == path.stem
    text = dry_run_text(spec)
    assert "total:" in text and "FLOP" in text and "nothing was started" in text
    ids = [tid for tid, _ in spec.expand()]
    assert len(ids) == len(set(ids))
    if spec.search is None:
        assert len(ids) == spec.n_trials()
        for tid in ids:
            assert tid in text or tid[:34] in text
    assert not (tmp_path / "results").exists()  # a dry run writes nothing


def test_default_sweep_is_deep_narrow_with_three_routers_and_four_seeds():
    spec = load_spec(ROOT / "sweeps" / "default.yaml")
    routers = spec.grid["router"]
    assert "none" in routers and "full" in routers and len(routers) == 3
    assert len(spec.grid["seed"]) >= 4
    cfg = spec.expand()[0][1]
    m = cfg.model_config()
    assert cfg.data.source == "builtin"
    assert m.n_layers >= 8 and m.d_model <= 96  # many layers, small width
    assert spec.resources.gpu == 0


@pytest.mark.parametrize("name", PAPER)
def test_paper_sweeps_use_gpus_and_fineweb_and_their_cpu_twins_share_the_axes(name):
    big, small = load_spec(ROOT / "sweeps" / f"{name}.yaml"), load_spec(ROOT / "sweeps" / f"{name}-cpu.yaml")
    assert big.resources.gpu >= 1
    d = big.expand()[0][1].data
    assert (d.source, d.hf_name, d.hf_config, d.tokenizer) == ("hf", "HuggingFaceFW/fineweb-edu", "sample-10BT", "gpt2")
    assert small.resources.gpu == 0 and small.expand()[0][1].data.source == "builtin"
    assert list(big.grid) == list(small.grid)
    for axis in big.grid:
        if axis not in ("seed", "preset", "n_layers"):
            assert big.grid[axis] == small.grid[axis], axis
    assert big.report.axis == small.report.axis and big.report.baseline == small.report.baseline


def test_paper_sweep_axes_match_the_paper():
    g = {n: load_spec(ROOT / "sweeps" / f"{n}.yaml").grid for n in PAPER}
    assert set(g["router-ablation-150m"]["router"]) == {"none", "average", "last-2", "last-4", "last-6", "first-2",
                                                         "first-4", "first-6", "full"}
    assert set(g["router-structure-150m"]["router"]) == {"none", "full", "no-head-mix", "per-dim"}
    assert set(g["deep-routing-128"]["router"]) == {"none", "full", "dilated-8", "dilated-16", "first-7", "first-15"}
    assert set(g["depth-scaling"]["router"]) == {"none", "full"}
    # router-lr: the planner's 7 seeds (the paper ran 5)
    assert [float(v) for v in g["router-lr"]["router_lr_mult"]] == [1, 2, 3, 4] and len(g["router-lr"]["seed"]) == 7
    rl = load_spec(ROOT / "sweeps" / "router-lr.yaml")
    assert rl.report.axis == "router_lr_mult" and float(rl.report.baseline) == 1


# -- expansion and trial ids ---------------------------------------------------------------------------
def test_trial_ids_are_readable_deterministic_and_in_file_order(tmp_path):
    p = _write(tmp_path, "mini", _good())
    a, b = load_spec(p).expand(), load_spec(p).expand()
    ids = [t for t, _ in a]
    assert ids == ["router=none,seed=0", "router=none,seed=1", "router=full,seed=0", "router=full,seed=1"]
    assert ids == [t for t, _ in b]
    cfg = dict(a)["router=full,seed=1"]
    assert cfg.model["router"] == "full" and cfg.train.seed == 1
    assert cfg.train.threads == 1 and cfg.train.checkpoint_interval == 5  # max(log_interval, steps // 5)
    assert trial_dirname("a/b" * 100).count("/") == 0 and len(trial_dirname("x" * 500)) < 130


def test_aliases_dotted_keys_and_sweep_settings_reach_the_trial(tmp_path):
    doc = _good(grid={"lr": ["1e-3", 0.002], "model.n_heads": [2, 4], "data.task.n_ops": [3]},
                checkpoint_interval=7, resources={"cpu": 2.5, "gpu": 0}, report={"axis": "lr", "baseline": "1e-3"},
                analysis={"enabled": True})
    doc["base"]["data"] = {"source": "builtin"}
    spec = load_spec(_write(tmp_path, "mini", doc))
    trials = spec.expand()
    assert len(trials) == 4 and trials[0][0] == "lr=1e-3,model.n_heads=2,data.task.n_ops=3"
    cfg = trials[-1][1]
    assert cfg.optim.lr == 0.002 and cfg.model["n_heads"] == 4 and cfg.data.task == {"n_ops": 3}
    assert cfg.train.checkpoint_interval == 7 and cfg.train.threads == 2 and cfg.train.analyze is True
    assert set(ALIASES) >= {"router", "n_layers", "seed", "lr", "router_lr_mult", "preset"}


def test_report_defaults_follow_the_axes(tmp_path):
    spec = load_spec(_write(tmp_path, "mini", _good(grid={"router_lr_mult": [1, 2], "seed": [0]})))
    assert (spec.report.axis, spec.report.baseline, spec.report.metric) == ("router_lr_mult", 1, "final/val_loss")
    spec = load_spec(_write(tmp_path, "mini", _good()))
    assert (spec.report.axis, spec.report.baseline) == ("router", "none")


def test_search_block_parses_with_seeds_from_the_grid(tmp_path):
    doc = _good(grid={"seed": [3, 4]}, search={
        "metric": "final/val_loss", "mode": "min", "num_samples": 3, "seed": 1,
        "space": {"lr": {"loguniform": ["1e-4", 1.0e-2]}, "router_lr_mult": {"uniform": [1, 4]},
                  "n_layers": {"int": [2, 4]}, "router": {"choice": ["none", "full"]}},
        "asha": {"grace_period": 10}})
    doc["base"]["optim"] = {"min_lr": 1.0e-5}  # below the smallest searched lr (validated at the bounds)
    spec = load_spec(_write(tmp_path, "mini", doc))
    s = spec.search
    assert s.repeat == 2 and s.seeds == [3, 4] and s.num_samples == 3 and spec.n_trials() == 6
    assert s.space["lr"].values == (1e-4, 1e-2) and s.space["n_layers"].kind == "int"
    assert spec.expand() == [] and "seed" not in spec.grid
    cfg = spec.trial_config({"lr": 1e-3, "router_lr_mult": 2.0, "n_layers": 3, "router": "full", "__trial_index__": 1})
    assert cfg.train.seed == 4 and cfg.model["n_layers"] == 3 and cfg.optim.router_lr_mult == 2.0
    from orchestrator.sweep.view import dry_run_text

    assert "Optuna" in dry_run_text(spec)


def test_relative_data_paths_become_absolute(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text("hello world. " * 200 + "\n\n")
    monkeypatch.chdir(tmp_path)
    doc = _good()
    doc["base"]["data"] = {"source": "text", "paths": ["corpus.txt", "corpus.txt"]}
    cfg = load_spec(_write(tmp_path, "mini", doc)).expand()[0][1]
    assert cfg.data.paths == [str(tmp_path / "corpus.txt")] * 2


# -- bad sweep files -------------------------------------------------------------------------------------
BAD: list[tuple[str, dict | str, str]] = [
    ("unknown-top-key", _good(gird={"seed": [0]}), "gird: unknown key"),
    ("unknown-base-key", _good(base={"preset": "tiny", "optim": {"lrr": 1}}), "base.optim.lrr: unknown key"),
    ("unknown-router", _good(grid={"router": ["none", "fulll"]}), "grid.router[1]: unknown router 'fulll'"),
    ("bad-router-int", _good(grid={"router": ["last-x"]}), "grid.router[0]"),
    ("unknown-preset", _good(base={"preset": "huge"}), "base.preset: unknown preset 'huge'"),
    ("unknown-axis", _good(grid={"rooter": ["full"]}), "grid.rooter: unknown key"),
    ("empty-grid", _good(grid={"router": []}), "grid.router: empty list"),
    ("grid-not-a-list", _good(grid={"seed": 3}), "grid.seed: must be a list"),
    ("negative-steps", _good(base={"preset": "tiny", "train": {"steps": -5}}), "base.train.steps: must be >= 1"),
    ("bad-cpu", _good(resources={"cpu": -1}), "resources.cpu: must be a number > 0"),
    ("bad-max-failures", _good(max_failures="two"), "max_failures: must be an integer >= 0"),
    ("grid-and-search-same-key", _good(grid={"lr": [1e-3]}, search={"space": {"lr": {"uniform": [1e-4, 1e-2]}}}),
     "grid.lr: also searched in search.space.lr"),
    ("bad-loguniform", _good(grid={}, search={"space": {"lr": {"loguniform": [0, 1e-2]}}}),
     "search.space.lr.loguniform: bounds must satisfy 0 < low < high"),
    ("unknown-distribution", _good(grid={}, search={"space": {"lr": {"logunifrom": [1e-4, 1e-2]}}}),
     "search.space.lr.logunifrom: unknown distribution"),
    ("search-range-invalid-trial", _good(grid={}, search={"space": {"n_layers": {"int": [0, 4]}}}),
     "search.space.n_layers.int: must be a positive integer"),
    ("missing-data-path", _good(base={"preset": "tiny", "data": {"source": "text", "paths": ["/nonexistent/x.txt"]}}),
     "base.data.paths: no file matches"),
    ("name-not-stem", _good(name="other"), "name: 'other' must equal the file name"),
    ("bad-report-baseline", _good(report={"baseline": "average"}), "report.baseline: 'average' is not a value"),
    ("seq-too-long", _good(grid={"seed": [0]}, base={"preset": "tiny", "model": {"max_seq_len": 16},
                                                    "train": {"seq_len": 32}}), "base.train.seq_len: 32 is longer"),
    ("bad-yaml", "name: x\n  bad: [\n", "not valid YAML"),
    # type, key and range errors of the schema (pydantic), one line each with the key path
    ("wrong-type", _good(base={"preset": "tiny", "train": {"steps": "ten"}}),
     "base.train.steps: must be an integer >= 1, got 'ten'"),
    ("unknown-resource", _good(resources={"cpu": 1, "tpu": 1}), "resources.tpu: unknown key; allowed: cpu, gpu"),
    ("zero-samples", _good(grid={}, search={"space": {"lr": {"uniform": [1e-4, 1e-2]}}, "num_samples": 0}),
     "search.num_samples: must be >= 1, got 0"),
    # a key twice: an error, not the last one silently winning; a file that is not UTF-8 text
    ("duplicate-top-key", "name: duplicate-top-key\ndescription: d\ngrid: {router: [none]}\ngrid: {router: [full]}\n",
     "not valid YAML (line 4): duplicate key 'grid' (first on line 3)"),
    ("duplicate-nested-key", "name: duplicate-nested-key\ndescription: d\nbase:\n  train: {steps: 3, steps: 4}\n",
     "not valid YAML (line 4): duplicate key 'steps'"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe" + bytes(range(256)),
     "not a text file (byte 0 is not UTF-8)"),
    # names that would collide with other folders of results/ or other MLflow experiments
    ("ray", _good(name="ray"), "name: 'ray' is reserved (results/ray holds every sweep's Ray experiment)"),
    ("bench", _good(name="bench"), "name: 'bench' is reserved"),
    ("lime-train", _good(name="lime-train"), "name: 'lime-train' is reserved (the MLflow experiment of `lime train`)"),
    # named variants
    ("variant-unknown-key", _good(grid={"variant": {"llama": {}, "lime": {"rooter": "full"}}}),
     "grid.variant.lime.rooter: unknown key"),
    ("variant-empty", _good(grid={"variant": {}, "seed": [0]}), "grid.variant: empty; give at least one named bundle"),
    ("variant-overrides-axis", _good(grid={"variant": {"llama": {}, "lime": {"router": "full"}}, "router": ["none"]}),
     "grid.variant.lime.router: also an axis of this grid (grid.router)"),
    ("variant-bad-value", _good(grid={"variant": {"llama": {}, "lime": {"router": "ful"}}}),
     "grid.variant.lime.router: unknown router 'ful'"),
    # the report's settings
    ("report-alpha", _good(report={"alpha": 1}), "report.alpha: must be in (0, 0.5], got 1"),
    ("report-tune", _good(report={"tune": "lr"}), "report.tune: 'lr' is not an axis of this sweep"),
    ("report-paper", _good(report={"paper": "Table 1"}), "report.paper: must be a short reference name"),
]


@pytest.mark.parametrize("case,doc,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_sweep_file_is_one_clear_error(tmp_path, case, doc, expect):
    p = _write(tmp_path, case, doc if isinstance(doc, (str, bytes)) else {**doc, "name": doc.get("name", case)
                                                                           if doc.get("name") != "mini" else case})
    with pytest.raises(ConfigError) as e:
        load_spec(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert expect in msg, msg
    assert msg.startswith(str(p))


def test_bad_sweep_files_exit_2_with_one_line_and_never_start_ray(tmp_path):
    """The CLI in a subprocess: each bad file -> exit 2, one stderr line; Ray is never imported and
    nothing is written to the MLflow store or the results folder."""
    paths = []
    for case, doc, expect in BAD:
        d = doc if isinstance(doc, (str, bytes)) else {**doc, "name": case if doc.get("name") == "mini"
                                                       else doc["name"]}
        paths.append((["sweep", "run", str(_write(tmp_path, case, d))], expect))
    paths.append((["sweep", "run", str(tmp_path / "missing.yaml")], "no such sweep file"))
    import torch

    if not torch.cuda.is_available():  # a GPU sweep on a machine without one: refused before Ray starts
        paths.append((["sweep", "run", str(ROOT / "sweeps" / "router-ablation-150m.yaml")],
                      "resources.gpu: 1 per trial"))
    # the command line: --add-seeds must be a positive number, and a search's seeds do not grow;
    # `sweep status` without a store says so and creates none
    default = str(ROOT / "sweeps" / "default.yaml")
    search = _write(tmp_path, "searching", _good(name="searching", grid={}, search={
        "space": {"lr": {"loguniform": [1e-3, 1e-2]}}, "num_samples": 2}))
    paths += [(["sweep", "run", default, "--add-seeds", n],
               f"--add-seeds: must be a positive integer (how many seeds to add), got '{n}'")
              for n in ("0", "-2", "1.5", "two")]
    paths += [(["sweep", "run", str(search), "--add-seeds", "2"], "--add-seeds: " + str(search) + " is a search sweep"),
              (["sweep", "run", str(search), "--add-seeds", "2", "--dry-run"], "is a search sweep"),
              (["sweep", "status", "default"], f"sweep 'default': no MLflow store at {tmp_path}/mlflow.db "
                                               "(nothing was created)")]
    script = textwrap.dedent("""
        import contextlib, io, json, sys
        from orchestrator.cli import main
        out = []
        for args in json.loads(sys.argv[1]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(args)
            out.append({"rc": rc, "stderr": err.getvalue()})
        print(json.dumps({"results": out, "ray_imported": "ray" in sys.modules}))
    """)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "LIME_RESULTS": str(tmp_path / "results"), "LIME_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-c", script, json.dumps([p for p, _ in paths])], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ray_imported"] is False
    for (path, expect), got in zip(paths, res["results"]):
        lines = got["stderr"].splitlines()
        assert got["rc"] == 2, (path, got)
        assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], (path, lines)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "results").exists()


def test_lime_executable_bad_router_exit_2_and_dry_run_starts_nothing(tmp_path):
    """The installed `lime` entry point itself: a bad file and a dry run, in fresh processes."""
    lime = Path(sys.executable).parent / "lime"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "LIME_RESULTS": str(tmp_path / "results")}
    bad = _write(tmp_path, "bad", _good(name="bad", grid={"router": ["full", "fulll"]}))
    r = subprocess.run([str(lime), "sweep", "run", str(bad)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "grid.router[1]: unknown router 'fulll'" in r.stderr
    r = subprocess.run([str(lime), "sweep", "run", str(ROOT / "sweeps" / "default.yaml"), "--dry-run"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "router=full,seed=0" in r.stdout and "train FLOPs" in r.stdout
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "results").exists()


def test_parse_spec_rejects_non_mapping_and_bad_description():
    with pytest.raises(ConfigError, match="top level"):
        parse_spec(["a"])
    with pytest.raises(ConfigError, match="description: required, one line of text"):
        parse_spec({"name": "x"})
    with pytest.raises(ConfigError, match="description: must be one line of text"):
        parse_spec({"name": "x", "description": "two\nlines"})
    with pytest.raises(ConfigError, match="grid.model.router: the same key as grid.router"):
        parse_spec({"name": "x", "description": "d", "grid": {"router": ["none"], "model.router": ["full"]}})
    with pytest.raises(ConfigError, match=r"grid.router: a grid cannot be combined with search"):
        parse_spec({"name": "x", "description": "d", "grid": {"router": ["none"]},
                    "search": {"space": {"lr": {"uniform": [0.001, 0.01]}}}})
