import copy
import math
import threading
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from orchestrator.engine.data import make_batches
from orchestrator.engine.trial import Hook, Tracking, Trainer, lr_multiplier, run_trial
from orchestrator.engine.trial_config import TrialConfig

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


class OneBatch:
    """Corpus data whose micro-batch ``i`` of size ``b`` is rows ``[i*b, (i+1)*b)`` of one fixed
    batch: ``grad_accum=k`` at batch ``b`` then sees exactly the tokens of one batch of ``k*b``."""

    def __init__(self, inner, rows: int, seq: int):
        self.inner = inner
        self.x, self.y = inner.train_batch(0, rows, seq, 0)

    def train_batch(self, step, batch, seq, seed):
        return self.x[step * batch:(step + 1) * batch], self.y[step * batch:(step + 1) * batch]

    def __getattr__(self, name):  # vocab_size, val_batches, evaluate, describe: the corpus's
        return getattr(self.inner, name)


class StepProbe(Hook):
    """Records, at every optimizer step, the gradients it steps with and each group's lr, and
    the parameters before and after the first step."""

    def __init__(self):
        self.grads, self.lrs, self.after = [], [], None

    def on_start(self, t):
        self.trainer, self.initial = t, copy.deepcopy(t.model)
        self.before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        t.optimizer.register_step_pre_hook(self._pre_step)
        t.optimizer.register_step_post_hook(self._post_step)

    def _pre_step(self, opt, args, kwargs):
        self.grads.append({n: p.grad.detach().clone() for n, p in self.trainer.model.named_parameters()})
        self.lrs.append({g["name"]: g["lr"] for g in opt.param_groups})

    def _post_step(self, opt, args, kwargs):
        if self.after is None:
            self.after = {n: p.detach().clone() for n, p in self.trainer.model.named_parameters()}


def one_step(cfg, data):
    probe = StepProbe()
    res = Trainer(cfg, [probe], data=data).run()
    return probe, res


