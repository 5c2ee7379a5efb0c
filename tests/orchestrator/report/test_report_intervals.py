"""No verdict contradicts its interval: over reports built from synthetic MLflow stores (fixed seeds
with a margin, a depth sweep whose family spans its tables) and over every committed
results/*/summary.csv and pairs.csv (``orchestrator.decide.verdict.table_contradictions``; a summary
written before the interval columns existed is skipped until its report is regenerated)."""
from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.core import tracking
from orchestrator.decide.verdict import BETTER, EQUIVALENT, UNDECIDED, table_contradictions
from orchestrator.report.build import build_report
from tests.orchestrator.report.test_report import T0, add_trial, log_sweep_params

ROOT = Path(__file__).resolve().parents[3]
SUMMARIES = sorted((ROOT / "results").glob("*/summary.csv"))
OFFSETS = [0.0, 0.3, -0.2, 0.5, -0.4, 0.1, 0.25, -0.3]  # per-seed shared parts that pairing removes
NOISE = [1.0, -1.0, 0.6, -0.6, 0.3, -0.3, 0.8, -0.8]  # a variant's own noise, in units of its jitter (mean 0)


def _store(tmp_path, monkeypatch, name: str, effects: dict, depths=(3,), margin: str | None = None):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cl = tracking.client()
    exp = tracking.experiment_id(name, cl)
    parent = cl.create_run(exp, tags={"sweep": name, "sweep_role": "parent"}).info.run_id
    axes = "router,model.n_layers,seed" if len(depths) > 1 else "router,seed"
    log_sweep_params(cl, parent, axes=axes, axis="router", baseline="none",
                     n_trials=len(effects) * 8 * len(depths), **({"margin": margin} if margin else {}))
    t = T0
    for depth in depths:
        for router, (shift, jitter) in effects.items():
            for s, off in enumerate(OFFSETS):
                t += 1000
                value = 3.0 + off + shift * depth / depths[-1] + jitter * NOISE[s]
                add_trial(cl, exp, parent, name, router, s, n_layers=depth, final=value, status="finished",
                          start=t, trial_id=f"router={router},n_layers={depth},seed={s}")
    return cl


def _rows(out: Path) -> list[dict]:
    rows = list(csv.DictReader(open(out / "summary.csv")))
    if (out / "pairs.csv").is_file():
        rows += list(csv.DictReader(open(out / "pairs.csv")))
    return rows


def test_a_fixed_seed_report_with_a_margin(tmp_path, monkeypatch):
    effects = {"none": (0.0, 0.0), "full": (-0.05, 0.01), "first-4": (0.0, 0.002)}
    _store(tmp_path, monkeypatch, "iv-margin", effects, margin="0.01")
    out = build_report("iv-margin", out=tmp_path / "r", log_to_mlflow=False).parent
    rows = _rows(out)
    assert table_contradictions(rows) == []
    s = {r["variant"]: r for r in rows if r.get("scope") == "all" and "variant" in r}
    assert s["full"]["verdict"] == BETTER and s["first-4"]["verdict"] == EQUIVALENT
    assert float(s["full"]["ci_level"]) == pytest.approx(1 - 0.05 / 2) and s["full"]["family_size"] == "2"
    pairs = pd.read_csv(out / "pairs.csv")
    assert len(pairs) == 1 and set(pairs["family"]) == {"all-pairs"}
    assert (pairs["a"][0], pairs["verdict"][0]) == ("first-4", "worse")
    md = (out / "report.md").read_text()
    assert "Equivalence margin: +-0.01" in md and "Screening" in md
    assert "All pairs of variants" in md
    assert "**first-4**: equivalent to `none` within the margin +-0.01" in md


def test_a_margin_on_a_metric_no_run_logs_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from lime_arch.errors import ConfigError

    _store(tmp_path, monkeypatch, "iv-typo", {"none": (0.0, 0.0), "full": (-0.05, 0.01)},
           margin="final/val_loss=0.01;eval/arc/acc=1%")
    with pytest.raises(ConfigError) as e:
        build_report("iv-typo", out=tmp_path / "r", log_to_mlflow=False)
    assert str(e.value).startswith("report.margin.eval/arc/acc: 'eval/arc/acc' is not logged by any run of sweep "
                                   "'iv-typo'; metrics: [")
    assert not (tmp_path / "r").exists()


