"""The commands that read a trained model (``lime eval``, ``export``, ``prune``, ``analyze``) and the
reports refuse a mistake with one line and exit code 2, before any work, before anything is written
and before a store is created: a checkpoint that is none (read as ``lime train --resume`` reads
it), an output path that cannot be written, a run id that is not in the store, a bad flag, and
a second target or label that is wrong after a good first one. Each expected value is the whole
error line, written out by hand."""
from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig

UNWRITABLE = "/sys/lime-out"  # /sys refuses new files to every user, root included


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two tiny trained checkpoints: a prunable router (full) and one that is not (none)."""
    root = tmp_path_factory.mktemp("trained")
    out = {}
    for router in ("full", "none"):
        cfg = TrialConfig.from_dict({
            "preset": "tiny", "model": {"router": router, "n_layers": 2, "d_model": 16, "n_heads": 2, "ffn_dim": 32},
            "train": {"steps": 2, "batch_size": 2, "seq_len": 16, "log_interval": 1, "eval_batches": 1,
                      "checkpoint_dir": str(root / router)}})
        run_trial(cfg, tracking=Tracking(enabled=False))
        out[router] = root / router
    return out


@pytest.fixture
def junk(tmp_path):
    f = tmp_path / "random.bin"
    f.write_bytes(bytes(range(256)) * 8)
    return f


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err.rstrip("\n")


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """A store that does not exist, in a folder that does not exist either."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/track/mlflow.db")
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    return tmp_path


def test_random_bytes_as_a_checkpoint_is_one_line_in_every_command(capsys, junk, nowhere):
    line = f"error: checkpoint {junk}: cannot be read as a checkpoint: not a file torch.save wrote"
    for argv in (["eval", str(junk), "--tasks", "lime_kv", "--no-log"], ["export", str(junk), "--to", "exp"],
                 ["prune", str(junk), "--top-p", "0.9", "--no-log"], ["analyze", str(junk)]):
        assert _refused(capsys, argv) == line, argv
    # the same file given to `lime train --resume`: the same reader, its own hint
    assert _refused(capsys, ["train", "--resume", str(junk)]) == (
        f"error: --resume {junk}: cannot be read as a checkpoint: not a file torch.save wrote; to start fresh, run "
        "without --resume")
    assert sorted(p.name for p in nowhere.iterdir()) == ["random.bin"]  # no store, no cache, no results


def test_bad_flags_are_refused_before_the_model_loads(capsys, trained, nowhere):
    ck = str(trained["full"])
    assert _refused(capsys, ["eval", ck, "--tasks", "lime_kv", "--device", "tpu", "--no-log"]) == (
        "error: --device: must be auto, cpu, cuda or cuda:<index>, got 'tpu'")
    assert _refused(capsys, ["analyze", ck, "--sequences", "0"]) == "error: --sequences: must be >= 1, got 0"
    for alpha in ("inf", "nan", "0"):
        assert _refused(capsys, ["analyze", ck, "--alpha", alpha]) == (
            f"error: --alpha: must be a finite number > 0 (the Renyi entropy's order), got {float(alpha)}")
    for margin in ("inf", "-1"):
        assert _refused(capsys, ["prune", ck, ck, "--top-p", "0.9", "--margin", margin, "--no-log"]) == (
            f"error: --margin: must be a finite number > 0 (nats of loss), got {float(margin)}")
    both = "error: --run-id: names the run to log to, but --no-log logs nothing; drop one of them"
    assert _refused(capsys, ["eval", ck, "--tasks", "lime_kv", "--run-id", "abc", "--no-log"]) == both
    assert _refused(capsys, ["prune", ck, "--top-p", "0.9", "--run-id", "abc", "--no-log"]) == both
    assert list(nowhere.iterdir()) == []


