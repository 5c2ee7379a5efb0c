"""The sweep file's multi-worker keys (resources.workers, resources.parallel): validated before
anything runs, and absent keys leave a sweep's fingerprint as it was (old sweeps resume)."""
from __future__ import annotations

import pytest

from lime_arch import ConfigError
from orchestrator.sweep.spec import parse_spec
from orchestrator.sweep.view import dry_run_text
from orchestrator.sweep.workers import trials_that_fit, tune_resources

BASE = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
        "data": {"source": "builtin"}, "train": {"steps": 10, "batch_size": 8, "seq_len": 32}}


def spec(**resources):
    return parse_spec({"name": "w", "description": "workers", "base": BASE, "grid": {"seed": [0, 1]},
                       "resources": resources})


def test_workers_default_to_one_process_and_keep_the_fingerprint():
    one = spec(cpu=1)
    assert one.resources.workers == 1 and one.resources.parallel == "ddp"
    assert spec(cpu=1, workers=1, parallel="ddp").fingerprint() == one.fingerprint()
    assert spec(cpu=1, workers=2).fingerprint() != one.fingerprint()
    assert tune_resources(one) == {"cpu": 1.0, "gpu": 0.0}


def test_multi_worker_resources():
    s = spec(cpu=4, gpu=1, workers=4, parallel="fsdp")
    assert tune_resources(s) == {"cpu": 0, "memory": 1}  # the workers hold the CPUs and GPUs
    assert trials_that_fit(s, {"CPU": 64, "GPU": 8}) == 2 and trials_that_fit(s, {"CPU": 8, "GPU": 8}) == 1
    assert "x 4 workers (fsdp)" in dry_run_text(s)


@pytest.mark.parametrize(("res", "words"), [
    ({"workers": 0}, "resources.workers: "),
    ({"workers": 3}, "resources.workers: 3 workers split each global batch by rows, but train.batch_size is 8"),
    ({"workers": 2, "parallel": "zero"}, "resources.parallel: "),
])
def test_bad_worker_settings_are_one_line(res, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        spec(**res)
    assert "\n" not in str(e.value)
