import subprocess
import sys

import pytest

from orchestrator.cli import main

CASES = [
    (["train", "--data", "nowhere"], "data.source"),
    (["train", "--data", "text", "--set", "data.paths=[/no/such/file.txt]"], "data.paths"),
    (["train", "--set", "train.seq_len=100000"], "train.seq_len"),
    (["train", "--set", "optim.lrate=1"], "optim.lrate"),
    (["train", "--set", "model.widthh=3"], "model.widthh"),
    (["train", "--set", "optim.lr=fast"], "optim.lr"),
    (["train", "--set", "train.steps=0"], "train.steps"),
    (["train", "--router", "first-0"], "model.router"),
    (["train", "--preset", "giant"], "preset"),
    (["train", "--config", "/no/trial.yaml"], "--config"),
    (["train", "--set", "model.vocab_size=100"], "model.vocab_size"),
]


@pytest.mark.parametrize("argv,field", CASES)
def test_bad_input_one_line_exit_2(argv, field, capsys, mlflow_uri):
    assert main(argv + ["--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}"), err


def test_empty_corpus_exit_2(tmp_path, capsys):
    (tmp_path / "e.txt").write_text("")
    assert main(["train", "--data", "text", "--set", f"data.paths=[{tmp_path}/e.txt]", "--no-track"]) == 2
    assert "data.paths" in capsys.readouterr().err


def test_train_cli_end_to_end(tmp_path, mlflow_uri):
    cfg = tmp_path / "trial.yaml"
    cfg.write_text("preset: tiny\nmodel: {n_layers: 2, d_model: 32, n_heads: 2, ffn_dim: 64}\n"
                   "train: {steps: 6, batch_size: 2, seq_len: 16, log_interval: 3, eval_interval: 3, "
                   "eval_batches: 1}\n")
    p = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", "--config", str(cfg), "--router", "full",
                        "--set", "optim.lr=1e-3"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "status: finished" in p.stdout
    assert "MLflow run " in p.stdout and "(router=full,preset=tiny,seed=0)" in p.stdout
    assert "step 6:" in p.stdout  # plain progress lines when not on a terminal
