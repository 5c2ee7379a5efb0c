"""``model.router_prune`` in training: the masks refreshed on the schedule and used by the steps
after, pruned weights frozen, Table 5's counts in the final metrics, and a resume from a
checkpoint between refreshes equal to the uninterrupted run bit for bit (the mask travels in it)."""
import pytest
import torch

from lime_arch import ConfigError
from orchestrator.engine.prune import RouterPruneHook
from orchestrator.engine.trial import Hook, Tracking, Trainer, load_checkpoint, run_trial
from orchestrator.engine.trial_config import TrialConfig

OFF = Tracking(enabled=False)


def cfg(steps=12, prune=None, **train):
    model = {"router": "full", "n_layers": 4, "d_model": 32, "n_heads": 2, "ffn_dim": 64,
             "router_prune": prune if prune is not None else {"top_p": 0.9, "start": 3, "every": 4}}
    return TrialConfig.from_dict({
        "preset": "tiny", "model": model, "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 2},
        "train": {"steps": steps, "batch_size": 4, "seq_len": 32, "log_interval": 2, "eval_interval": 100,
                  "eval_batches": 2, **train}})


class Watch(Hook):
    """Per step: the step of the last refresh as the step's forward sees it, and the router weights."""

    def __init__(self):
        self.refreshed, self.weights = [], []

    def after_backward(self, t, loss):
        self.refreshed.append(int(t.model.router.prune.refreshed))

    def on_log(self, t, step, metrics, checkpoint):
        self.weights.append([w.detach().clone() for w in t.model.router.weights])


def test_schedule_masks_and_frozen_weights():
    w = Watch()
    res = run_trial(cfg(), tracking=OFF, hooks=[w])
    # steps 0-2 unpruned, refreshed before steps 3, 7 and 11
    assert w.refreshed == [-1, -1, -1, 3, 3, 3, 3, 7, 7, 7, 7, 11]
    m = res.metrics
    assert 0 < m["final/pruned_weights"] < m["final/router_weights"] == 2 * 2 * (2 + 3 + 4)
    assert m["final/pruned_fraction"] == pytest.approx(m["final/pruned_weights"] / m["final/router_weights"])
    assert sum(m[f"prune/pruned_weights/layer_{l}"] for l in (1, 2, 3)) == m["final/pruned_weights"]
    fractions = [h["prune/pruned_fraction"] for h in res.history if "prune/pruned_fraction" in h]
    assert fractions[0] == 0.0 and fractions[-1] > 0  # the first log point (step 2) is before the first refresh


def test_pruned_weights_keep_their_value_between_refreshes():
    """Between two refreshes (steps 3..6) a weight masked at step 3 does not move: no gradient, no
    momentum, no decay."""
    snaps = {}

    class Snap(Hook):
        def after_backward(self, t, loss):
            snaps[t.step] = [w.detach().clone() for w in t.model.router.weights]

    trainer = Trainer(cfg(steps=7, prune={"top_p": 0.8, "start": 3}), [RouterPruneHook(), Snap()])
    trainer.run()
    masks = [trainer.model.router.prune.mask(l) for l in (1, 2, 3)]
    assert any((~m).any() for m in masks)
    for l, m in enumerate(masks):
        assert torch.equal(snaps[3][l][~m], trainer.model.router.weights[l].detach()[~m])
        assert not torch.equal(snaps[3][l][m], trainer.model.router.weights[l].detach()[m])  # the kept ones train


def test_resume_between_refreshes_is_exact(tmp_path):
    full = run_trial(cfg(checkpoint_dir=str(tmp_path / "a")), tracking=OFF)
    part = run_trial(cfg(checkpoint_dir=str(tmp_path / "b")), tracking=OFF, stop_at=6)  # after the refresh at 3
    ck = load_checkpoint(part.checkpoint)
    assert int(ck["model"]["router.prune.refreshed"]) == 3 and not ck["model"]["router.prune.mask_3"].all()
    rest = run_trial(cfg(checkpoint_dir=str(tmp_path / "b")), tracking=OFF, resume=part.checkpoint)
    assert [h.get("train/loss") for h in rest.history] == [h.get("train/loss") for h in full.history]
    a, b = load_checkpoint(full.checkpoint)["model"], load_checkpoint(rest.checkpoint)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rest.metrics["final/pruned_weights"] == full.metrics["final/pruned_weights"]


def test_pruning_is_refused_under_compile_and_for_other_kinds():
    with pytest.raises(ConfigError, match=r"^model.router_prune: not with train.compile"):
        cfg(compile=True)
    with pytest.raises(ConfigError, match=r"^model.router_prune: router 'dynamic' \(kind dynamic\) cannot be pruned"):
        TrialConfig.from_dict({"preset": "tiny", "model": {"router": "dynamic", "router_prune": {"top_p": 0.9}}})


def test_without_router_prune_nothing_changes():
    plain = TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "log_interval": 2, "eval_batches": 1}})
    res = run_trial(plain, tracking=OFF)
    assert not any(k.startswith(("prune/", "final/pruned", "final/router_weights")) for k in res.metrics)
    assert not any(".prune." in k for k in load_checkpoint(res.checkpoint)["model"])
