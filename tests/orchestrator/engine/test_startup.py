"""The start-up clock and hook (fake clocks), the per-process data cache and what a reused
worker process resets before its next trial."""
from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from orchestrator.engine import startup
from orchestrator.engine.data import make_batches
from orchestrator.engine.schedule import peak_rss_mb
from orchestrator.engine.startup import StartupClock, StartupHook
from orchestrator.engine.trial import Hook, Tracking, run_trial
from orchestrator.engine.trial_config import DataConfig, TrialConfig


class FakeTime:
    """A clock that moves only when told to."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def tiny(steps=6, **train):
    return TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
        "train": {"steps": steps, "batch_size": 2, "seq_len": 16, "log_interval": 2, "eval_interval": 4,
                  "eval_batches": 1, **train}})


def test_clock_phases_sum_and_the_first_step_counts_the_time_before_the_function():
    now = FakeTime()
    clock = StartupClock(now, before=4.0, worker_trial=1)
    with clock.phase("data"):
        now.t += 0.5
    with clock.phase("mlflow"):
        now.t += 0.25
    with clock.phase("data"):  # a phase seen twice adds up
        now.t += 0.125
    clock.add("process", 4.0)
    assert clock.metrics() == {"startup/data_s": 0.625, "startup/mlflow_s": 0.25, "startup/process_s": 4.0,
                               "startup/worker_trial": 1.0}  # no first step yet: no to_first_step
    now.t += 1.0
    clock.mark_first_step()
    now.t += 9.0
    clock.mark_first_step()  # only the first counts
    assert clock.elapsed() == 10.875
    m = clock.metrics({"data": 0.375, "model": 2.0})  # the trainer's phases add to the clock's
    assert m == {"startup/data_s": 1.0, "startup/mlflow_s": 0.25, "startup/process_s": 4.0, "startup/model_s": 2.0,
                 "startup/to_first_step_s": 4.0 + 1.875, "startup/worker_trial": 1.0}
    with pytest.raises(ValueError), clock.phase("model"):  # a failing phase still counts its time
        now.t += 3.0
        raise ValueError
    assert clock.phases["model"] == 3.0


class Tick(Hook):
    """Moves the fake time by ``dt`` at every step's backward (before the startup hook sees it)."""

    def __init__(self, now: FakeTime, dt: float):
        self.now, self.dt = now, dt

    def after_backward(self, t, loss):
        self.now.t += self.dt


def test_the_hook_logs_every_phase_once_with_the_first_log_point():
    now = FakeTime()
    clock = StartupClock(now, before=2.0, worker_trial=3)
    clock.add("prepare", 0.5)
    hook = StartupHook(clock)
    res = run_trial(tiny(), tracking=Tracking(enabled=False), hooks=[Tick(now, 7.0), hook])
    with_startup = [h for h in res.history if any(k.startswith("startup/") for k in h)]
    assert [h["step"] for h in with_startup] == [2]  # the first log point, once
    m = {k: v for k, v in with_startup[0].items() if k.startswith("startup/")}
    assert m["startup/to_first_step_s"] == 2.0 + 7.0  # before + the fake time at the first backward
    assert m["startup/prepare_s"] == 0.5 and m["startup/worker_trial"] == 3.0
    assert m["startup/data_s"] > 0 and m["startup/model_s"] > 0  # the trainer's own (real) phases
    assert "startup/resume_s" not in m and "startup/mlflow_s" not in m  # no resume, no tracking
    assert hook.step == 6 and hook.run_id is None


def test_the_hook_counts_the_resume_and_the_mlflow_set_up(tmp_path, mlflow_uri):
    ck = str(tmp_path / "ck")
    run_trial(tiny(checkpoint_dir=ck), tracking=Tracking(experiment="s"), stop_at=4)
    hook = StartupHook(StartupClock())
    res = run_trial(tiny(checkpoint_dir=ck), tracking=Tracking(experiment="s"), resume=ck, hooks=[hook])
    first = next(h for h in res.history if h["step"] == 6)  # the resumed attempt's first log point
    assert first["startup/resume_s"] > 0 and first["startup/mlflow_s"] > 0 and first["startup/to_first_step_s"] > 0
    assert hook.run_id == res.run_id is not None


