"""Sweep files as small diffs: ``extends`` (deep merge of mappings, lists replaced), ``replace``,
chains, cycles, missing parents, shared bases, and the resolved file that the parent run logs."""
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
from orchestrator.sweep.files import is_base, resolve, resolved_yaml, sweep_files
from orchestrator.sweep.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "sweeps"

PARENT = {
    "name": "parent", "description": "the parent sweep",
    "base": {"preset": "tiny",
             "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
             "data": {"source": "builtin"},
             "optim": {"lr": 0.005, "min_lr": 0.0005, "warmup_steps": 5},
             "train": {"steps": 20, "batch_size": 4, "seq_len": 32, "log_interval": 5, "eval_interval": 10}},
    "grid": {"router": ["none", "full", "first-2"], "seed": [0, 1, 2]},
    "resources": {"cpu": 1, "gpu": 0},
    "max_failures": 3,
    "report": {"metric": "final/val_loss", "axis": "router", "baseline": "none"},
}


def _write(folder: Path, name: str, doc: dict | str) -> Path:
    p = folder / f"{name}.yaml"
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return p


def _flat_twin(folder: Path, name: str, doc: dict) -> Path:
    """The same sweep written out in full in another folder (no extends)."""
    folder.mkdir(exist_ok=True)
    return _write(folder, name, doc)


# -- merge semantics ---------------------------------------------------------------------------------
def test_child_merges_mappings_deeply_and_replaces_lists(tmp_path):
    _write(tmp_path, "parent", PARENT)
    child = _write(tmp_path, "child", {
        "name": "child", "description": "fewer seeds, longer training", "extends": "parent",
        "base": {"train": {"steps": 30}, "optim": {"lr": 0.004}},
        "grid": {"seed": [5, 6]},
        "resources": {"cpu": 0.5},
        "report": {"metric": "final/val_ppl"}})
    spec = load_spec(child)
    base = spec.base
    # deep merge: only the written leaves change, every other key of the parent stays
    assert base["train"] == {**PARENT["base"]["train"], "steps": 30}
    assert base["optim"] == {**PARENT["base"]["optim"], "lr": 0.004}
    assert base["model"] == PARENT["base"]["model"] and base["preset"] == "tiny"
    # lists replace: the seed axis is the child's, the router axis the parent's, in the parent's order
    assert spec.grid == {"router": ["none", "full", "first-2"], "seed": [5, 6]}
    assert [t.trial_id for t in spec.trials()][:3] == ["router=none,seed=5", "router=none,seed=6",
                                                       "router=full,seed=5"]
    assert (spec.resources.cpu, spec.resources.gpu) == (0.5, 0.0)
    assert spec.max_failures == 3  # inherited
    assert (spec.report.metric, spec.report.axis, spec.report.baseline) == ("final/val_ppl", "router", "none")
    assert (spec.name, spec.description, spec.extends) == ("child", "fewer seeds, longer training", "parent")
    cfg = spec.trials()[-1].config
    assert cfg.train.steps == 30 and cfg.optim.lr == 0.004 and cfg.optim.min_lr == 0.0005 and cfg.train.seed == 6


def test_an_extension_equals_the_same_sweep_written_out(tmp_path):
    """Trials, configs and fingerprint of a child are those of the merged file written in full."""
    _write(tmp_path, "parent", PARENT)
    child = _write(tmp_path, "child", {"name": "child", "description": "d", "extends": "parent",
                                       "base": {"model": {"n_layers": 3}}, "grid": {"router": ["none", "full"]}})
    full = {**PARENT, "name": "child", "description": "d",
            "base": {**PARENT["base"], "model": {**PARENT["base"]["model"], "n_layers": 3}},
            "grid": {"router": ["none", "full"], "seed": [0, 1, 2]}}
    a, b = load_spec(child), load_spec(_flat_twin(tmp_path / "flat", "child", full))
    assert a.expand() == b.expand() and len(a.expand()) == 6
    assert a.fingerprint() == b.fingerprint()


def test_overriding_a_grid_axis_changes_the_trials(tmp_path):
    _write(tmp_path, "parent", PARENT)
    spec = load_spec(_write(tmp_path, "child", {"name": "child", "description": "d", "extends": "parent",
                                                "grid": {"router": ["full", "none"], "n_layers": [2, 4]}}))
    assert spec.grid == {"router": ["full", "none"], "seed": [0, 1, 2], "n_layers": [2, 4]}  # a new axis comes last
    assert spec.n_trials() == 12 and spec.trials()[0].trial_id == "router=full,seed=0,n_layers=2"
    # the inherited report compares against none: an axis without it is refused, naming where it was set
    child = _write(tmp_path, "child2", {"name": "child2", "description": "d", "extends": "parent",
                                        "grid": {"router": ["full", "first-2"]}})
    assert _load_error(child) == (f"{child}: report.baseline: 'none' is not a value of grid.router (full, first-2) "
                                  f"(set in {tmp_path / 'parent.yaml'})")
    _write(tmp_path, "child2", {"name": "child2", "description": "d", "extends": "parent",
                                "grid": {"router": ["full", "first-2"]}, "report": {"baseline": "full"}})
    assert load_spec(child).report.baseline == "full"


