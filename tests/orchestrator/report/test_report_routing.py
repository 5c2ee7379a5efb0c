"""The report's router-pruning section (Table 5's counts, the paired loss cost and step-time change
of pruning against the unpruned twins) and the Figure 9 curves, on hand-built runs frames and maps."""
import numpy as np
import pandas as pd
from scipy import stats as sps

from orchestrator.report.render.retrieval import retrieval_curves, retrieval_plots, spread_plots
from orchestrator.report.routing import section


def _frame():
    """Six seeds of full and of full pruned at one depth (and an unpruned none beside them)."""
    rows = []
    rng = np.random.default_rng(0)
    for seed in range(6):
        base_loss, base_ms = 2.0 + 0.01 * seed, 100.0 + seed
        common = {"status": "finished", "seed": seed, "n_layers": 8, "steps": 100, "router_lr": None}
        rows.append({**common, "_cell": "full", "router": "full", "final/val_loss": base_loss,
                     "final/step_time_ms": base_ms, "final/pruned_weights": float("nan")})
        rows.append({**common, "_cell": "none", "router": "none", "final/val_loss": base_loss + 0.1,
                     "final/step_time_ms": 80.0, "final/pruned_weights": float("nan")})
        rows.append({**common, "_cell": "full-top-p", "router": "full",
                     "final/val_loss": base_loss + 0.02 + 0.001 * rng.standard_normal(),
                     "final/step_time_ms": base_ms * 0.9, "final/pruned_weights": 100.0 + seed,
                     "final/router_weights": 280.0, "final/pruned_fraction": (100.0 + seed) / 280,
                     "final/skipped_sources": 3.0})
    rows.append({"status": "failed", "seed": 6, "n_layers": 8, "steps": 100, "router_lr": None, "_cell": "full-top-p",
                 "router": "full", "final/val_loss": float("nan"), "final/pruned_weights": 1.0})
    return pd.DataFrame(rows)


def test_section_counts_and_paired_changes():
    df = _frame()
    md = "\n".join(section(df, ["none", "full", "full-top-p"], "final/val_loss", "min"))
    # Table 5's counts: the mean over the six finished seeds (the failed trial left out)
    assert "| full-top-p | 6 | 102 | 280 | 0.366 | 3 |" in md
    pruned = df[(df["_cell"] == "full-top-p") & (df["status"] == "finished")]
    full = df[df["_cell"] == "full"]
    d = pruned["final/val_loss"].to_numpy() - full["final/val_loss"].to_numpy()
    # the loss cost: a clear +0.02 with 6 seeds, so the interval excludes 0 and the verdict is "worse"
    lo, hi = sps.t.interval(0.95, 5, loc=d.mean(), scale=d.std(ddof=1) / np.sqrt(6))
    row = next(line for line in md.splitlines() if line.startswith("| full-top-p | full |"))
    assert f"{d.mean():+.4g}" in row and "worse" in row and lo > 0
    # the step time: 10% less at every seed, "better" (lower), ratio 0.900
    assert row.endswith("| 0.900 |") and row.count("better") == 1


def test_no_section_without_pruned_trials():
    df = _frame()
    assert section(df[df["_cell"] != "full-top-p"], ["none", "full"], "final/val_loss", "min") == []
    assert section(df.drop(columns=["final/pruned_weights"]), ["full"], "final/val_loss", "min") == []


def test_retrieval_curves_by_hand():
    m = np.array([[1.0, 0.0, 0.0],
                  [0.25, 0.75, 0.0],
                  [0.5, 0.1, 0.4]])
    later, own = retrieval_curves(m)
    np.testing.assert_allclose(later, [(0.25 + 0.5) / 2, 0.1])  # s=0: rows 1, 2; s=1: row 2
    np.testing.assert_allclose(own, [1.0, 0.75, 0.4])


def test_retrieval_and_spread_plots(tmp_path):
    eye = np.eye(3)
    m = np.array([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.5, 0.1, 0.4]])
    plots = retrieval_plots({"none": (eye, 2), "full": (m, 2), "deep": (np.eye(5) * 0.5 + 0.1, 1)},
                            ["none", "full", "deep"], tmp_path, "s")
    assert [f for _, f in plots] == ["retrieval_L3.png", "retrieval_L5.png"]  # none (the identity) left out
    assert all((tmp_path / f).stat().st_size > 0 for _, f in plots)

    class Client:  # runs r1, r2 wrote a spread (a dynamic router); r3 did not (a static one)
        def download_artifacts(self, rid, name, dst):
            if rid == "r3":
                raise FileNotFoundError(name)
            p = f"{dst}.npz"
            np.savez(p, spread=np.full((3, 3), 0.1 if rid == "r1" else 0.3), tokens=4)
            return p

    plots = spread_plots(Client(), {"dynamic": ["r1", "r2"], "full": ["r3"]}, ["full", "dynamic"], tmp_path)
    assert [f for _, f in plots] == ["router_spread_dynamic.png"] and "mean over 2 seed(s)" in plots[0][0]


def test_twins_need_the_same_depth():
    df = _frame()
    df.loc[df["_cell"] == "full", "n_layers"] = 16  # no unpruned trial at the pruned trials' depth
    md = "\n".join(section(df, ["full", "full-top-p"], "final/val_loss", "min"))
    assert "| full-top-p | (no unpruned twin) | 0 |" in md