def test_outputs_that_cannot_be_written_are_refused_before_the_work(capsys, trained, nowhere):
    ck = str(trained["full"])
    (nowhere / "afile").write_text("mine\n")
    (nowhere / "adir").mkdir()
    cases = [
        (["eval", ck, "--tasks", "lime_kv", "--no-log", "--out", "afile"], "--out", "folder"),
        (["analyze", ck, "--out", "afile"], "--out", "folder"),
        (["report", "some-sweep", "--out", "afile"], "--out", "folder"),
        (["report", "--pool", "a,b", "--out", "afile"], "--out", "folder"),
        (["prune", ck, "--top-p", "0.9", "--no-log", "--save", "afile"], "--save", "folder"),
        (["export", ck, "--to", "afile"], "--to", "folder"),
        (["prune", ck, "--top-p", "0.9", "--no-log", "--out", "adir"], "--out", "file"),
    ]
    for argv, flag, kind in cases:
        where = argv[argv.index(flag) + 1]
        why = {"folder": "is an existing file; the command writes a folder there",
               "file": "is a folder; give the path of the file to write"}[kind]
        expected = f"error: {flag}: {where!r} {why}"
        assert _refused(capsys, argv) == expected, argv
    for argv in (["eval", ck, "--tasks", "lime_kv", "--no-log", "--out", UNWRITABLE],
                 ["analyze", ck, "--out", UNWRITABLE], ["report", "some-sweep", "--out", UNWRITABLE],
                 ["export", ck, "--to", UNWRITABLE], ["prune", ck, "--top-p", "0.9", "--no-log", "--save", UNWRITABLE]):
        flag = argv[-2]
        assert _refused(capsys, argv) == (
            f"error: {flag}: cannot write under '/sys' (Permission denied); choose a folder you can write to "
            f"(got {UNWRITABLE!r})"), argv
    for argv, flag, kind in [(["eval", ck, "--tasks", "lime_kv", "--no-log", "--out", ""], "--out", "folder"),
                             (["analyze", ck, "--out", ""], "--out", "folder"),
                             (["export", ck, "--to", ""], "--to", "folder"),
                             (["prune", ck, "--top-p", "0.9", "--no-log", "--save", ""], "--save", "folder"),
                             (["prune", ck, "--top-p", "0.9", "--no-log", "--out", " "], "--out", "file")]:
        assert _refused(capsys, argv) == f"error: {flag}: empty; give the path of the {kind} to write", argv
    assert (nowhere / "afile").read_text() == "mine\n"
    assert sorted(p.name for p in nowhere.iterdir()) == ["adir", "afile"]  # no store, no results, no cache
    assert list((nowhere / "adir").iterdir()) == []


def test_a_run_id_that_is_not_found_creates_nothing(capsys, nowhere):
    store = nowhere / "track" / "mlflow.db"
    for argv in (["eval", "0123abcd", "--tasks", "lime_kv"], ["export", "0123abcd", "--to", "exp"],
                 ["prune", "0123abcd", "--top-p", "0.9"]):
        assert _refused(capsys, argv) == (
            f"error: '0123abcd' is neither a checkpoint (file or folder) nor an MLflow run id: there is no MLflow "
            f"store at {store} (nothing was created; set MLFLOW_TRACKING_URI to the store of the run)"), argv
    assert _refused(capsys, ["report", "--pool", "sweep-a,sweep-b"]) == (
        f"error: sweep 'sweep-a': no MLflow store at {store} (nothing was created); set MLFLOW_TRACKING_URI to the "
        "store the sweep ran with")
    assert list(nowhere.iterdir()) == []  # no tracking folder, no mlflow.db, no results