def test_replace_takes_a_mapping_whole(tmp_path):
    _write(tmp_path, "parent", PARENT)
    spec = load_spec(_write(tmp_path, "whole", {
        "name": "whole", "description": "d", "extends": "parent", "replace": ["base"],
        "base": {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64}}}))
    assert spec.base == {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64}}
    assert spec.expand()[0][1].train.steps == 200  # TrainConfig's default: nothing of the parent's train
    spec = load_spec(_write(tmp_path, "part", {"name": "part", "description": "d", "extends": "parent",
                                               "replace": ["base.optim"], "base": {"optim": {"lr": 0.002}}}))
    assert spec.base["optim"] == {"lr": 0.002} and spec.base["train"] == PARENT["base"]["train"]
    assert spec.replace == ["base.optim"] and spec.resolved["replace"] == ["base.optim"]


def test_a_chain_applies_nearest_last(tmp_path):
    _write(tmp_path, "_shared", {"base": {"train": {"steps": 11, "batch_size": 2}}, "max_failures": 5,
                                 "resources": {"cpu": 2}})
    _write(tmp_path, "parent", {**PARENT, "extends": "_shared", "resources": {"gpu": 0}})
    spec = load_spec(_write(tmp_path, "child", {"name": "child", "description": "d", "extends": "parent",
                                                "base": {"train": {"batch_size": 3}}}))
    t = spec.expand()[0][1].train
    assert (t.steps, t.batch_size) == (20, 3)  # parent over the shared base, the child over both
    assert spec.max_failures == 3 and spec.resources.cpu == 2.0
    assert [p.name for p in resolve(yaml.safe_load((tmp_path / "child.yaml").read_text()),
                                    tmp_path / "child.yaml").chain] == ["parent.yaml", "_shared.yaml"]


# -- one-line errors ---------------------------------------------------------------------------------------
def _load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_spec(path)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_cycle_and_missing_parent_are_one_line_errors(tmp_path):
    _write(tmp_path, "a", {**PARENT, "name": "a", "extends": "b"})
    _write(tmp_path, "b", {"extends": "a", "max_failures": 1})
    msg = _load_error(tmp_path / "a.yaml")
    assert msg.startswith(f"{tmp_path / 'b.yaml'}: extends: a cycle (a -> b -> a)"), msg
    msg = _load_error(_write(tmp_path, "self", {**PARENT, "name": "self", "extends": "self"}))
    assert "extends: a cycle (self -> self)" in msg
    msg = _load_error(_write(tmp_path, "orphan", {**PARENT, "name": "orphan", "extends": "nowhere"}))
    assert msg.startswith(f"{tmp_path / 'orphan.yaml'}: extends: no file {tmp_path / 'nowhere.yaml'}"), msg
    msg = _load_error(_write(tmp_path, "badref", {**PARENT, "name": "badref", "extends": "../parent"}))
    assert "extends: must be the name of a sweep file in the same folder" in msg


def test_a_shared_base_is_refused_and_holds_no_name(tmp_path):
    base = _write(tmp_path, "_common", {"base": PARENT["base"], "resources": {"cpu": 1}})
    _write(tmp_path, "user", {"name": "user", "description": "d", "extends": "_common",
                              "grid": {"router": ["none", "full"]}})
    assert is_base(base) and [p.stem for p in sweep_files(tmp_path)] == ["user"]
    msg = _load_error(base)
    assert msg == (f"{base}: a shared base for other sweeps (its file name starts with '_'), not a sweep; "
                   "run one that extends it: user")
    _write(tmp_path, "_named", {"name": "named", "base": PARENT["base"]})
    msg = _load_error(_write(tmp_path, "user2", {"name": "user2", "description": "d", "extends": "_named"}))
    assert msg.startswith(f"{tmp_path / '_named.yaml'}: name: a shared base"), msg


def test_name_and_description_are_not_inherited(tmp_path):
    _write(tmp_path, "parent", PARENT)
    assert "description: required, one line of text" in _load_error(
        _write(tmp_path, "child", {"name": "child", "extends": "parent"}))
    assert "name: required" in _load_error(_write(tmp_path, "child2", {"description": "d", "extends": "parent"}))


def test_an_inherited_mistake_names_the_file_that_set_it(tmp_path):
    _write(tmp_path, "_bad", {"base": {"train": {"steps": 0}}})
    child = _write(tmp_path, "child", {**PARENT, "name": "child", "extends": "_bad",
                                       "base": {**PARENT["base"], "train": {"batch_size": 4}}})
    msg = _load_error(child)
    assert msg == f"{child}: base.train.steps: must be >= 1, got 0 (set in {tmp_path / '_bad.yaml'})"
    _write(tmp_path, "_broken", "base: {train: [\n")
    msg = _load_error(_write(tmp_path, "child2", {**PARENT, "name": "child2", "extends": "_broken"}))
    assert msg.startswith(f"{tmp_path / '_broken.yaml'}: not valid YAML"), msg


