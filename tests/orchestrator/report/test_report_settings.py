"""What a report compares: the parent run's params, the defaults, and the command line's overrides."""
from __future__ import annotations

from orchestrator.report.settings import DEFAULTS, ReportSettings, axis_names, settings_from_params

PARAMS = {"sweep.n_trials": "12", "sweep.axes": "model.n_layers,router,seed",
          "sweep.report.metric": "val/loss", "sweep.report.axis": "model.n_layers",
          "sweep.report.baseline": "4", "sweep.fingerprint": "0123456789abcdef"}


def test_settings_from_the_parent_params():
    s = settings_from_params(PARAMS)
    assert (s.metric, s.axis, s.baseline) == ("val/loss", "model.n_layers", 4)
    assert s.axes == ("n_layers", "router", "seed") and s.stated is None
    assert settings_from_params({**PARAMS, "sweep.report.baseline": "None"}).baseline is None
    assert settings_from_params({**PARAMS, "sweep.report.baseline": "full"}).baseline == "full"
    assert settings_from_params({**PARAMS, "sweep.axes": ""}).axes == ()
    stated = settings_from_params({**PARAMS, "sweep.report.explicit": "axis,baseline"}).stated
    assert stated == frozenset({"axis", "baseline"})
    assert settings_from_params({k: v for k, v in PARAMS.items() if k != "sweep.report.axis"}) is None
    assert settings_from_params({}) is None


def test_axis_names_are_canonical_and_unique():
    assert axis_names(["model.router", "router", "optim.lr", "model.d_ff"]) == ("router", "lr", "model.d_ff")


def test_choose_applies_the_overrides():
    s = ReportSettings(metric="val/loss", axis="model.n_layers", baseline=4, axes=("n_layers", "router", "seed"),
                       stated=frozenset({"axis", "baseline"}))
    c = s.choose()
    assert (c.metric, c.axis, c.baseline, c.explicit_baseline) == ("val/loss", "n_layers", 4, True)
    assert c.grid_cols == ["n_layers", "router"]
    c = s.choose(metric="final/val_loss", axis="router")  # another axis: the default baseline
    assert (c.metric, c.axis, c.baseline, c.explicit_baseline) == ("final/val_loss", "router", "none", False)
    assert c.baseline_origin == "default"
    c = s.choose(axis="n_layers", baseline="2")  # the same axis, written as its alias
    assert (c.axis, c.baseline, c.explicit_baseline) == ("n_layers", "2", True)


def test_a_baseline_whose_origin_is_unknown_is_a_soft_one():
    c = ReportSettings(axis="router", baseline="full", stated=None).choose()
    assert (c.baseline, c.explicit_baseline, c.baseline_origin) == ("full", False, "sweep's")
    c = ReportSettings(axis="router", baseline="full", stated=frozenset({"axis"})).choose()
    assert (c.explicit_baseline, c.baseline_origin) == (False, "default")
    c = DEFAULTS.choose()
    assert (c.metric, c.axis, c.baseline, c.explicit_baseline, c.grid_cols) == \
        ("final/val_loss", "router", "none", False, [])
