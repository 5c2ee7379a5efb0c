"""The wall-clock speedup in `lime report`, end to end on the synthetic field of test_multiplier_report
(routers none, first-4 and full on the tiny preset, 8 seeds, 4 x 32 tokens a step; FLOPs per token 1e6,
full 1.1e6): without a measurement (one line), with a hand-written throughput.json whose numbers are
combined here by hand, with a stale one (refused), and `lime report --throughput` measuring for real."""
from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import torch

from orchestrator.cli import main
from orchestrator.core import tracking
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.report.build import build_report
from tests.orchestrator.report.test_multiplier_report import SEEDS, fill

NAME = "wallclock-field"
HEADING = "### Worth in wall-clock time (speedup)"
FULL = [1.10, 1.12, 1.08, 1.11, 1.09, 1.13, 1.10, 1.07, 1.11, 1.12, 1.09, 1.30]  # full / none step time per round
FIRST4 = [0.95, 0.97, 0.96, 0.94, 0.95, 0.96, 0.95, 0.97, 0.93, 0.96, 0.95, 0.98]  # first-4 / none


def shape_hash(router: str) -> str:
    """The hash of a trial's shape, by hand: the resolved tiny model less its init fields (MLflow params come
    back as strings, so an integral float such as rope_theta 10000.0 reads as the int 10000), then the step."""
    cfg = TrialConfig.from_dict({"preset": "tiny", "model": {"router": router},
                                 "train": {"steps": 50, "batch_size": 4, "seq_len": 32}})
    model = {k: int(v) if isinstance(v, float) and v.is_integer() else v
             for k, v in cfg.model_config().to_dict().items() if k not in ("init_std", "router_init")}
    shape = {"model": model, "batch_size": 4, "seq_len": 32, "grad_accum": 1, "device": "auto", "compile": False,
             "threads": None}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def measurement(first4_variant: str | None = None) -> dict:
    none = shape_hash("none")
    pair = [{"baseline": none, "variant": shape_hash("full"), "ratios": FULL,
             "step_ms": {"baseline": 10.0, "variant": 11.0}},
            {"baseline": none, "variant": first4_variant or shape_hash("first-4"), "ratios": FIRST4,
             "step_ms": {"baseline": 10.0, "variant": 9.5}}]
    return {"format": "lime-throughput/1", "sweep": NAME, "created": "2026-12-01T10:00:00+00:00",
            "machine": {"device": "cpu", "cpu": "Test CPU", "dtype": "fp32", "torch": "2.x"}, "commit": "abc123",
            "load_before": [0.25, 0.2, 0.1], "load_after": [0.5, 0.2, 0.1], "threads": 1, "clock": "thread CPU time",
            "rounds": 12, "warmup": 2, "seconds": 1.0, "shapes": {}, "pairs": pair}


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    root = tmp_path_factory.mktemp("wallclock")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.chdir(root)
        cl = tracking.client()
        parent = fill(cl, NAME, ("none", "first-4", "full"), range(10, 51, 10), overlap=True)
        yield root, cl, parent


def report(root, sub: str, file: dict | None = None):
    out = root / sub
    if file is not None:
        (out / NAME).mkdir(parents=True, exist_ok=True)
        (out / NAME / "throughput.json").write_text(json.dumps(file))
    md = build_report(NAME, out=out, log_to_mlflow=False).read_text()
    rows = {r["variant"]: r for r in csv.DictReader(open(out / NAME / "summary.csv")) if r["scope"] == "all"}
    return md, rows


def section(md: str) -> str:
    return md.split(HEADING)[1].split("\n## ")[0]


def test_without_a_measurement_the_report_says_so_in_one_line(field):
    md, rows = report(field[0], "none")
    body = [x for x in section(md).splitlines() if x.strip()]
    assert body == [f"Wall-clock speedup: not measured. `lime report {NAME} --throughput` measures each variant's "
                    "training throughput against the baseline's at this sweep's shape, in one process (interleaved, "
                    "paired rounds), and saves it as throughput.json beside the report; the sweep's own step times "
                    "are never used for it."]
    assert rows["full"]["wall_clock_speedup"] == "" and "wall-clock speedup [interval]" not in md