def test_the_default_store_is_not_created_either(capsys, nowhere, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert _refused(capsys, ["prune", "0123abcd", "--top-p", "0.9"]).endswith(
        f"there is no MLflow store at {nowhere / 'mlflow.db'} (nothing was created; set MLFLOW_TRACKING_URI to the "
        "store of the run)")
    assert list(nowhere.iterdir()) == []


def test_a_bad_second_target_or_label_stops_before_any_compute(capsys, trained, nowhere, monkeypatch):
    import orchestrator.cli.analyze as analyze
    import orchestrator.cli.prune as prune

    def no_compute(*a, **k):
        raise AssertionError("computed before the refusal")

    monkeypatch.setattr(prune, "prune_checkpoint", no_compute)
    monkeypatch.setattr(analyze, "analyze_model", no_compute)
    good, bad = trained["full"], trained["none"]
    assert _refused(capsys, ["prune", str(good), str(bad), "--top-p", "0.9", "--no-log"]) == (
        f"error: {bad / 'checkpoint.pt'}: --top-p: router 'none' (kind identity) cannot be pruned; prunable: routers "
        "of kind linear (full, first-<j>, last-<j>, dilated-<d>)")
    assert _refused(capsys, ["analyze", f"x={good}", f"x={bad}", "--out", "an"]) == (
        "error: checkpoints: two checkpoints are labelled 'x'; name them label=path")
    # a missing --include folder: refused before the local tasks are written to the cache
    assert _refused(capsys, ["eval", str(good), "--tasks", "lime_kv", "--include", "no-such-folder", "--no-log"]) == (
        "error: --include[0]: 'no-such-folder' is not a folder (of harness task YAML files)")
    assert list(nowhere.iterdir()) == []


def test_a_cuda_device_where_torch_sees_none_is_one_line(capsys, trained, nowhere):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert _refused(capsys, ["eval", str(trained["full"]), "--tasks", "lime_kv", "--device", "cuda:0", "--no-log"]) == (
        "error: --device: 'cuda:0', but torch sees 0 CUDA device(s) here; use cpu or auto")
    assert list(nowhere.iterdir()) == []


def test_a_checkpoints_own_run_in_a_store_that_is_not_there(capsys, trained, nowhere, monkeypatch):
    import torch

    import orchestrator.cli.analyze as analyze

    ck = torch.load(trained["full"] / "checkpoint.pt", weights_only=True)
    f = nowhere / "with-run.pt"
    torch.save({**ck, "run_id": "feedbeef"}, f)
    # eval logs to the checkpoint's run unless --no-log: refused before the model loads, nothing created
    assert _refused(capsys, ["eval", str(f), "--tasks", "lime_kv"]) == (
        f"error: run feedbeef: no MLflow store at {nowhere / 'track' / 'mlflow.db'} (nothing was created); set "
        "MLFLOW_TRACKING_URI to the store the run was logged to, or --no-log")

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(analyze, "analyze_model", stop)
    with pytest.raises(Stop):  # analyze has no --no-log: it says the run is not there and goes on
        main(["analyze", f"x={f}", "--out", str(nowhere / "an")])
    assert capsys.readouterr().out == (
        f"x: not logged: its run feedbeef is not in the MLflow store sqlite:///{nowhere}/track/mlflow.db\n")
    assert sorted(p.name for p in nowhere.iterdir()) == ["with-run.pt"]


def test_a_checkpoint_whose_config_or_weights_are_not_a_models_is_one_line_in_every_command(capsys, trained, nowhere):
    import torch

    from lime_arch.config import PRESETS

    ck = torch.load(trained["full"] / "checkpoint.pt", weights_only=True)
    first = next(iter(ck["model"]))
    shape = tuple(ck["model"][first].shape)
    files = {"preset.pt": {**ck, "config": {**ck["config"], "preset": "7b"}},
             "shape.pt": {**ck, "model": {**ck["model"], first: torch.zeros(3, 3)}},
             "missing.pt": {**ck, "model": {k: v for k, v in ck["model"].items() if k != first}},
             "extra.pt": {**ck, "model": {**ck["model"], "stray.weight": torch.zeros(1)}},
             "strings.pt": {**ck, "model": {first: "not a tensor"}}}
    for name, content in files.items():
        torch.save(content, nowhere / name)
    why = {"preset.pt": "its trial config does not validate with this code (preset: unknown preset '7b'; allowed: "
                        f"{', '.join(PRESETS)})",
           "shape.pt": f"its weights do not fit the model its config makes (1 of another shape: {first} (3, 3), the "
                       f"model's {shape})",
           "missing.pt": f"its weights do not fit the model its config makes (1 missing: {first})",
           "extra.pt": "its weights do not fit the model its config makes (1 unexpected: stray.weight)",
           "strings.pt": "its model or config is not a lime checkpoint's (a mapping of tensors and a trial config)"}
    for name in files:
        f = nowhere / name
        for argv in (["eval", str(f), "--tasks", "lime_kv", "--no-log"], ["export", str(f), "--to", "exp"],
                     ["prune", str(f), "--top-p", "0.9", "--no-log"], ["analyze", str(f), "--out", "an"]):
            assert _refused(capsys, argv) == f"error: checkpoint {f}: {why[name]}", argv
    assert sorted(p.name for p in nowhere.iterdir()) == sorted(files)  # nothing written beside them


def test_prune_replaces_only_its_own_summary(capsys, trained, nowhere):
    notes = nowhere / "notes.md"
    notes.write_text("# my notes\n")
    assert _refused(capsys, ["prune", str(trained["full"]), "--top-p", "0.9", "--no-log", "--out", str(notes)]) == (
        f"error: --out: {str(notes)!r} is an existing file that lime prune did not write; give a new path (only an "
        "earlier output of lime prune is replaced)")
    assert notes.read_text() == "# my notes\n"
    mine = nowhere / "mine.md"
    for _ in range(2):  # the second run replaces the first one's summary
        assert main(["prune", str(trained["full"]), "--top-p", "0.9", "--no-log", "--out", str(mine)]) == 0
        assert f"wrote {mine}" in capsys.readouterr().out
    assert mine.read_text().startswith("# Post-hoc top-p pruning of router weights (top_p = 0.9)\n")


def test_analyze_run_id_in_a_missing_store_names_analyzes_own_way_out(capsys, trained, nowhere):
    # analyze has no --no-log: its line says to leave --run-id out instead
    assert _refused(capsys, ["analyze", str(trained["full"]), "--run-id", "abc", "--out", "an"]) == (
        f"error: --run-id abc: no MLflow store at {nowhere / 'track' / 'mlflow.db'} (nothing was created); set "
        "MLFLOW_TRACKING_URI to the store the run was logged to, or leave out --run-id (each checkpoint's own run is "
        "logged to where the store has it)")
    assert list(nowhere.iterdir()) == []


def test_reports_own_folder_and_pool_names_are_checked_before_the_store(capsys, nowhere):
    (nowhere / "out").mkdir()
    (nowhere / "out" / "some-sweep").write_text("a file where the report's folder goes\n")
    assert _refused(capsys, ["report", "some-sweep", "--out", "out"]) == (
        "error: --out: 'out/some-sweep' is an existing file; the command writes a folder there")
    (nowhere / "out" / "pool-a-b").write_text("x\n")
    assert _refused(capsys, ["report", "--pool", "a,b", "--out", "out"]) == (
        "error: --out: 'out/pool-a-b' is an existing file; the command writes a folder there")
    for pool in ("a", "a,a", ","):  # refused before the (missing) store is looked at
        assert _refused(capsys, ["report", "--pool", pool, "--out", "out"]) == (
            f"error: report --pool: name two or more different sweeps, got {pool!r}")
    assert sorted(p.name for p in nowhere.iterdir()) == ["out"]
    assert sorted(p.name for p in (nowhere / "out").iterdir()) == ["pool-a-b", "some-sweep"]


def test_analyze_reads_a_trial_folder_with_equals_signs_as_a_path(capsys, trained, nowhere, monkeypatch):
    import shutil

    import orchestrator.cli.analyze as analyze

    trial = nowhere / "router=full,seed=0"  # how a sweep names its trials' folders
    shutil.copytree(trained["full"], trial)
    seen = []

    class Stop(Exception):
        pass

    def stop(model, data, **k):
        seen.append(type(model).__name__)
        raise Stop

    monkeypatch.setattr(analyze, "analyze_model", stop)
    for spec in (str(trial), f"mine={trial}"):
        with pytest.raises(Stop):  # opened and built: the analysis itself is what is stubbed
            main(["analyze", spec, "--out", str(nowhere / "an")])
    assert seen == ["LIMeDecoder", "LIMeDecoder"]
    assert _refused(capsys, ["analyze", "mine=", "--out", "an"]) == (
        "error: checkpoints: 'mine=' names no checkpoint after its label; give label=path")


def test_eval_of_a_synthetic_task_model_is_refused_before_task_data_is_written(capsys, nowhere):
    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "ffn_dim": 32, "max_seq_len": 64},
        "data": {"source": "kv-recall", "task": {"n_pairs": 3}, "n_train": 100, "n_val": 30},
        "train": {"steps": 1, "batch_size": 2, "seq_len": 64, "log_interval": 1, "eval_batches": 1,
                  "checkpoint_dir": str(nowhere / "task")}})
    run_trial(cfg, tracking=Tracking(enabled=False))
    made = sorted(map(str, nowhere.rglob("*")))
    assert _refused(capsys, ["eval", str(nowhere / "task"), "--tasks", "lime_kv", "--no-log"]) == (
        "error: data.source: the trial was trained on the synthetic task 'kv-recall', whose character vocabulary "
        "cannot read the text of downstream tasks; evaluate trials of the builtin, text or hf sources (byte, bpe, "
        "GPT-2 or tokenizer.json tokenizers)")
    assert sorted(map(str, nowhere.rglob("*"))) == made  # lime_kv's data was not generated into the cache