def test_grad_accumulation_matches_bigger_batch():
    # One step of grad_accum=k on micro-batches of 8/k sequences against one batch of 8, on the
    # same 8 sequences, unclipped (grad_clip 0), compared with the float64 gradient of that batch.
    # float32 (eps = 2**-23 ~ 1.2e-7) sums the same per-token terms in another order (k means of
    # 8/k * 32 tokens, each scaled by 1/k, against one mean of 256; matmul reductions over fewer
    # rows), so the two agree only up to rounding: measured <= 7 ulps of each tensor's largest
    # entry and <= 7e-7 relative to the float64 gradient (both paths); the bounds are 16 ulps
    # and 4e-6. A missing 1/k scaling is off by 100%, another micro-batch's tokens by ~30%.
    def cfg(batch, accum):
        return TrialConfig.from_dict({
            "preset": "tiny", "model": {"router": "full", "n_layers": 3, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
            "optim": {"grad_clip": 0.0},
            "train": {"steps": 1, "batch_size": batch, "seq_len": 32, "grad_accum": accum, "eval_batches": 1,
                      "log_interval": 1}})

    data = OneBatch(make_batches(cfg(8, 1).data), 8, 32)
    big, big_res = one_step(cfg(8, 1), data)
    ref = big.initial.double()  # the float64 gradient of the whole batch, computed independently
    F.cross_entropy(ref(data.x).flatten(0, 1), data.y.flatten()).backward()
    g64 = {n: p.grad for n, p in ref.named_parameters()}
    eps32 = 2.0 ** -23
    for k in (2, 4):
        acc, acc_res = one_step(cfg(8 // k, k), data)
        assert len(acc.grads) == len(big.grads) == 1
        ga, gb = acc.grads[0], big.grads[0]
        assert ga.keys() == gb.keys() == g64.keys()
        for n in ga:
            scale = float(gb[n].abs().max())
            assert float((ga[n] - gb[n]).abs().max()) <= 16 * eps32 * scale, (k, n)
            for g in (ga[n], gb[n]):
                assert float((g.double() - g64[n]).norm() / g64[n].norm()) <= 4e-6, (k, n)
        # the logged loss: the mean of k micro-batch means against the mean over the batch
        la, lb = losses(acc_res)[0], losses(big_res)[0]
        assert la == pytest.approx(lb, rel=16 * eps32)
    half, _ = one_step(cfg(4, 1), data)  # the first micro-batch alone: the check can fail
    assert float((half.grads[0]["router.weights.1"] - gb["router.weights.1"]).norm()
                 / gb["router.weights.1"].norm()) > 0.05


@pytest.mark.parametrize("router_lr, router_lr_mult, expected", [
    (0.05, None, 0.05), (None, 10.0, 0.03), (None, None, 0.003)])
def test_router_lr_group_used(router_lr, router_lr_mult, expected, tmp_path):
    steps, lr, warmup, min_lr, wd = 6, 3e-3, 2, 3e-4, 0.1
    cfg = tiny(steps=steps, checkpoint_dir=str(tmp_path))
    cfg.model["n_layers"] = 3
    cfg.optim.router_lr, cfg.optim.router_lr_mult = router_lr, router_lr_mult
    cfg.optim.warmup_steps, cfg.optim.weight_decay = warmup, wd
    probe = StepProbe()
    run_trial(cfg, tracking=OFF, hooks=[probe])
    named = dict(probe.trainer.model.named_parameters())
    router = [p for n, p in named.items() if n.startswith("router.")]
    groups = {g["name"]: g for g in probe.trainer.optimizer.param_groups}
    # the router's parameters are exactly its group's, and no other group holds one
    assert len(router) == 2 and [id(p) for p in groups["router"]["params"]] == [id(p) for p in router]
    assert not {id(p) for p in router} & {id(p) for g in ("decay", "no_decay") for p in groups[g]["params"]}
    assert groups["router"]["weight_decay"] == 0.0 and groups["decay"]["weight_decay"] == wd
    # every step's lr follows the schedule, from the router's own base lr
    assert len(probe.lrs) == steps
    mult = [lr_multiplier(s, schedule="cosine", warmup=warmup, total=steps, min_ratio=min_lr / lr)
            for s in range(steps + 1)]
    for s, lrs in enumerate(probe.lrs):
        assert lrs["router"] == pytest.approx(expected * mult[s], rel=1e-12)
        assert lrs["decay"] == lrs["no_decay"] == pytest.approx(lr * mult[s], rel=1e-12)
    # ... and the optimizer steps with it: AdamW's first update of a parameter is
    # p * (1 - lr * wd) - lr * g / (|g| + eps); without weight decay for the router. float32
    # rounding of these O(1) weights is ~1e-7; a router lr of the decay groups, or any weight
    # decay, moves them by >= 1e-5.
    checked = set()
    for n, p in probe.after.items():
        group = next(name for name, g in groups.items() if any(q is named[n] for q in g["params"]))
        g = probe.grads[0][n].double()
        step_lr = probe.lrs[0][group]
        want = probe.before[n].double() * (1 - step_lr * groups[group]["weight_decay"])
        want -= step_lr * g / (g.abs() + cfg.optim.eps)
        assert float((p.double() - want).abs().max()) <= 1e-6, n
        checked.add(group)
    assert checked == {"decay", "no_decay", "router"}
    # the checkpoint keeps the group: its lr after the last step, no weight decay, its 2 tensors
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    saved = {g["name"]: g for g in ck["optimizer"]["param_groups"]}
    assert saved["router"]["lr"] == pytest.approx(expected * mult[steps], rel=1e-12)
    assert saved["router"]["weight_decay"] == 0.0 and len(saved["router"]["params"]) == 2


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
    senders = lambda: {t for t in threading.enumerate() if t.name == "lime-mlflow-outbox"}  # noqa: E731
    before = senders()  # another test's logger may still be open in this process
    first = run_trial(tiny(steps=20, checkpoint_dir=ck), tracking=Tracking(experiment="r"), stop_at=10)
    # the stopped attempt's metric sender is gone (a reused worker process would collect one per stop)
    assert not senders() - before
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