def test_a_saved_measurement_gives_the_speedup_combined_by_hand(field):
    md, rows = report(field[0], "fixture", measurement())
    # first-4's multiplier per seed (test_multiplier_report): 0.8 x 1.25^((0.075 - 0.06 - 0.002 s) / 0.075), the
    # same FLOPs per step; full's are its per-seed values at 1.1x the FLOPs per step
    m4 = np.array([0.8 * 1.25 ** ((0.075 - 0.06 - 0.002 * s) / 0.075) for s in SEEDS])
    # 2 multiplier comparisons, each at 97.5%; 8 seeds: the multiplier's own [min, max], exact error 2 / 2^8;
    # the rounds at 1 - (0.025 - 2 / 2^8): 12 rounds, the 2nd from each end (2 x 13 / 2^12 <= 0.0171875 < 2 x 79 / 2^12)
    r4 = np.sort(FIRST4)
    s = rows["first-4"]
    point = math.sqrt(m4[3] * m4[4]) / math.sqrt(r4[5] * r4[6])
    assert float(s["wall_clock_speedup"]) == pytest.approx(point, rel=1e-9)
    assert float(s["wall_clock_speedup_ci_low"]) == pytest.approx(m4.min() / r4[10], rel=1e-9)
    assert float(s["wall_clock_speedup_ci_high"]) == pytest.approx(m4.max() / r4[1], rel=1e-9)
    assert float(s["wall_clock_speedup_level"]) == pytest.approx(0.975)
    assert float(s["throughput_level"]) == pytest.approx(1 - (0.025 - 2 / 2 ** 8))
    assert s["wall_clock_speedup_verdict"] == "slower" and s["throughput_rounds"] == "12"
    assert float(s["flops_per_step_ratio"]) == pytest.approx(1.0)
    f = rows["full"]
    mf = float(f["compute_multiplier"])
    rf = np.sort(FULL)
    assert float(f["throughput_ratio"]) == pytest.approx(1.1 / math.sqrt(rf[5] * rf[6]), rel=1e-9)
    assert float(f["wall_clock_speedup"]) == pytest.approx(mf * 1.1 / math.sqrt(rf[5] * rf[6]), rel=1e-8)
    assert float(f["wall_clock_speedup_ci_high"]) == pytest.approx(
        float(f["compute_multiplier_ci_high"]) * 1.1 / rf[1], rel=1e-8)  # [min, max] at 97.5% and at 98.75% alike
    text = section(md)
    assert "Measured for this report in one process on cpu (Test CPU), fp32, 1 thread(s), clock thread CPU time, " \
           "load average 0.25 before and 0.5 after; torch 2.x, commit `abc123`" in text
    assert "- **first-4**: " in text
    assert "slower: the baseline reaches the variant's loss in less wall-clock time" in text
    assert "sign interval over 12 rounds" in text and "FLOPs per step ratio 1.1;" in text
    ranking = md.split("### Ranking")[1].split("### All numbers")[0]
    assert "wall-clock speedup [interval]" in ranking


def test_a_stale_file_is_refused_with_one_line(field):
    md, rows = report(field[0], "stale", measurement(first4_variant="0" * 16))
    body = [x for x in section(md).splitlines() if x.strip()]
    assert len(body) == 1 and body[0].startswith(
        "Wall-clock speedup: throughput.json is stale: 1 of the 2 pairs of models this report compares are not in "
        f"it at their model/shape hash (e.g. baseline {shape_hash('none')} and variant {shape_hash('first-4')})")
    assert rows["first-4"]["wall_clock_speedup"] == "" and rows["full"]["wall_clock_speedup"] == ""


def test_lime_report_throughput_measures_saves_and_is_read_again(field, capsys):
    root, cl, parent = field
    out = root / "cli"
    # the trials left train.threads unset (torch's default); one thread here times by the thread's CPU time, which a
    # loaded test machine disturbs far less than wall time (conftest puts the thread count back)
    torch.set_num_threads(1)
    assert main(["report", NAME, "--out", str(out), "--throughput", "--throughput-rounds", "8"]) == 0
    err = capsys.readouterr().err
    assert "measuring the throughput of 2 pair(s) of models, 8 paired rounds each" in err
    doc = json.loads((out / NAME / "throughput.json").read_text())
    assert doc["rounds"] == 8 and doc["sweep"] == NAME and doc["machine"]["device"] == "cpu"
    assert (doc["threads"], doc["clock"]) == (1, "thread CPU time")
    assert sorted((p["baseline"], p["variant"]) for p in doc["pairs"]) == sorted(
        (shape_hash("none"), shape_hash(r)) for r in ("first-4", "full"))
    assert all(len(p["ratios"]) == 8 and min(p["ratios"]) > 0 for p in doc["pairs"])
    md = (out / NAME / "report.md").read_text()
    rows = {r["variant"]: r for r in csv.DictReader(open(out / NAME / "summary.csv")) if r["scope"] == "all"}
    for v in ("first-4", "full"):
        lo, w, hi = (float(rows[v][k]) for k in ("wall_clock_speedup_ci_low", "wall_clock_speedup",
                                                  "wall_clock_speedup_ci_high"))
        assert 0 < lo <= w <= hi < math.inf  # 8 rounds at 98.75%: [min, max] of the rounds, finite
    assert "sign interval over 8 rounds" in section(md)
    assert cl.get_run(parent).data.metrics["wallclock/full/speedup"] == pytest.approx(
        float(rows["full"]["wall_clock_speedup"]))
    # a later report without --throughput reads the saved file: the same report, byte for byte
    shutil.copy(out / NAME / "report.md", root / "first.md")
    assert main(["report", NAME, "--out", str(out)]) == 0
    assert (out / NAME / "report.md").read_text() == (root / "first.md").read_text()