def test_worker_clock_counts_the_process_start_and_imports_for_the_first_trial_only(monkeypatch):
    monkeypatch.setattr(startup, "_PROCESS", startup._Process())
    monkeypatch.setattr(startup, "process_age_s", lambda: 12.0)
    first = startup.worker_clock(time.time() - 5.0, import_s=3.0)  # launched 5 s ago: the later of the two
    assert first.worker_trial == 1 and 5.0 <= first.before < 6.0
    assert first.phases["process"] == first.before and first.phases["import"] == 3.0
    old = startup.worker_clock(time.time() - 60.0, import_s=3.0)  # a reused process: neither
    assert old.worker_trial == 2 and old.before == 0 and old.phases == {"process": 0.0, "import": 0.0}
    monkeypatch.setattr(startup, "_PROCESS", startup._Process())
    assert startup.worker_clock(None, import_s=30.0).phases == {"process": 12.0, "import": 12.0}  # import <= process


def test_process_age_matches_a_subprocess_clock():
    code = ("import time; t = time.time()\n"
            "from orchestrator.engine.startup import process_age_s\n"
            "print(process_age_s(), time.time() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    age, since_first_line = float(out[0]), float(out[1])
    assert since_first_line <= age < since_first_line + 10  # the interpreter's start comes before its first line


def test_shared_data_builds_each_config_once_and_keeps_only_the_last():
    startup._DATA.clear()
    a = startup.shared_data(DataConfig())
    assert startup.shared_data(DataConfig()) is a  # equal configs: the same object
    ref = make_batches(DataConfig())
    for (x, y), (rx, ry) in zip(a.val_batches(4, 32, 2), ref.val_batches(4, 32, 2)):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert torch.equal(a.train_batch(3, 4, 32, 7)[0], ref.train_batch(3, 4, 32, 7)[0])
    b = startup.shared_data(DataConfig(val_fraction=0.3))  # another config (the default is 0.2)
    assert b is not a and list(startup._DATA.values()) == [b]
    assert startup.shared_data(DataConfig()) is not a  # rebuilt after another config replaced it
    startup._DATA.clear()


def test_a_reused_process_gets_its_first_thread_count_back_and_fresh_compile_caches(monkeypatch):
    monkeypatch.setattr(startup, "_PROCESS", startup._Process())
    monkeypatch.setattr(gc, "freeze", lambda: None)  # not this test process's heap
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        startup.prepare_process(1)  # the process's first trial: nothing to reset
        assert resets == []
        torch.set_num_threads(2)  # what that trial's train.threads did
        startup.prepare_process(2)
        assert torch.get_num_threads() == 1 and resets == [1]
    finally:
        torch.set_num_threads(saved)


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs")
def test_the_peak_memory_starts_again_with_each_trial():
    def peak_mb():  # VmHWM, read here independently of the code under test
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024

    startup.reset_peak_memory()  # earlier tests' peaks out of the way: the peak is now this test's
    # 96 MB of its own anonymous mapping, touched. Not a tensor: malloc may serve a tensor from free
    # heap memory that earlier tests left behind, and keep it after `del`, so the RSS would not drop.
    big = mmap.mmap(-1, 96 * 2**20)
    torch.frombuffer(big, dtype=torch.uint8).fill_(1)
    high = peak_mb()
    t = threading.Thread(target=lambda: None)  # a thread that ends now: ru_maxrss would keep this peak
    t.start()
    t.join()
    big.close()  # unmapped: back to the OS at once
    startup.reset_peak_memory()
    assert peak_mb() < high - 64
    assert abs(peak_rss_mb() - peak_mb()) < 8  # what the metrics log
