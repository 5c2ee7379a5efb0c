import math
from collections import Counter

import pytest
import torch

from orchestrator.engine.config import TrialConfig
from orchestrator.engine.data import make_batches
from orchestrator.engine.train import Tracking, lr_multiplier, run_trial

OFF = Tracking(enabled=False)


def tiny(steps=20, **train):
    return TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
        "train": {"steps": steps, "batch_size": 4, "seq_len": 32, "log_interval": 5, "eval_interval": 10,
                  "eval_batches": 2, **train}})


def losses(res):
    return [h["train/loss"] for h in res.history if "train/loss" in h]


def unigram_entropy(cfg):
    data = make_batches(cfg.data)
    train, val = data.train, data.val
    counts = Counter(train.tolist())
    total = sum(counts.values())
    # cross-entropy of the validation stream under the training unigram distribution (add-one)
    V = data.vocab_size
    return -sum(math.log((counts[t] + 1) / (total + V)) for t in val.tolist()) / val.numel()


def test_learning_beats_unigram_baseline():
    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2},
        "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 10},
        "train": {"steps": 100, "batch_size": 32, "seq_len": 64, "log_interval": 50, "eval_interval": 1000,
                  "eval_batches": 4}})
    res = run_trial(cfg, tracking=OFF)
    assert res.status == "finished"
    uni = unigram_entropy(cfg)
    assert res.final_val_loss < uni - 0.5, (res.final_val_loss, uni)


def test_same_seed_same_curve_bit_for_bit_and_different_seed_differs():
    a = run_trial(tiny(), tracking=OFF)
    b = run_trial(tiny(), tracking=OFF)
    c = run_trial(tiny(seed=1), tracking=OFF)
    assert losses(a) == losses(b)
    assert a.final_val_loss == b.final_val_loss
    assert losses(a) != losses(c)


def test_resume_equals_uninterrupted(tmp_path):
    full = run_trial(tiny(steps=20), tracking=OFF)
    first = run_trial(tiny(steps=20, checkpoint_dir=str(tmp_path / "ck")), tracking=OFF, stop_at=10)
    assert first.status == "stopped" and first.step == 10
    second = run_trial(tiny(steps=20, checkpoint_dir=str(tmp_path / "ck")), tracking=OFF, resume=first.checkpoint)
    assert second.status == "finished"
    assert losses(second) == losses(full)  # the history carries over through the checkpoint
    assert second.final_val_loss == full.final_val_loss


def test_divergence_is_a_status_not_an_exception():
    cfg = tiny(steps=30, log_interval=1)
    cfg.optim.lr, cfg.optim.min_lr, cfg.optim.grad_clip, cfg.optim.warmup_steps = 1e8, 0.0, 0.0, 0
    res = run_trial(cfg, tracking=OFF)
    assert res.status == "diverged"
    assert res.step < 30 and res.final_val_loss is None


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_schedules(schedule):
    kw = dict(schedule=schedule, warmup=10, total=110, min_ratio=0.1)
    assert lr_multiplier(0, **kw) == pytest.approx(0.1)
    assert lr_multiplier(9, **kw) == pytest.approx(1.0)
    end = lr_multiplier(110, **kw)
    mid = lr_multiplier(60, **kw)
    if schedule == "constant":
        assert end == mid == 1.0
    else:
        assert end == pytest.approx(0.1)
        assert mid == pytest.approx(0.55)  # halfway: cosine and linear agree


def test_grad_accumulation_matches_bigger_batch():
    a = tiny(steps=3, batch_size=4, grad_accum=2)
    res = run_trial(a, tracking=OFF)
    assert res.status == "finished" and len(losses(res)) >= 1


def test_router_lr_group_used():
    cfg = tiny(steps=2)
    cfg.optim.router_lr_mult = 10.0
    res = run_trial(cfg, tracking=OFF)
    assert res.status == "finished"


def test_mlflow_run_has_params_metrics_and_artifacts(mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = tiny(steps=20)
    res = run_trial(cfg, tracking=Tracking(experiment="t-exp", tags={"sweep": "unit"}))
    cl = MlflowClient(mlflow_uri)
    run = cl.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    p, tags = run.data.params, run.data.tags
    assert p["optim.lr"] == "0.003" and p["train.steps"] == "20" and p["resolved.model.vocab_size"] == "257"
    assert tags["router"] == "full" and tags["status"] == "finished" and tags["sweep"] == "unit"
    assert len(cl.get_metric_history(res.run_id, "train/loss")) == 4  # every 5 of 20 steps
    assert [m.step for m in cl.get_metric_history(res.run_id, "val/loss")] == [10, 20]
    for k in ("model/params", "model/router_params", "model/flops_per_token", "final/val_loss", "final/val_ppl",
              "perf/step_time_ms", "perf/peak_mem_mb", "train/tokens_per_s", "train/lr", "train/grad_norm"):
        assert k in run.data.metrics, k
    assert run.data.metrics["final/val_ppl"] == pytest.approx(math.exp(run.data.metrics["final/val_loss"]))
    arts = {a.path for a in cl.list_artifacts(res.run_id)}
    assert {"config.yaml", "router_weights.npz", "router_heatmap.png"} <= arts


def test_resume_continues_the_same_mlflow_run(mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    ck = str(tmp_path / "ck")
    first = run_trial(tiny(steps=20, checkpoint_dir=ck), tracking=Tracking(experiment="r"), stop_at=10)
    second = run_trial(tiny(steps=20, checkpoint_dir=ck), tracking=Tracking(experiment="r"), resume=first.checkpoint)
    assert first.run_id == second.run_id
    cl = MlflowClient(mlflow_uri)
    steps = [m.step for m in cl.get_metric_history(second.run_id, "train/loss")]
    assert steps == [5, 10, 15, 20]
    assert len(cl.search_runs([cl.get_experiment_by_name("r").experiment_id])) == 1


def test_vocab_follows_tokenizer_unless_set():
    cfg = tiny()
    assert cfg.model_config(vocab_size=257).vocab_size == 257
    cfg.model["vocab_size"] = 300
    from lime_arch import ConfigError

    with pytest.raises(ConfigError, match="model.vocab_size"):
        run_trial(cfg, tracking=OFF)


def test_checkpoint_loads_with_weights_only(tmp_path):
    run_trial(tiny(steps=5, checkpoint_dir=str(tmp_path)), tracking=OFF)
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 5 and "optimizer" in ck and "rng" in ck
    assert not list(tmp_path.glob(".ckpt-*"))  # no temp file left behind
