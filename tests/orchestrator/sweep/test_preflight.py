"""What the dry run warns about (one line each: GPUs or CPUs a local Ray lacks, downloads from
the Hugging Face hub, a launch that would be refused) and `lime sweep status` without a store."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lime_arch import ConfigError
from orchestrator.cli import main
from orchestrator.sweep.local_state import write_state
from orchestrator.sweep.spec import load_spec, parse_spec
from orchestrator.sweep.view import dry_run_text, status_text

ROOT = Path(__file__).resolve().parents[3]
GPU_SWEEP = ROOT / "sweeps" / "router-ablation-150m.yaml"


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning: ")]


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_a_gpu_sweep_on_a_machine_without_gpus_warns_unless_a_cluster_is_given(monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    spec = load_spec(GPU_SWEEP)
    _gpus(monkeypatch, 0)
    text = dry_run_text(spec)
    assert _warnings(text) == [
        "warning: resources.gpu: 1 per trial, but this machine has 0 GPUs and no Ray cluster is given (--address "
        "or RAY_ADDRESS): a run here refuses; use the sweep's -cpu version or a GPU cluster",
        "warning: data.hf_name: will stream the dataset HuggingFaceFW/fineweb-edu (sample-10BT) from the Hugging "
        "Face hub in every trial (needs network; a local save_to_disk folder as data.hf_name avoids it)",
        "warning: data.tokenizer: will download the tokenizer 'gpt2' from the Hugging Face hub (a local "
        "tokenizer.json path avoids it)"]
    assert text.splitlines()[-1] == "dry run: nothing was started"
    assert not any("resources" in w for w in _warnings(dry_run_text(spec, address="10.0.0.1:6379")))
    _gpus(monkeypatch, 1)
    assert not any("resources" in w for w in _warnings(dry_run_text(spec)))
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # 8 CPUs per trial
    assert "warning: resources.cpu: 8 per trial, but this machine has 2 CPUs" in dry_run_text(spec)


def test_local_data_and_cpu_sweeps_warn_about_nothing(tmp_path, monkeypatch):
    _gpus(monkeypatch, 0)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert _warnings(dry_run_text(load_spec(ROOT / "sweeps" / "default.yaml"))) == []
    (tmp_path / "ds").mkdir()  # a save_to_disk folder and a tokenizer file: nothing to download
    (tmp_path / "tok.json").write_text("{}")
    doc = {"name": "local", "description": "local hf data", "grid": {"router": ["none"]},
           "base": {"preset": "tiny", "data": {"source": "hf", "hf_name": str(tmp_path / "ds"),
                                              "tokenizer": str(tmp_path / "tok.json")}}}
    assert _warnings(dry_run_text(parse_spec(doc))) == []


def test_hub_downloads_are_named_once_and_offline_says_the_cache(monkeypatch):
    doc = {"name": "hub", "description": "hub data", "grid": {"router": ["none", "full"], "seed": [0, 1]},
           "base": {"preset": "tiny", "data": {"source": "hf", "hf_name": "someone/corpus", "hf_config": None,
                                              "hf_streaming": False, "tokenizer": "someone/tok"}}}
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert _warnings(dry_run_text(parse_spec(doc))) == [
        "warning: data.hf_name: will download the dataset someone/corpus from the Hugging Face hub (once, into the "
        "Hugging Face cache; a local save_to_disk folder as data.hf_name avoids it)",
        "warning: data.tokenizer: will download the tokenizer 'someone/tok' from the Hugging Face hub (a local "
        "tokenizer.json path avoids it)"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _warnings(dry_run_text(parse_spec(doc))) == [
        "warning: data.hf_name: needs the dataset someone/corpus in the Hugging Face cache (HF_HUB_OFFLINE is set: "
        "nothing is downloaded)",
        "warning: data.tokenizer: needs the tokenizer 'someone/tok' in the Hugging Face cache (HF_HUB_OFFLINE is set)"]


def test_the_dry_run_shows_the_sweep_a_run_would_launch(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    monkeypatch.setenv("LIME_RESULTS", str(results))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    doc = yaml.safe_load((ROOT / "sweeps" / "default.yaml").read_text())
    path = tmp_path / "default.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = load_spec(path)
    write_state(results / "ray" / "default", {"fingerprint": spec.fingerprint(), "parent_run_id": "p",
                                              "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"})
    before = sorted(p.name for p in (results / "ray" / "default").iterdir())
    assert main(["sweep", "run", str(path), "--dry-run", "--add-seeds", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "router=full,seed=9" in "\n".join(out) and out[-1] == "dry run: nothing was started"
    assert out[-2].startswith("seeds 8, 9 added: 6 new trials in Ray experiment ")
    doc["base"]["train"]["steps"] += 1
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["sweep", "run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("warning: a run would refuse: ") and "the sweep's trials changed since" in out[-2]
    assert sorted(p.name for p in (results / "ray" / "default").iterdir()) == before  # a dry run writes nothing
    assert not (tmp_path / "mlflow.db").exists()


def test_status_without_a_store_names_the_one_the_sweep_ran_with(tmp_path, monkeypatch):
    monkeypatch.setenv("LIME_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/here.db")
    with pytest.raises(ConfigError, match=r"^sweep 'x': no MLflow store at .*here.db \(nothing was created\); set "
                                          "MLFLOW_TRACKING_URI to the store the sweep ran with$"):
        status_text("x")
    write_state(tmp_path / "results" / "ray" / "x", {"tracking_uri": f"sqlite:///{tmp_path}/there.db"})
    with pytest.raises(ConfigError, match=r"; sweep 'x' ran with the store sqlite:///.*there.db: set "
                                          "MLFLOW_TRACKING_URI to it$"):
        status_text("x")
    assert not (tmp_path / "here.db").exists() and not list(tmp_path.glob("*.lock"))
    assert json.loads((tmp_path / "results" / "ray" / "x" / "lime_sweep.json").read_text())  # untouched
