import numpy as np
import pytest
import torch

from lime_arch import build_model, preset
from orchestrator.analysis.analyze import analyze_model, word_positions
from orchestrator.analysis.capture import capture
from orchestrator.engine.data import make_batches
from orchestrator.engine.data.corpus import ByteTokenizer
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import DataConfig, TrialConfig


@pytest.mark.parametrize("router", ["none", "full", "per-dim"])
def test_capture_does_not_change_outputs_and_records_routed_values(router):
    model = build_model(preset("tiny", router=router, n_kv_heads=2)).eval()
    x = torch.randint(0, 256, (2, 10))
    before = model(x)
    with capture(model) as st:
        during = model(x)
    after = model(x)
    torch.testing.assert_close(before, during, rtol=0, atol=0)
    torch.testing.assert_close(before, after, rtol=0, atol=0)
    assert st["hidden"][3].shape == (2, 10, 64) and st["values"][3].shape == (2, 10, 2 * 16)
    # the recorded values are the routed ones: for layer 0 they equal the plain V projection
    blk = model.blocks[0]
    v0 = blk.attn.wv(blk.attn_norm(model.embed(x)))
    torch.testing.assert_close(st["values"][0], v0)


def test_expected_source_of_none_is_the_current_layer():
    model = build_model(preset("tiny", router="none", vocab_size=257))
    res = analyze_model(model, make_batches(DataConfig()), sequences=8, seq_len=64)
    np.testing.assert_array_equal(res.expected_source, np.arange(4))
    np.testing.assert_array_equal(res.source_map, np.eye(4))
    full = analyze_model(build_model(preset("tiny", router="full", vocab_size=257)), make_batches(DataConfig()),
                         sequences=8, seq_len=64)
    assert (full.expected_source[1:] < np.arange(1, 4)).all()  # full routing reaches back
    assert set(res.metrics) >= {"analysis/value_entropy/layer_0", "analysis/hidden_entropy/layer_3",
                                "analysis/expected_source/layer_2"}


def test_word_positions_point_at_the_last_token_of_each_word():
    tok = ByteTokenizer()
    text = "this is it; they were here and it was. Island is"
    ids = torch.tensor([tok.encode(text)])
    pos, labels = word_positions(ids, tok, ("is", "are", "was", "were"))
    assert labels == ["is", "were", "was", "is"]  # not "this", not "Island"
    for (_, t), w in zip(pos, labels):
        assert text[t - len(w) + 1:t + 1].lower() == w


def test_end_of_trial_analysis_and_cli(tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from orchestrator.cli import main

    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "full", "n_layers": 2},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 64, "log_interval": 2, "eval_batches": 1,
                  "analyze": True, "analyze_sequences": 8, "checkpoint_dir": str(tmp_path / "ck")}})
    res = run_trial(cfg, tracking=Tracking(experiment="an"))
    m = MlflowClient(mlflow_uri).get_run(res.run_id).data.metrics
    assert "analysis/value_entropy/layer_1" in m and "analysis/expected_source/layer_1" in m
    out = tmp_path / "out"
    assert main(["analyze", f"lime={tmp_path / 'ck'}", "--out", str(out), "--sequences", "8"]) == 0
    assert (out / "analysis.md").read_text().count("| lime |") == 2
    assert (out / "value_entropy.png").stat().st_size > 0
    assert main(["analyze", str(tmp_path / "nope")]) == 2


def test_dynamic_router_trial_maps_and_cli_routes(tmp_path, mlflow_uri):
    """A dynamic router's end-of-trial artifacts hold its mixing averaged over validation tokens
    and its spread; ``lime analyze`` lists its strongest routes with tokens and key lenses."""
    from mlflow.tracking import MlflowClient

    from orchestrator.cli import main

    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {"router": "dynamic", "n_layers": 3, "n_kv_heads": 2},
        "train": {"steps": 4, "batch_size": 2, "seq_len": 32, "log_interval": 2, "eval_batches": 2,
                  "checkpoint_dir": str(tmp_path / "ck")}})
    res = run_trial(cfg, tracking=Tracking(experiment="dyn"))
    cl = MlflowClient(mlflow_uri)
    arts = {a.path for a in cl.list_artifacts(res.run_id)}
    assert {"router_weights.npz", "router_heatmap.png", "router_spread.npz", "router_spread_heatmap.png"} <= arts
    with np.load(cl.download_artifacts(res.run_id, "router_spread.npz", str(tmp_path))) as z:
        # the first 4 validation batches (hooks.MAP_BATCHES): data.val_tokens=32768 is 1024 windows of 32,
        # in batches of max(batch 2, 8192 // 32 = 256) windows, so all 4 batches, 1024 x 32 tokens
        assert z["spread"].shape == (3, 3) and int(z["tokens"]) == 1024 * 32 and z["spread"][1:].max() > 0
    with np.load(cl.download_artifacts(res.run_id, "router_weights.npz", str(tmp_path))) as z:
        rows = z["layer_2"].sum(-1)  # a convex mix per routed head at each token, so also on average
        np.testing.assert_allclose(rows, np.ones(2), rtol=1e-5)
    out = tmp_path / "out"
    assert main(["analyze", f"dyn={tmp_path / 'ck'}", "--out", str(out), "--sequences", "4", "--routes", "3"]) == 0
    md = (out / "analysis.md").read_text()
    assert "## dyn: strongest routes" in md and "tokens where it fires" in md and md.count("| 2 |") >= 1
    assert (out / "router_spread_dyn.png").stat().st_size > 0
    assert main(["analyze", str(tmp_path / "ck"), "--routes", "-1"]) == 2
