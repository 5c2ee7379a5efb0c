"""Data-parallel trials (orchestrator.engine.distributed) without Ray: two worker processes
(torch.distributed, gloo on CPU) against one process with the same global batch.

Tolerance. Both runs see the same global batch at every step and the same initial weights; only
the order of floating-point sums differs: each worker reduces the loss and the weight gradients
over its half of the batch and gloo adds the two halves' fp32 gradients (DDP then halves them),
where one process reduces over the whole batch at once. Each such difference is a few ulps
(~1e-7 relative, fp32 eps is 1.2e-7); AdamW turns a gradient into an update of size ~lr whatever
its magnitude, so the weights differ by rounding times lr and the difference grows only slowly
over 12 steps. Measured: 3.9e-8 (first step) and 1.0e-7 (worst of 12 steps) relative on the
language-model batch, 1.9e-8 and 8.7e-8 on the masked task batch. The bound, 1e-6, is ten
times that and 4000 times below the effect it guards against (equal weights for halves with
unequal target tokens: 4.3e-3), and the loss moves by 1.6 over the run.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from orchestrator.engine.distributed import DistributedHook, RankSlice, check_split
from orchestrator.engine.trainer import Trainer
from orchestrator.engine.trial import Tracking, load_checkpoint, run_trial, trial_hooks
from orchestrator.engine.trial_config import TrialConfig
from tools.procs import free_port

TINY = {"preset": "tiny", "model": {"n_layers": 3, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64,
                                    "router": "full"},
        "data": {"source": "builtin"}, "optim": {"lr": 3.0e-3, "min_lr": 3.0e-4, "warmup_steps": 2},
        "train": {"steps": 12, "batch_size": 4, "seq_len": 32, "log_interval": 1, "eval_interval": 6,
                  "eval_batches": 2, "threads": 1, "device": "cpu"}}


def _worker(rank: int, world: int, port: int, cfg: dict, out: str, strategy: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        c = TrialConfig.from_dict(cfg)
        c.train.checkpoint_dir = str(Path(out) / f"ck{rank}")
        t = Trainer(c, [DistributedHook(rank, world, strategy), *trial_hooks(c, Tracking(enabled=False))])
        res = t.run()
        Path(out, f"rank{rank}.json").write_text(json.dumps({"history": res.history, "status": str(res.status)}))
    finally:
        dist.destroy_process_group()


def _run_workers(tmp_path: Path, cfg: dict, world: int = 2, strategy: str = "ddp") -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(world, free_port(), cfg, str(tmp_path), strategy), nprocs=world,
                       start_method="spawn", join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _losses(history: list[dict], key: str = "train/loss") -> dict[int, float]:
    return {h["step"]: h[key] for h in history if key in h}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One two-worker DDP run of TINY (its folder, the ranks' results), read by the one-process
    comparison and the FSDP2 one: each start of two spawned workers costs ~10 s of imports here,
    and neither test changes the run or its checkpoints."""
    out = tmp_path_factory.mktemp("ddp")
    return out, _run_workers(out, TINY)


def test_two_workers_train_like_one_process_with_the_same_global_batch(ddp):
    one = run_trial(TrialConfig.from_dict(TINY), tracking=Tracking(enabled=False))
    out, ranks = ddp
    ref = _losses(one.history)
    assert len(ref) == 12
    for r in ranks:
        assert r["status"] == "finished"
        assert _losses(r["history"]) == _losses(ranks[0]["history"])  # every worker reports the same step loss
    two = _losses(ranks[0]["history"])
    assert two.keys() == ref.keys()
    assert two[1] == pytest.approx(ref[1], rel=1e-6)
    rel = max(abs(two[s] - ref[s]) / abs(ref[s]) for s in ref)
    assert rel < 1e-6, rel
    assert ref[1] - ref[12] > 0.05  # the curve moved: agreement is not two flat lines
    val = _losses(ranks[0]["history"], "final/val_loss")
    assert val[12] == pytest.approx(one.metrics["final/val_loss"], rel=1e-6)
    # rank 0 wrote the checkpoint (in the one-process format), the other worker none
    ck = load_checkpoint(out / "ck0")
    assert ck["step"] == 12 and not (out / "ck1" / "checkpoint.pt").exists()


def test_masked_targets_weight_each_worker_by_its_share_of_the_target_tokens(tmp_path):
    """A task batch whose halves hold different numbers of target tokens: plain DDP would weight
    the halves equally; the scaled gradients give the global batch's mean loss."""
    cfg = json.loads(json.dumps(TINY))
    cfg["data"] = {"source": "arithmetic"}
    cfg["train"].update(steps=6, eval_interval=6)
    cfg["model"]["max_seq_len"] = 128
    cfg["train"]["seq_len"] = 80
    data_cfg = TrialConfig.from_dict(cfg)
    t = Trainer(data_cfg, [])
    _, y = t.data.train_batch(0, 4, 80, 0)
    halves = [int((y[:2] != -100).sum()), int((y[2:] != -100).sum())]
    assert halves[0] != halves[1], halves  # the case this test is about
    one = run_trial(TrialConfig.from_dict(cfg), tracking=Tracking(enabled=False))
    ranks = _run_workers(tmp_path, cfg)
    ref, two = _losses(one.history), _losses(ranks[0]["history"])
    assert two[1] == pytest.approx(ref[1], rel=1e-6)
    rel = max(abs(two[s] - ref[s]) / abs(ref[s]) for s in ref)
    assert rel < 1e-6, rel  # unweighted halves (plain DDP) are off by 4e-3 here


def test_rank_slice_is_the_global_batch_cut_in_rows():
    class Data:
        vocab_size = 7

        def train_batch(self, index, batch_size, seq_len, seed):
            g = torch.Generator().manual_seed(seed * 1000 + index)
            return torch.randint(0, 7, (batch_size, seq_len), generator=g), torch.full((batch_size, seq_len), 1)

    full = Data().train_batch(3, 6, 5, 1)[0]
    parts = [RankSlice(Data(), r, 3).train_batch(3, 6, 5, 1)[0] for r in range(3)]
    assert torch.equal(torch.cat(parts), full)
    assert RankSlice(Data(), 0, 3).vocab_size == 7
    assert check_split(6, 3) is None and "not a multiple" in check_split(6, 4)


def test_fsdp2_trains_like_ddp_and_writes_a_checkpoint_one_process_resumes(tmp_path, ddp):
    ddp_path, ddp_ranks = ddp
    fsdp = _run_workers(tmp_path / "fsdp", TINY, strategy="fsdp")
    a, b = _losses(ddp_ranks[0]["history"]), _losses(fsdp[0]["history"])
    assert a.keys() == b.keys()
    assert max(abs(a[s] - b[s]) / abs(a[s]) for s in a) < 1e-6
    # the gathered checkpoint is the one-process format: `lime train --resume` continues it
    ck = load_checkpoint(tmp_path / "fsdp" / "ck0")
    assert ck["step"] == 12 and sorted(ck["model"]) == sorted(load_checkpoint(ddp_path / "ck0")["model"])
    cfg = json.loads(json.dumps(TINY))
    cfg["train"]["steps"] = 14
    t = Trainer(TrialConfig.from_dict(cfg), [])
    t.resume(tmp_path / "fsdp" / "ck0")
    assert t.step == 12 and t.optimizer.state_dict()["state"]
