"""``lime train --resume`` with what a user may hand it (issue 30): a missing folder, an empty one,
random bytes, a checkpoint cut short, a torch file of other content, a checkpoint of another
model than the flags make. Each is one line saying what is wrong and how to start fresh, exit 2,
before anything trains; a good checkpoint resumes with its own config. And ``lime train``'s
default checkpoints go to the results folder, never the temp dir."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from orchestrator.cli import main

SMALL = ["--preset", "tiny", "--set", "model.n_layers=2", "--set", "model.d_model=32", "--set", "model.n_heads=2",
         "--set", "model.ffn_dim=64", "--set", "train.batch_size=2", "--set", "train.seq_len=16", "--set",
         "train.eval_batches=1", "--set", "train.log_interval=2", "--set", "train.eval_interval=2"]
FRESH = "to start fresh, run without --resume"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real checkpoint folder of a 2-step run of the SMALL model."""
    d = tmp_path_factory.mktemp("ck") / "run"
    assert main(["train", *SMALL, "--steps", "2", "--set", f"train.checkpoint_dir={d}", "--no-track"]) == 0
    return d


def _fails(capsys, argv: list[str]) -> str:
    rc = main(["train", *argv, "--no-track"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "step" not in out, (rc, out, err)
    return lines[0]


def test_a_missing_folder(tmp_path, capsys):
    assert _fails(capsys, ["--resume", str(tmp_path / "gone")]) == \
        f"error: --resume {tmp_path}/gone: no such file or folder; {FRESH}"


def test_an_empty_folder(tmp_path, capsys):
    assert _fails(capsys, ["--resume", str(tmp_path)]) == \
        f"error: --resume {tmp_path}: a folder without checkpoint.pt (a trial's checkpoint folder holds one); {FRESH}"


def test_a_file_of_random_bytes(tmp_path, capsys):
    f = tmp_path / "checkpoint.pt"
    f.write_bytes(os.urandom(4096))
    assert _fails(capsys, ["--resume", str(f)]) == \
        f"error: --resume {f}: cannot be read as a checkpoint: not a file torch.save wrote; {FRESH}"


def test_an_empty_file(tmp_path, capsys):
    f = tmp_path / "checkpoint.pt"
    f.write_bytes(b"")
    assert _fails(capsys, ["--resume", str(tmp_path)]) == \
        f"error: --resume {f}: an empty file, not a checkpoint; {FRESH}"


def test_a_truncated_checkpoint(checkpoint, tmp_path, capsys):
    data = (checkpoint / "checkpoint.pt").read_bytes()
    f = tmp_path / "checkpoint.pt"
    f.write_bytes(data[: len(data) // 2])  # what a kill in the middle of a copy leaves
    assert _fails(capsys, ["--resume", str(f)]) == (
        f"error: --resume {f}: cannot be read as a checkpoint: a torch archive that is truncated or corrupt "
        f"(PytorchStreamReader failed reading zip archive: failed finding central directory); {FRESH}")


@pytest.mark.parametrize("obj, held", [({"weights": torch.zeros(3), "epoch": 1}, "a dict of weights, epoch"),
                                       (torch.zeros(2), "Tensor")])
def test_a_torch_file_of_other_content(tmp_path, capsys, obj, held):
    f = tmp_path / "other.pt"
    torch.save(obj, f)
    assert _fails(capsys, ["--resume", str(f)]) == (
        f"error: --resume {f}: a torch file of other content ({held}), not a lime checkpoint (which holds model, "
        f"optimizer, scheduler, rng, step); {FRESH}")


def test_a_pickled_module_is_not_loaded(tmp_path, capsys):
    f = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), f)  # weights_only refuses to unpickle it: nothing of it runs
    assert _fails(capsys, ["--resume", str(f)]) == (
        f"error: --resume {f}: cannot be read as a checkpoint: a torch file holding Python objects other than tensors "
        f"and plain values (not a lime checkpoint); {FRESH}")


def test_a_newer_format(checkpoint, tmp_path, capsys):
    ck = torch.load(checkpoint / "checkpoint.pt", weights_only=True)
    assert ck["format_version"] == 1
    f = tmp_path / "checkpoint.pt"
    torch.save({**ck, "format_version": 7}, f)
    assert _fails(capsys, ["--resume", str(f)]) == (
        f"error: --resume {f}: checkpoint format 7 is newer than this code reads (1); resume it with the version "
        "that wrote it, or start fresh (run without --resume)")


def test_a_set_that_changes_the_model(checkpoint, capsys):
    assert _fails(capsys, ["--resume", str(checkpoint), "--set", "model.d_model=64", "--set", "model.n_layers=3"]) == (
        f"error: --resume {checkpoint}: the checkpoint's model differs from this config (model.d_model: 32 in the "
        "checkpoint, 64 here; model.n_layers: 2 in the checkpoint, 3 here); drop the flags that change the model, "
        "or start fresh (run without --resume)")


def test_a_checkpoint_without_its_model_config_that_does_not_fit(checkpoint, tmp_path, capsys):
    """An older checkpoint (no model_config): the state dicts' shapes decide, still one line."""
    ck = torch.load(checkpoint / "checkpoint.pt", weights_only=True)
    del ck["model_config"], ck["config"]
    f = tmp_path / "checkpoint.pt"
    torch.save(ck, f)
    line = _fails(capsys, ["--resume", str(f), *SMALL, "--set", "model.d_model=64"])
    assert line.startswith(f"error: --resume {f}: the checkpoint does not fit this config's model or optimizer (")
    assert line.endswith("); resume with the checkpoint's settings, or start fresh (run without --resume)")
    assert "size mismatch" in line


def test_a_good_checkpoint_resumes_with_its_own_config(checkpoint, capsys):
    assert main(["train", "--resume", str(checkpoint), "--steps", "4", "--no-track"]) == 0
    out = capsys.readouterr().out
    assert "status: finished  steps: 4" in out and f"checkpoint: {checkpoint}" in out
    assert torch.load(checkpoint / "checkpoint.pt", weights_only=True)["step"] == 4


def test_default_checkpoints_go_to_the_results_folder(tmp_path, capsys, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the system temp dir of this process
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    assert main(["train", *SMALL, "--steps", "2", "--no-track"]) == 0
    out = capsys.readouterr().out
    made = list((tmp_path / "results" / "train").glob("*-router_none_preset_tiny_seed_0/checkpoint.pt"))
    assert len(made) == 1 and f"checkpoint: {made[0].parent}" in out
    assert sorted(os.listdir(tmp)) == []
