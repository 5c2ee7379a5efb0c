"""The ``hf`` source without the hub: one line within seconds that names the offline alternatives,
nothing asked of the hub when everything is local, and a sweep that does not retry the trial.

No test reaches the network: the hub's endpoint is pointed (``HF_ENDPOINT``) at a local port that
nothing listens on (refused at once), or the connection is made to hang (the probe's timeout).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.engine.data import hub, make_batches
from orchestrator.engine.trial_config import DataConfig
from tools.procs import free_port  # a local port nothing listens on: refused at once

ROOT = Path(__file__).resolve().parents[3]
LIME = str(Path(sys.executable).parent / "lime")
ALTERNATIVES = ("HF_HUB_OFFLINE", "tokenizer.json", "save_to_disk")


@pytest.fixture
def no_hub(monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")


def _local(tmp_path: Path) -> tuple[str, str]:
    datasets = pytest.importorskip("datasets")
    docs = [f"doc {i}: " + "lorem ipsum " * (i % 4 + 1) for i in range(30)]
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "ds"))
    tok = tmp_path / "tokenizer.json"
    from orchestrator.engine.data.corpus import train_bpe

    train_bpe(docs, 280).tok.save(str(tok))
    return str(tmp_path / "ds"), str(tok)


def test_what_the_hub_is_needed_for(tmp_path):
    ds, tok = _local(tmp_path)
    assert hub.needs(DataConfig(source="hf", hf_name=ds, tokenizer=tok)) == []
    assert hub.needs(DataConfig(source="hf", hf_name=ds, tokenizer="bpe")) == []  # trained here
    assert hub.needs(DataConfig(source="hf", hf_name=ds, tokenizer="byte")) == ["the tokenizer 'gpt2'"]
    assert hub.needs(DataConfig(source="hf", hf_name="org/web", tokenizer=tok)) == ["the dataset org/web"]


def test_an_unreachable_hub_is_one_line_naming_the_alternatives_within_seconds(tmp_path, no_hub):
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        make_batches(DataConfig(source="hf", hf_name="HuggingFaceFW/fineweb-edu", tokenizer="gpt2"))
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data.source: hf needs the dataset HuggingFaceFW/fineweb-edu")
    assert "not reachable" in msg and all(a in msg for a in ALTERNATIVES), msg


def test_a_silent_endpoint_is_given_up_after_the_probe_timeout(monkeypatch):
    """A name lookup or connection that never returns (a firewall dropping packets): the probe's
    thread is abandoned after the timeout, whatever the socket does."""
    release = threading.Event()

    def hang(*a, **k):
        release.wait(60)
        raise OSError("released by the test")  # as a dropped connection ends, after the probe gave up

    monkeypatch.setattr(hub.socket, "create_connection", hang)
    before = set(threading.enumerate())
    t0 = time.monotonic()
    why = hub.unreachable(timeout=0.5)
    assert why == "no answer within 0.5 s" and time.monotonic() - t0 < 1.5
    (probe,) = set(threading.enumerate()) - before  # abandoned, still in the connection
    assert probe.daemon  # it cannot keep the process alive
    release.set()  # end it here: a later test must not meet it (it would call its own create_connection)
    probe.join(5)
    assert not probe.is_alive()


def test_local_data_loads_without_asking_the_hub(tmp_path, no_hub, monkeypatch):
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    ds, tok = _local(tmp_path)
    d = make_batches(DataConfig(source="hf", hf_name=ds, tokenizer=tok, hf_val_docs=4))
    assert d.train.numel() > 0 and d.val.numel() > 0


def test_offline_reads_only_the_cache_and_says_so(tmp_path, no_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        hub.tokenizer_file("org/not-cached")
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data.tokenizer: the tokenizer 'org/not-cached' is not in the "
                                              "Hugging Face cache (HF_HUB_OFFLINE is set)"), msg


def test_lime_train_on_hf_without_the_hub_exits_2_with_one_line(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "MLFLOW_TRACKING_URI":
           f"sqlite:///{tmp_path}/m.db"}
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        env.pop(k, None)
    p = subprocess.run([LIME, "train", "--data", "hf", "--no-track"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    err = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "not reachable" in err[0] and all(a in err[0] for a in ALTERNATIVES), p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.cluster  # a Ray sweep: make test-cluster
def test_a_sweep_does_not_retry_a_trial_that_cannot_reach_the_hub(tmp_path):
    """Under Ray: the trial fails once (max_failures 2 is not spent on it), the console says why in
    one line, and the traceback is in the trial's log."""
    doc = {"name": "nohub", "description": "a trial whose data needs the hub",
           "base": {"preset": "tiny", "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "ffn_dim": 64},
                    "data": {"source": "hf", "hf_name": "org/web", "tokenizer": "gpt2"},
                    "train": {"steps": 4, "batch_size": 2, "seq_len": 16}},
           "grid": {"router": ["none"], "seed": [0]}, "resources": {"cpu": 1}, "max_failures": 2}
    path = tmp_path / "nohub.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "MLFLOW_TRACKING_URI":
           f"sqlite:///{tmp_path}/m.db", "LIME_RESULTS": str(tmp_path / "results"), "OMP_NUM_THREADS": "1"}
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "RAY_ADDRESS", "LIME_FAULT_ONCE"):
        env.pop(k, None)
    p = subprocess.run([LIME, "sweep", "run", str(path)], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    said = [line for line in out.splitlines() if "FAILED router=none,seed=0" in line]
    assert len(said) == 1 and "not retried" in said[0] and "not reachable" in said[0], out[-3000:]
    log = (tmp_path / "results" / "ray" / "nohub" / "router=none,seed=0" / "trial.log").read_text()
    assert log.count("=== ") == 1, log  # one attempt: no retry
    assert "Traceback" in log and "ConfigError" in log
