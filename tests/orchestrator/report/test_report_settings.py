"""What a report compares: the parent run's params, the defaults, and the command line's overrides."""
from __future__ import annotations

from orchestrator.core.record import ReportSettings, axis_names
from orchestrator.report.settings import DEFAULTS, choose

PARAMS = {"sweep.n_trials": "12", "sweep.axes": "model.n_layers,router,seed",
          "sweep.report.metric": "val/loss", "sweep.report.axis": "model.n_layers",
          "sweep.report.baseline": "4", "sweep.fingerprint": "0123456789abcdef"}


def test_settings_from_the_parent_params():
    s = ReportSettings.from_params(PARAMS)
    assert (s.metric, s.axis, s.baseline) == ("val/loss", "model.n_layers", 4)
    assert s.axes == ("n_layers", "router", "seed") and s.stated is None
    assert ReportSettings.from_params({**PARAMS, "sweep.report.baseline": "None"}).baseline is None
    assert ReportSettings.from_params({**PARAMS, "sweep.report.baseline": "full"}).baseline == "full"
    assert ReportSettings.from_params({**PARAMS, "sweep.axes": ""}).axes == ()
    stated = ReportSettings.from_params({**PARAMS, "sweep.report.explicit": "axis,baseline"}).stated
    assert stated == frozenset({"axis", "baseline"})
    assert ReportSettings.from_params({k: v for k, v in PARAMS.items() if k != "sweep.report.axis"}) is None
    assert ReportSettings.from_params({}) is None


def test_axis_names_are_canonical_and_unique():
    assert axis_names(["model.router", "router", "optim.lr", "model.d_ff"]) == ("router", "lr", "model.d_ff")


def test_choose_applies_the_overrides():
    s = ReportSettings(metric="val/loss", axis="model.n_layers", baseline=4, axes=("n_layers", "router", "seed"),
                       stated=frozenset({"axis", "baseline"}))
    c = choose(s)
    assert (c.metric, c.axis, c.baseline, c.explicit_baseline) == ("val/loss", "n_layers", 4, True)
    assert c.grid_cols == ["n_layers", "router"]
    c = choose(s, metric="final/val_loss", axis="router")  # another axis: the default baseline
    assert (c.metric, c.axis, c.baseline, c.explicit_baseline) == ("final/val_loss", "router", "none", False)
    assert c.baseline_origin == "default"
    c = choose(s, axis="n_layers", baseline="2")  # the same axis, written as its alias
    assert (c.axis, c.baseline, c.explicit_baseline) == ("n_layers", "2", True)


def test_a_baseline_whose_origin_is_unknown_is_a_soft_one():
    c = choose(ReportSettings(axis="router", baseline="full", stated=None))
    assert (c.baseline, c.explicit_baseline, c.baseline_origin) == ("full", False, "sweep's")
    c = choose(ReportSettings(axis="router", baseline="full", stated=frozenset({"axis"})))
    assert (c.explicit_baseline, c.baseline_origin) == (False, "default")
    c = choose(DEFAULTS)
    assert (c.metric, c.axis, c.baseline, c.explicit_baseline, c.grid_cols) == \
        ("final/val_loss", "router", "none", False, [])