def test_without_a_margin_nothing_is_called_a_match(tmp_path, monkeypatch):
    _store(tmp_path, monkeypatch, "iv-none", {"none": (0.0, 0.0), "first-4": (0.0, 0.02)})
    out = build_report("iv-none", out=tmp_path / "r", log_to_mlflow=False).parent
    md = (out / "report.md").read_text()
    assert "equivalent" not in md.split("## Verdicts")[1].split("## ")[0].replace("no verdict says", "")
    assert "No equivalence margin" in md and table_contradictions(_rows(out)) == []
    assert [r["verdict"] for r in _rows(out) if r.get("variant") == "first-4"] == [UNDECIDED]


def test_a_depth_sweep_has_one_family_over_its_tables(tmp_path, monkeypatch):
    _store(tmp_path, monkeypatch, "iv-depth", {"none": (0.0, 0.0), "full": (-0.04, 0.01)}, depths=(2, 4, 8))
    out = build_report("iv-depth", out=tmp_path / "r", log_to_mlflow=False).parent
    rows = [r for r in _rows(out) if r.get("variant") == "full"]
    assert len(rows) == 4 and {r["family_size"] for r in rows} == {"4"}  # pooled + 3 depths
    assert all(float(r["ci_level"]) == pytest.approx(1 - 0.05 / 4) for r in rows)
    assert table_contradictions(_rows(out)) == []


def test_the_check_catches_the_old_reports_contradiction():
    # depth-scaling-cpu's 8-layer row before issue 25: "no detectable difference", bootstrap CI below 0
    old = {"scope": "n_layers=8", "variant": "full", "verdict": UNDECIDED, "diff_ci_low": "-0.04363",
           "diff_ci_high": "-0.01335", "better": "lower", "margin": ""}
    assert table_contradictions([old]) and not table_contradictions([{**old, "diff_ci_high": "0.001"}])


@pytest.mark.parametrize("summary", SUMMARIES, ids=[p.parent.name for p in SUMMARIES])
def test_no_committed_verdict_contradicts_its_interval(summary):
    rows = list(csv.DictReader(open(summary)))
    # every committed report has had its verdict intervals since issue 25; a report without them is stale
    assert rows and "ci_level" in rows[0], f"{summary.relative_to(ROOT)} has no ci_level column: regenerate it"
    pairs = summary.with_name("pairs.csv")
    if pairs.is_file():
        rows += list(csv.DictReader(open(pairs)))
    assert table_contradictions(rows) == []


def test_pooled_sweeps_share_one_family(tmp_path, monkeypatch):
    from orchestrator.cli import main
    from orchestrator.report.pool import build_pool

    _store(tmp_path, monkeypatch, "pool-a", {"none": (0.0, 0.0), "full": (-0.05, 0.01), "first-4": (0.0, 0.02)})
    _store(tmp_path, monkeypatch, "pool-b", {"none": (0.0, 0.0), "full": (-0.05, 0.01)})
    out = build_pool(["pool-a", "pool-b"], out=tmp_path / "r").parent
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert [(r["sweep"], r["variant"]) for r in rows] == [("pool-a", "first-4"), ("pool-a", "full"), ("pool-b", "full")]
    assert {r["family_size"] for r in rows} == {"3"} and {r["evidence"] for r in rows} == {"pooled: pool-a, pool-b"}
    assert all(float(r["ci_level"]) == pytest.approx(1 - 0.05 / 3) for r in rows)
    assert table_contradictions(rows) == [] and [r["verdict"] for r in rows][1:] == [BETTER, BETTER]
    md = (out / "report.md").read_text()
    assert "Confirmation" in md and "### pool-a" in md and "### pool-b" in md
    assert main(["report", "--pool", "pool-a"]) == 2 and main(["report", "x", "--pool", "pool-a,pool-b"]) == 2


