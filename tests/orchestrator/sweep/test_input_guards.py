"""Inputs a new user gets wrong (issue 30), each one line naming the key or file and exit 2 before
anything starts: relative data paths, empty and binary data files, YAML aliases that expand without
end, grids and models too large to run, unbounded timeouts, Ray Client addresses, names that
would become paths, report stores that cannot serve the report. Messages are asserted whole."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.sweep.spec import load_spec
from tests.sweeps import tiny

ROOT = Path(__file__).resolve().parents[3]


def _sweep(folder: Path, name: str, base: dict | None = None, **doc) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "description": "a probe", "base": base or tiny(),
                                 "resources": {"cpu": 1}, **doc}, sort_keys=False))
    return p


def _one_line(capsys, argv: list[str]) -> str:
    """Run the CLI; it must exit 2 with exactly one line on stderr and nothing on stdout."""
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and not out.strip(), (rc, out, err)
    return lines[0]


def _text_base(paths: list[str]) -> dict:
    return tiny(data={"source": "text", "paths": paths})


# -- relative data paths: resolved once, against the sweep file's folder -------------------------------
def test_relative_data_paths_resolve_against_the_sweep_files_folder(tmp_path, monkeypatch):
    notes = tmp_path / "project" / "notes"
    notes.mkdir(parents=True)
    for i in range(3):
        (notes / f"n{i}.txt").write_text(f"note {i}: " + "some words to train on. " * 40)
    path = _sweep(tmp_path / "project", "notes", _text_base(["notes/*.txt"]), grid={"seed": [0, 1]})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the driver's working directory is not the file's folder
    spec = load_spec(path)
    want = [str(notes / "*.txt")]
    assert [t.config.data.paths for t in spec.trials()] == [want, want]
    worker = tmp_path / "ray-worker-cwd"
    worker.mkdir()
    monkeypatch.chdir(worker)  # a Ray worker rebuilds the trial in another folder: the same files
    assert spec.config_of({"seed": 1}).data.paths == want
    assert spec.trial_config({"seed": 0}).data.paths == want
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0


# -- data files: non-empty UTF-8 text --------------------------------------------------------------------
@pytest.mark.parametrize("content, problem", [
    (b"", "is empty"),
    (b"  \n\t\n", "holds only whitespace"),
    (b"text first\x00\x01\x02 then binary", "is not a text file (byte 10 is a NUL byte)"),
    (b"\x89PNG\r\n\x1a\n" + bytes(range(1, 200)), "is not a text file (byte 0 is not UTF-8)"),
])
def test_an_empty_or_binary_data_file_is_one_line(tmp_path, capsys, content, problem):
    (tmp_path / "good.txt").write_text("a document of words. " * 50)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    path = _sweep(tmp_path, "files", _text_base([str(tmp_path / "good.txt"), str(bad)]))
    line = _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    assert line == (f"error: {path}: base.data.paths: {bad} {problem}; the text source reads non-empty UTF-8 "
                    "text files")


def test_a_glob_that_matches_a_binary_file_names_it_and_the_glob(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("words " * 100)
    (tmp_path / "notes" / "b.dat").write_bytes(bytes([0xff, 0xfe, 0x00, 0x41]) * 10)
    line = _one_line(capsys, ["train", "--data", "text", "--set", f"data.paths=[{tmp_path}/notes/*]", "--no-track"])
    assert line == (f"error: data.paths: {tmp_path}/notes/b.dat is not a text file (byte 2 is a NUL byte); the text "
                    f"source reads non-empty UTF-8 text files (matched by '{tmp_path}/notes/*')")


def test_utf8_text_cut_inside_a_character_by_the_sample_is_still_text(tmp_path):
    from orchestrator.engine import datafiles

    f = tmp_path / "long.txt"
    f.write_bytes(b"a" * (datafiles.SAMPLE - 1) + "é".encode() * 10)  # the sample ends inside a character
    assert datafiles.text_problem(str(f)) is None


# -- YAML aliases ----------------------------------------------------------------------------------------
def _laughs(depth: int) -> str:
    lines = ["name: laughs", "description: a probe", 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", '
             '"lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    lines.append(f"base: {{preset: tiny, x: *a{depth}}}")
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(9))  # 9^10 = 3.5e9 strings once expanded
    t0 = time.monotonic()
    line = _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    assert time.monotonic() - t0 < 30
    assert line == (f"error: {path}: expands to more than 100000 values (YAML aliases repeat their anchor's value); "
                    "a sweep file holds at most 100000 values")


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text("name: loop\ndescription: a probe\nbase: &b {preset: tiny, again: *b}\n")
    line = _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    assert line == (f"error: {path}: a YAML alias refers to a value that contains it (the file would expand "
                    "forever); a sweep file holds at most 100000 values")


def test_aliases_that_stay_small_are_fine(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text("name: shared\ndescription: a probe\nbase: {preset: tiny, model: &m {n_layers: 2, d_model: 32, "
                    "n_heads: 2, ffn_dim: 64, max_seq_len: 64}, train: {steps: 5, seq_len: 32}}\n"
                    "grid: {seed: [0, 1]}\n")
    assert len(load_spec(path).trials()) == 2


# -- size guards -----------------------------------------------------------------------------------------
def test_a_grid_of_a_million_trials_is_refused_before_any_is_built(tmp_path, capsys):
    ten = list(range(10))
    grid = {"seed": ten, "lr": [0.001 * (i + 1) for i in ten], "steps": [i + 1 for i in ten],
            "optim.warmup_steps": ten, "optim.weight_decay": [0.01 * i for i in ten], "train.eval_batches":
            [i + 1 for i in ten]}
    path = _sweep(tmp_path, "huge", grid=grid)
    t0 = time.monotonic()
    line = _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    assert time.monotonic() - t0 < 30
    assert line == (f"error: {path}: grid: 1,000,000 trials (seed (10) x lr (10) x steps (10) x optim.warmup_steps "
                    "(10) x optim.weight_decay (10) x train.eval_batches (10)) is more than the limit of 10,000 "
                    "trials per sweep; shrink it or raise $LIME_MAX_TRIALS")


def test_the_trial_limit_is_the_environments(tmp_path, capsys, monkeypatch):
    path = _sweep(tmp_path, "eight", grid={"seed": list(range(8))})
    monkeypatch.setenv("LIME_MAX_TRIALS", "4")
    assert "is more than the limit of 4 trials" in _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    monkeypatch.setenv("LIME_MAX_TRIALS", "8")
    assert len(load_spec(path).trials()) == 8
    monkeypatch.setenv("LIME_MAX_TRIALS", "many")
    assert _one_line(capsys, ["sweep", "run", str(path), "--dry-run"]) == \
        "error: $LIME_MAX_TRIALS: must be a positive whole number, got 'many'"


def _giant_line(n: str, state: str) -> str:
    return (f"the model has at least {n} parameters (d_model 1000000, n_layers 2, ffn_dim 64, vocab 256), {state}B "
            "of training state at 16 bytes per parameter, more than the limit of 20G parameters; make it smaller "
            "or raise $LIME_MAX_PARAMS")


def test_a_model_of_trillions_of_parameters_is_refused_in_the_dry_run_and_in_train(tmp_path, capsys):
    base = tiny(model={"d_model": 1_000_000})
    path = _sweep(tmp_path, "giant", base)
    # 2 layers x (q, o: 2 d^2; k, v: 2 d^2; 3 d ffn; 2 d norms) + d + 256 d (tied), by hand: 8.000388e12
    line = _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    assert line == f"error: {path}: base.model: " + _giant_line("8T", "128T")
    line = _one_line(capsys, ["train", "--preset", "tiny", "--set", "model.d_model=1000000", "--set",
                              "model.n_layers=2", "--set", "model.ffn_dim=64", "--set", "model.n_heads=2",
                              "--no-track"])
    assert line == "error: model: " + _giant_line("8T", "128T")


def test_a_grid_value_that_makes_a_giant_names_its_axis(tmp_path, capsys):
    path = _sweep(tmp_path, "grows", grid={"d_model": [32, 1_000_000]})
    line = _one_line(capsys, ["sweep", "run", str(path), "--dry-run"])
    assert line == f"error: {path}: grid.d_model[1] (1000000): model: " + _giant_line("8T", "128T")


def test_the_dry_run_states_memory_per_trial_and_the_limits(tmp_path, capsys):
    path = _sweep(tmp_path, "small")
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    from lime_arch import param_counts, preset

    n = param_counts(preset("tiny", n_layers=2, d_model=32, n_heads=2, ffn_dim=64, max_seq_len=64,
                            vocab_size=257))["total"]
    from orchestrator.core.fmt import human

    assert (f"memory per trial: up to {human(16 * n)}B of training state ({human(n)} parameters x 16 bytes: fp32 "
            "weights, gradients, AdamW moments; activations come on top); limits: 10,000 trials ($LIME_MAX_TRIALS), "
            "20G parameters per model ($LIME_MAX_PARAMS)") in out


def test_the_torch_free_guards_stay_torch_free():
    code = ("import sys; import orchestrator.engine.datafiles, orchestrator.sweep.limits, orchestrator.core.outbox, "
            "orchestrator.core.exposure, lime_arch.size; "
            "print(sorted(k for k in ('torch', 'ray', 'mlflow') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# -- connecting ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "nan", "0", "-3", "7200"])
def test_an_unbounded_connect_timeout_is_one_line(tmp_path, capsys, value):
    path = _sweep(tmp_path, "t")
    line = _one_line(capsys, ["sweep", "run", str(path), "--connect-timeout", value])
    assert line == f"error: --connect-timeout: must be a number of seconds > 0 and at most 3600, got {float(value)!r}"


def test_a_ray_client_address_is_one_line_and_nothing_else(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")  # a local store: the "note" case
    path = _sweep(tmp_path, "client")
    line = _one_line(capsys, ["sweep", "run", str(path), "--address", "ray://head:10001"])
    assert line == ("error: --address ray://head:10001: Ray Client (ray://) addresses are not supported: Tune would "
                    "run the sweep's driver loop on the head node; run `lime sweep run` on a node of the cluster "
                    "with --address <head>:6379 (the GCS port of `ray start --head`)")
    assert not (tmp_path / "m.db").exists()


# -- names on the command line, report stores --------------------------------------------------------------
NAME_RULE = "(lowercase letters, digits and '-', starting with a letter or digit: [a-z0-9][a-z0-9-]*) nor a sweep file"


@pytest.mark.parametrize("argv, where", [(["report"], "report"), (["sweep", "status"], "sweep status")])
@pytest.mark.parametrize("name", ["../../etc", "a/b", "Default", "x_y", ".."])
def test_a_name_that_is_no_sweep_name_never_reaches_a_path(tmp_path, capsys, monkeypatch, argv, where, name):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    line = _one_line(capsys, [*argv, name])
    assert line == f"error: {where}: {name!r} is not a sweep name {NAME_RULE}"
    assert sorted(os.listdir(tmp_path)) == []  # no store, no results folder


def test_a_reserved_name_is_no_sweep(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    assert _one_line(capsys, ["report", "ray"]) == \
        "error: report: 'ray' is reserved (results/ray holds every sweep's Ray experiment), not a sweep"
    assert _one_line(capsys, ["sweep", "status", "train"]) == \
        "error: sweep status: 'train' is reserved (results/train holds `lime train`'s checkpoints), not a sweep"


def test_report_against_a_missing_store_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/none.db")
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    line = _one_line(capsys, ["report", "default", "--out", str(tmp_path / "out")])
    assert line == (f"error: sweep 'default': no MLflow store at {tmp_path}/none.db (nothing was created); set "
                    "MLFLOW_TRACKING_URI to the store the sweep ran with")
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "out").exists()


def test_report_against_the_database_of_a_server_store_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    """An `mlflow server --artifacts-destination` store records mlflow-artifacts:/ locations, which
    only that server resolves: read through its sqlite file, the report could not be logged."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/server.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    MlflowClient(tracking_uri=uri).create_experiment("served", artifact_location="mlflow-artifacts:/7")
    line = _one_line(capsys, ["report", "served", "--out", str(tmp_path / "out")])
    assert line == ("error: report: the artifacts of sweep 'served' are served by an MLflow server "
                    f"(mlflow-artifacts:/7), but MLFLOW_TRACKING_URI is its database ({uri}); set "
                    "MLFLOW_TRACKING_URI to that server (http://<host>:<port>)")
    assert not (tmp_path / "out").exists()


