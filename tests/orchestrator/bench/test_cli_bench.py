"""``lime bench``: bad options fail in one line before anything runs; a tiny run logs to MLflow."""
import pytest
import torch
from mlflow.tracking import MlflowClient

from orchestrator.cli import main

BAD = [
    (["--shapes", "L16-MHA,L9"], "bench.shapes"),
    (["--routers", "full,bogus"], "bench.routers"),
    (["--routers", "first-0"], "bench.routers"),
    (["--threads", "0"], "bench.threads"),
    (["--device", "tpu"], "bench.device"),
    (["--depth-mixes", "denseformer,densformer"], "bench.depth_mixes"),
    (["--compile", "max"], "bench.compile"),
    (["--compile-shapes", "L16-MHA"], "bench.compile_shapes"),  # without a compile mode
    (["--compile", "default", "--compile-shapes", "L16-MHA,L99"], "bench.compile_shapes"),
    (["--compile", "default", "--shapes", "L64-MHA"], "bench.compile_shapes"),  # default L16s: nothing compiled
]


@pytest.mark.parametrize("argv,field", BAD)
def test_bad_bench_options_exit_2(argv, field, tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path / "b"), "--no-track", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}"), err
    assert not (tmp_path / "b").exists()  # nothing ran


def test_compile_shapes_default_to_table_17_models():
    from orchestrator.cli import build_parser
    from orchestrator.cli.bench import options

    def kw(*argv):
        return options(build_parser().parse_args(["bench", *argv]))

    assert kw("--compile", "default")["compile_shapes"] == ("L16-MHA", "L16-GQA")
    assert kw("--compile", "default", "--compile-shapes", "all")["compile_shapes"] == \
        ("L16-MHA", "L16-GQA", "L64-MHA", "L128-MHA", "L3-MHA", "L3-GQA")
    one = kw("--compile", "default", "--shapes", "L64-MHA", "--compile-shapes", "L64-MHA")
    assert one["compile_shapes"] == ("L64-MHA",)
    assert kw()["compile_shapes"] is None and kw("--quick", "--compile", "default")["compile_shapes"] is None


def test_bench_logs_rows_and_decode_to_mlflow(tmp_path, mlflow_uri, capsys):
    out = tmp_path / "b"
    assert main(["bench", "--quick", "--shapes", "L3-GQA", "--routers", "full", "--no-memory",
                 "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"bench.md", "bench.csv", "decode.csv"}
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("lime-bench")
    (run,) = client.search_runs([exp.experiment_id])
    m = run.data.metrics
    assert m["bench/ratio/none.buffer.L3-GQA"] == 1.0
    assert m["bench/ratio/full.buffer.L3-GQA"] > 0 and "bench/ratio/full.concat.L3-GQA" in m
    assert m["bench/ratio/none.buffer.L3-GQA.denseformer"] > 0  # the peer rows keep their own keys
    assert "bench/flop_overhead_pct/none.buffer.L3-GQA.hyper-connections" in m
    assert m["bench/decode_ratio/none.b1"] == 1.0 and m["bench/decode_tok_s/full.b8"] > 0
    assert run.data.params["device"] == "cpu" and run.data.params["torch"].startswith("2.")
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"bench.md", "bench.csv", "decode.csv"} <= arts


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is for machines without CUDA")
def test_cuda_without_a_device_exits_2_before_anything_runs(tmp_path, capsys):
    assert main(["bench", "--device", "cuda", "--quick", "--out", str(tmp_path / "b"), "--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bench.device: cuda requested but torch sees no CUDA device here"]
    assert not (tmp_path / "b").exists()


def test_only_the_bench_command_keeps_glibc_s_heap_steady(tmp_path, monkeypatch):
    """glibc's raised thresholds (``steady_malloc``) last for the rest of the process: `lime bench`,
    whose process ends with the run, asks for them; ``run_bench`` called from a process that goes on
    (a test, a notebook) does not get them unless it asks."""
    import inspect

    import orchestrator.bench
    from orchestrator.bench.suite import run_bench

    assert inspect.signature(run_bench).parameters["steady_heap"].default is False
    seen = {}

    def fake_run_bench(**kw):
        seen.update(kw)
        return {"paths": [], "checks": [], "machine": {"seconds": 0.0}, "rows": [], "decode": []}

    monkeypatch.setattr(orchestrator.bench, "run_bench", fake_run_bench)
    assert main(["bench", "--quick", "--no-track", "--out", str(tmp_path / "b")]) == 0
    assert seen["steady_heap"] is True and seen["quick"] is True
