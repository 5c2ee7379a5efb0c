"""``lime prune``: post-hoc top-p pruning of trained runs, checked against the trial's own final
validation loss, an evaluation of the saved pruned checkpoint, and the masks it holds."""
import contextlib

import pytest
import torch
from mlflow.tracking import MlflowClient

from orchestrator.cli import main
from orchestrator.engine.data import make_batches
from orchestrator.engine.trainer import evaluate_loss
from orchestrator.engine.trial import Tracking, load_checkpoint, run_trial
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.evaluation.loading import load_trained


def _trial(tmp_path, seed, router="full"):
    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": router, "n_layers": 4, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "train": {"steps": 6, "batch_size": 2, "seq_len": 32, "log_interval": 3, "eval_batches": 2, "seed": seed,
                  "checkpoint_dir": str(tmp_path / f"ck-{router}-{seed}")}})
    return run_trial(cfg, tracking=Tracking(experiment="prune"))


def test_prune_two_runs_logs_saves_and_pairs(tmp_path, mlflow_uri, capsys):
    runs = [_trial(tmp_path, s) for s in (0, 1)]
    out = tmp_path / "prune.md"
    assert main(["prune", runs[0].run_id, runs[1].run_id, "--top-p", "0.9", "--save", str(tmp_path / "pruned"),
                 "--out", str(out)]) == 0
    cl = MlflowClient(mlflow_uri)
    md = out.read_text()
    assert "Loss change over the models" in md and "cannot decide" in md  # 2 models: no finite 95% interval
    for res in runs:
        m = cl.get_run(res.run_id).data.metrics
        k = "prune/top_p_0.9"
        # before pruning: exactly the trial's own final validation loss (the same batches and weights)
        assert m[f"{k}/val_loss_before"] == pytest.approx(res.final_val_loss, rel=1e-12)
        saved = tmp_path / "pruned" / res.run_id
        ck = load_checkpoint(saved)
        masks = [ck["model"][f"router.prune.mask_{l}"] for l in (1, 2, 3)]
        assert m[f"{k}/pruned_weights"] == sum(int((~mk).sum()) for mk in masks) > 0
        assert m[f"{k}/router_weights"] == 2 * 2 * (2 + 3 + 4)
        assert ck["config"]["model"]["router_prune"] == {"top_p": 0.9, "start": 6, "every": 0, "renormalize": True}
        # the saved pruned model, loaded as any checkpoint, gives the logged loss after pruning
        trained = load_trained(saved)
        cfg = trained.cfg
        val = make_batches(cfg.data).val_batches(cfg.train.batch_size, cfg.train.seq_len, cfg.train.eval_batches)
        after = evaluate_loss(trained.model, val, torch.device("cpu"), contextlib.nullcontext)
        assert m[f"{k}/val_loss_after"] == pytest.approx(after, rel=1e-12)
        assert m[f"{k}/val_loss_change"] == pytest.approx(after - res.final_val_loss, rel=1e-9)
        assert any(a.path == "prune_top_p_0.9.md" for a in cl.list_artifacts(res.run_id))
    assert "pruned model saved" in capsys.readouterr().out


def test_pruning_a_pruned_checkpoint_keeps_its_drops(tmp_path, mlflow_uri, capsys):
    """A checkpoint pruned at 0.9, pruned again at 0.99 without renormalising: only the weights still
    kept are ranked, so every route the first pruning dropped stays dropped (ranked at their stale
    values they came back, and the count fell below the first one's), the count reported includes
    them, and the kept weights are not rescaled."""
    res = _trial(tmp_path, 0)
    first, second = tmp_path / "p90", tmp_path / "p99"
    assert main(["prune", res.checkpoint, "--top-p", "0.9", "--save", str(first), "--no-log",
                 "--out", str(tmp_path / "a.md")]) == 0
    capsys.readouterr()
    assert main(["prune", str(first), "--top-p", "0.99", "--no-renormalize", "--save", str(second), "--no-log",
                 "--out", str(tmp_path / "b.md")]) == 0
    printed = capsys.readouterr().out
    a, b = load_checkpoint(first), load_checkpoint(second)
    n_a = n_b = 0
    for l in (1, 2, 3):
        ma, mb = a["model"][f"router.prune.mask_{l}"], b["model"][f"router.prune.mask_{l}"]
        assert not (mb & ~ma).any(), f"layer {l}: a dropped route came back"
        w_a, w_b = a["model"][f"router.weights.{l - 1}"], b["model"][f"router.weights.{l - 1}"]
        assert torch.equal(w_a, w_b)  # not renormalised: the kept weights as they were
        n_a, n_b = n_a + int((~ma).sum()), n_b + int((~mb).sum())
    assert 0 < n_a <= n_b
    assert f"pruned {n_b} of {2 * 2 * (2 + 3 + 4)} router weights" in printed
    assert b["config"]["model"]["router_prune"]["renormalize"] is False
    assert "not renormalised" in (tmp_path / "b.md").read_text()


def test_prune_errors_are_one_line(tmp_path, mlflow_uri, capsys):
    dyn = _trial(tmp_path, 0, router="dynamic")
    for argv, message in [
        (["prune", str(tmp_path / "nope"), "--top-p", "0.9"], "is neither a checkpoint"),
        (["prune", dyn.checkpoint, "--top-p", "1.5"], "--top-p: must be in (0, 1)"),
        (["prune", dyn.checkpoint, "--top-p", "0.9", "--no-log"], "cannot be pruned"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