# -- safe defaults ---------------------------------------------------------------------------------------
def test_the_cli_turns_telemetry_off_unless_asked(tmp_path, monkeypatch, capsys):
    for k in ("RAY_USAGE_STATS_ENABLED", "MLFLOW_DISABLE_TELEMETRY", "LIME_TELEMETRY"):
        monkeypatch.delenv(k, raising=False)
    main(["report", "../x"])
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0" and os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    for k in ("RAY_USAGE_STATS_ENABLED", "MLFLOW_DISABLE_TELEMETRY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("LIME_TELEMETRY", "1")
    main(["report", "../x"])
    assert "RAY_USAGE_STATS_ENABLED" not in os.environ and "MLFLOW_DISABLE_TELEMETRY" not in os.environ
    capsys.readouterr()


def test_the_ray_token_file_is_private(tmp_path, monkeypatch):
    from orchestrator.core import exposure

    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(k, raising=False)
    made = exposure.private_token_file()
    assert made == tmp_path / ".ray" / "auth_token" and made.stat().st_mode & 0o777 == 0o600
    assert len(made.read_text()) == 64 and int(made.read_text(), 16) >= 0  # 256 bits in hex, as Ray writes it
    made.chmod(0o644)  # as `ray get-auth-token --generate` leaves it
    exposure.private_token_file(create=False)
    assert made.stat().st_mode & 0o777 == 0o600
    made.unlink()
    assert exposure.private_token_file(create=False) is None and not made.exists()  # a joining driver: none made