def test_replace_mistakes(tmp_path):
    _write(tmp_path, "parent", PARENT)
    msg = _load_error(_write(tmp_path, "alone", {**PARENT, "name": "alone", "replace": ["base"]}))
    assert "replace: only with extends" in msg
    msg = _load_error(_write(tmp_path, "missing", {"name": "missing", "description": "d", "extends": "parent",
                                                   "replace": ["base.optim"]}))
    assert "replace: base.optim is not in this file" in msg
    msg = _load_error(_write(tmp_path, "scalar", {"name": "scalar", "description": "d", "extends": "parent",
                                                  "replace": ["max_failures"], "max_failures": 1}))
    assert "replace: max_failures is not a mapping" in msg
    with pytest.raises(ConfigError, match="extends: the file's folder is needed"):
        parse_spec({"name": "x", "description": "d", "extends": "parent"})


def test_extends_errors_exit_2_with_one_line(tmp_path):
    _write(tmp_path, "a", {**PARENT, "name": "a", "extends": "b"})
    _write(tmp_path, "b", {"extends": "a"})
    _write(tmp_path, "_base", {"base": PARENT["base"]})
    cases = [(tmp_path / "a.yaml", "extends: a cycle"), (tmp_path / "_base.yaml", "a shared base"),
             (_write(tmp_path, "orphan", {**PARENT, "name": "orphan", "extends": "nowhere"}), "extends: no file")]
    script = textwrap.dedent("""
        import contextlib, io, json, sys
        from orchestrator.cli import main
        out = []
        for path in json.loads(sys.argv[1]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                out.append({"rc": main(["sweep", "run", path]), "stderr": err.getvalue()})
        print(json.dumps(out))
    """)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "LIME_RESULTS": str(tmp_path / "results")}
    r = subprocess.run([sys.executable, "-c", script, json.dumps([str(p) for p, _ in cases])], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    for (path, expect), got in zip(cases, json.loads(r.stdout.strip().splitlines()[-1])):
        lines = got["stderr"].splitlines()
        assert got["rc"] == 2 and len(lines) == 1 and expect in lines[0], (path, got)
    assert not (tmp_path / "mlflow.db").exists()


# -- the shipped files ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sweep_files(SHIPPED), ids=[p.stem for p in sweep_files(SHIPPED)])
def test_the_resolved_file_is_a_complete_sweep_that_runs_the_same_trials(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(path.relative_to(ROOT))
    text = resolved_yaml(spec.resolved)
    data = yaml.safe_load(text)
    assert "extends" not in data and "replace" not in data and list(data)[:2] == ["name", "description"]
    again = parse_spec(data, stem=spec.name)
    assert again.expand() == spec.expand() and again.fingerprint() == spec.fingerprint()
    assert (again.report, again.resources, again.max_failures) == (spec.report, spec.resources, spec.max_failures)


def test_cpu_twins_extend_their_gpu_twins_and_fineweb_is_written_once():
    twins = 0
    for p in sweep_files(SHIPPED):  # a CPU miniature of a GPU sweep extends it
        gpu = {"aet-cpu": "aet", "prosqa-cpu": "prosqa-150m"}.get(p.stem, p.stem[: -len("-cpu")])
        if p.stem.endswith("-cpu") and (SHIPPED / f"{gpu}.yaml").is_file():
            assert yaml.safe_load(p.read_text())["extends"] == gpu, p.name
            twins += 1
    assert twins >= 7
    texts = {p.name: p.read_text() for p in SHIPPED.glob("*.yaml")}
    assert [n for n, t in texts.items() if "HuggingFaceFW/fineweb-edu" in t] == ["_fineweb-edu.yaml"]
    bases = [p for p in SHIPPED.glob("_*.yaml")]
    assert bases, "the shared bases are _name.yaml files"
    for b in bases:  # every shared base is used, and refused as a sweep
        assert any(b.stem == yaml.safe_load(t).get("extends") for t in texts.values()), b.name
        with pytest.raises(ConfigError, match="a shared base"):
            load_spec(b)


def test_the_parent_run_logs_the_file_as_written_and_resolved(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from orchestrator.core.tracking import client, experiment_id
    from orchestrator.sweep.mlflow_runs import parent_run

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(ROOT)
    spec = load_spec("sweeps/router-lr-cpu.yaml")
    cl = client(uri)
    rid = parent_run(spec, cl, experiment_id(spec.name, cl), {})
    arts = sorted(a.path for a in cl.list_artifacts(rid, "sweep"))
    assert arts == ["sweep/router-lr-cpu.resolved.yaml", "sweep/router-lr-cpu.yaml"]
    resolved = yaml.safe_load(Path(cl.download_artifacts(rid, arts[0], str(tmp_path))).read_text())
    assert resolved["grid"] == {"router_lr_mult": [1, 2, 3, 4], "seed": [0, 1, 2, 3, 4, 5, 6]}  # from router-lr
    assert resolved["report"] == {"metric": "final/val_loss", "axis": "router_lr_mult", "baseline": 1}
    params = cl.get_run(rid).data.params
    assert params["sweep.extends"] == "router-lr" and params["sweep.fingerprint"] == spec.fingerprint()