def test_the_report_states_the_validation_sets_noise_and_the_seeds_a_verdict_needs(tmp_path, monkeypatch):
    """Issue 34: the eval's own standard error beside the seed sd; a not-decided comparison says how
    many seeds would decide its observed effect (the sign rule's power written out with scipy)."""
    import numpy as np
    import scipy.stats as sps

    cl = _store(tmp_path, monkeypatch, "iv-se", {"none": (0.0, 0.0), "full": (-0.004, 0.01)})
    runs = cl.search_runs([cl.get_experiment_by_name("iv-se").experiment_id], "tags.sweep_role = 'trial'")
    ses = [0.01 + 0.001 * i for i in range(len(runs))]
    for run, se in zip(runs, ses):
        cl.log_metric(run.info.run_id, "final/val_loss_se", se, step=0)
    out = build_report("iv-se", out=tmp_path / "r", log_to_mlflow=False).parent
    md = (out / "report.md").read_text()
    base = [3.0 + off for off in OFFSETS]  # the baseline's values (no shift, no jitter)
    assert (f"its standard error over windows (`final/val_loss_se`) is {float(np.median(ses)):.3g} (median over "
            f"trials); the baseline's seed-to-seed sd {float(np.std(base, ddof=1)):.3g}") in md
    # full: differences -0.004 + 0.01 x NOISE: d_z = mean / sd, and the fewest n at which the 95% sign
    # interval (one comparison in the family) excludes 0 with probability >= 0.8 for N(d_z, 1) differences
    d = np.array([-0.004 + 0.01 * x for x in NOISE])
    dz = abs(d.mean() / d.std(ddof=1))

    def power(n: int) -> float:
        k = 0
        while k < (n + 1) // 2 and 2 * sps.binom.cdf(k, n, 0.5) <= 0.05 * (1 + 1e-12):
            k += 1
        if k == 0:
            return 0.0
        p = sps.norm.cdf(dz)
        return sps.binom.sf(n - k, n, p) + sps.binom.sf(n - k, n, 1 - p)

    need = next((n for n in range(2, 201) if power(n) >= 0.8), None)
    words = f"{need} seeds per arm" if need is not None else "more than 200 seeds per arm"
    assert (f"Were the observed effect (d_z {dz:.2f}) the true one, the rule would decide it with 80% power at "
            f"{words}") in md


def test_the_seed_sd_beside_the_eval_se_is_taken_within_depths(tmp_path, monkeypatch):
    """A depth ladder's depths are not seed noise: the baseline's sd is pooled within each depth."""
    import numpy as np

    cl = _store(tmp_path, monkeypatch, "iv-se-depth", {"none": (0.0, 0.0), "full": (-0.05, 0.01)}, depths=(2, 4))
    runs = cl.search_runs([cl.get_experiment_by_name("iv-se-depth").experiment_id], "tags.sweep_role = 'trial'")
    for run in runs:
        cl.log_metric(run.info.run_id, "final/val_loss_se", 0.02, step=0)
    md = (build_report("iv-se-depth", out=tmp_path / "r", log_to_mlflow=False).parent / "report.md").read_text()
    # the baseline's values at each depth are 3.0 + OFFSETS (its shift is 0): pooled within depths the sd
    # is sd(OFFSETS); all 16 values in one sample would give sd(OFFSETS) x sqrt(14/15) (seed_sd below)
    assert f"the baseline's seed-to-seed sd {float(np.std(OFFSETS, ddof=1)):.3g}" in md


def test_seed_sd_pools_within_cells():
    import numpy as np
    import pandas as pd

    from orchestrator.report.render.sections import seed_sd

    df = pd.DataFrame({"n_layers": [2, 2, 2, 8, 8, 8], "m": [1.0, 1.1, 1.2, 3.0, 3.4, 3.8]})
    within = np.sqrt((np.var([1.0, 1.1, 1.2], ddof=1) * 2 + np.var([3.0, 3.4, 3.8], ddof=1) * 2) / 4)
    assert seed_sd(df, "m", ["n_layers"]) == pytest.approx(within)
    assert seed_sd(df, "m", []) == pytest.approx(np.std(df["m"], ddof=1))  # no other factor: all seeds
