"""Named variants (``grid.variant``: bundles of overrides) and the report's settings keys
(``report.alpha/mode/tune/paper``): expansion, validation, what reaches MLflow."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.sweep.mlflow_runs import sweep_record
from orchestrator.sweep.spec import load_spec, parse_spec

BASE = {"preset": "tiny", "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "ffn_dim": 64, "max_seq_len": 64},
        "data": {"source": "builtin"}, "train": {"steps": 10, "batch_size": 4, "seq_len": 32}}
TABLE1 = {"llama": {}, "lime": {"router": "full"}, "hot": {"optim.lr": 0.01, "router_init": "identity",
                                                             "router": "first-1"}}


def _spec(grid: dict, **over):
    return parse_spec({"name": "v", "description": "variants", "base": json.loads(json.dumps(BASE)), "grid": grid,
                       **over})


def _error(grid: dict, **over) -> str:
    with pytest.raises(ConfigError) as e:
        _spec(grid, **over)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_variant_axis_expands_to_its_bundles_in_file_order():
    spec = _spec({"variant": TABLE1, "seed": [0, 1]})
    ids = [t.trial_id for t in spec.trials()]
    assert ids == ["variant=llama,seed=0", "variant=llama,seed=1", "variant=lime,seed=0", "variant=lime,seed=1",
                   "variant=hot,seed=0", "variant=hot,seed=1"]
    assert spec.n_trials() == 6 and spec.axes() == ["variant", "seed"]
    cfg = {t.trial_id: t.config for t in spec.trials()}
    assert cfg["variant=llama,seed=1"].model == BASE["model"] and cfg["variant=llama,seed=1"].train.seed == 1
    assert cfg["variant=llama,seed=0"].optim.lr == 3e-3  # the base as is
    assert cfg["variant=lime,seed=0"].model["router"] == "full"
    hot = cfg["variant=hot,seed=1"]
    assert (hot.optim.lr, hot.model["router_init"], hot.model["router"], hot.train.seed) == (0.01, "identity",
                                                                                            "first-1", 1)
    # a bundle changes only its own keys: the rest of lime equals llama
    lime, llama = cfg["variant=lime,seed=0"].to_dict(), cfg["variant=llama,seed=0"].to_dict()
    lime["model"].pop("router")
    assert lime == llama
    # `name:` with nothing under it is the base as is, like {}
    assert _spec({"variant": {"llama": None, "lime": {"router": "full"}}}).trial_config({"variant": "llama"}).model \
        == BASE["model"]


def test_the_report_compares_variant_against_the_first_bundle_by_default():
    spec = _spec({"seed": [0, 1], "variant": TABLE1})
    assert (spec.report.axis, spec.report.baseline) == ("variant", "llama")
    spec = _spec({"variant": TABLE1}, report={"baseline": "lime"})
    assert (spec.report.axis, spec.report.baseline) == ("variant", "lime")
    spec = _spec({"variant": {"llama": {}, "lime": {"router": "full"}}, "lr": [1e-3, 3e-3]}, report={"tune": "lr"})
    assert spec.report.tune == "lr" and spec.report.axis == "variant"


def test_variant_fingerprint_follows_the_bundles_and_other_files_keep_theirs():
    a = _spec({"variant": TABLE1, "seed": [0]})
    b = _spec({"variant": {**TABLE1, "lime": {"router": "first-2"}}, "seed": [0]})
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == _spec({"variant": json.loads(json.dumps(TABLE1)), "seed": [0]}).fingerprint()
    # a grid without variants hashes exactly as before this feature (the sha256 of the same JSON)
    plain = _spec({"router": ["none", "full"], "seed": [0, 1]})
    d = {"base": plain.base, "grid": {"router": ["none", "full"], "seed": [0, 1]},
         "resources": {"cpu": 1.0, "gpu": 0.0}, "checkpoint_interval": None, "search": None}
    assert plain.fingerprint() == hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@pytest.mark.parametrize("grid, expect", [
    ({"variant": {"llama": {}, "lime": {"rooter": "full"}}}, "grid.variant.lime.rooter: unknown key; use an alias"),
    ({"variant": {"llama": {}, "lime": {"model.widht": 3}}}, "grid.variant.lime.model.widht: unknown key; allowed "
                                                             "model fields:"),
    ({"variant": {}}, "grid.variant: empty; give at least one named bundle"),
    ({"variant": None}, "grid.variant: empty; give at least one named bundle"),
    ({"variant": ["llama", "lime"]}, "grid.variant: must be a mapping of variant name -> overrides"),
    ({"variant": {"llama": {}, "lime": {"router": "full"}}, "router": ["none", "full"]},
     "grid.variant.lime.router: also an axis of this grid (grid.router)"),
    ({"variant": {"llama": {}, "lime": {"model.router": "full"}}, "router": ["none"]},
     "grid.variant.lime.model.router: also an axis of this grid (grid.router)"),
    ({"variant": {"llama": {}, "lime": {"router": "ful"}}}, "grid.variant.lime.router: unknown router 'ful'"),
    ({"variant": {"llama": {}, "lime": {"optim.lr": "fast"}}}, "grid.variant.lime.optim.lr: must be a number > 0"),
    ({"variant": {"llama": {}, "hot": {"lr": 0.1, "optim.min_lr": 0.5}}},
     "grid.variant.hot.optim.min_lr: 0.5 is above optim.lr=0.1"),
    ({"variant": {"llama": {}, "lime": 3}}, "grid.variant.lime: must be a mapping of key -> value"),
    ({"variant": {"llama": {}, "lime": {"router": "full", "model.router": "full"}}},
     "grid.variant.lime.model.router: the same key as variant.lime.router"),
    ({"variant": {"llama": {}, "lime": {"seed": 3}}}, "grid.variant.lime.seed: a variant does not set the seed"),
    ({"variant": {"a": {"router": "full"}, "b": {"model.router": "full"}}},
     "grid.variant.b: the same overrides as grid.variant.a"),
    ({"variant": {"v1.5": {}}}, "grid.variant: variant names are letters, digits"),
    ({"variant": {"a=b": {}}}, "grid.variant: variant names are letters, digits"),
    ({"router": {"none": {}}}, "grid.router: must be a list of values, got {'none': {}} (only grid.variant holds"),
])
def test_a_bad_variant_is_one_line_naming_the_bundle_key(grid, expect):
    msg = _error(grid)
    assert msg.startswith(expect), msg


def test_variants_belong_to_grids_not_searches():
    msg = _error({"variant": TABLE1}, search={"space": {"lr": {"uniform": [1e-3, 1e-2]}}})
    assert msg.startswith("grid.variant: named variants are a grid axis; a search sweep cannot have them"), msg


def test_an_extending_file_adds_and_changes_bundles(tmp_path):
    (tmp_path / "t1.yaml").write_text(yaml.safe_dump({"name": "t1", "description": "peers", "base": BASE,
                                                      "grid": {"variant": TABLE1, "seed": [0, 1]}}, sort_keys=False))
    (tmp_path / "t1-more.yaml").write_text(yaml.safe_dump({
        "name": "t1-more", "description": "one more peer", "extends": "t1",
        "grid": {"variant": {"lime": {"router": "first-2"}, "avg": {"router": "average"}}}}, sort_keys=False))
    spec = load_spec(tmp_path / "t1-more.yaml")
    assert list(spec.grid["variant"]) == ["llama", "lime", "hot", "avg"]  # merged key by key, new ones last
    assert spec.variant("lime") == {"router": "first-2"} and spec.variant("avg") == {"router": "average"}
    assert spec.trial_config({"variant": "hot"}).optim.lr == 0.01
    (tmp_path / "t1-only.yaml").write_text(yaml.safe_dump({
        "name": "t1-only", "description": "two peers", "extends": "t1", "replace": ["grid.variant"],
        "grid": {"variant": {"llama": {}, "avg": {"router": "average"}}}}, sort_keys=False))
    assert list(load_spec(tmp_path / "t1-only.yaml").grid["variant"]) == ["llama", "avg"]


def test_the_depth_mix_alias_names_the_model_field():
    from orchestrator.core.keys import ALIASES

    assert ALIASES["depth_mix"] == "model.depth_mix"


# -- report settings --------------------------------------------------------------------------------------
@pytest.mark.parametrize("report, expect", [
    ({"alpha": 0}, "report.alpha: must be in (0, 0.5], got 0"),
    ({"alpha": 0.6}, "report.alpha: must be in (0, 0.5], got 0.6"),
    ({"alpha": "often"}, "report.alpha: must be a number"),
    ({"mode": "best"}, "report.mode: 'best' is not one of min, max"),
    ({"tune": "lrr"}, "report.tune: unknown key; use an alias"),
    ({"tune": "n_layers"}, "report.tune: 'n_layers' is not an axis of this sweep; axes: router, lr, seed"),
    ({"tune": "seed"}, "report.tune: the seeds are the samples of each comparison"),
    ({"tune": "router"}, "report.tune: 'router' is the compared axis (report.axis)"),
    ({"paper": "Table 1"}, "report.paper: must be a short reference name of a paper table: lowercase letters, "
                           "digits and '-' (such as table-1), got 'Table 1'"),
    ({"paper": 1}, "report.paper: must be a short reference name"),
    ({"alpah": 0.1}, "report.alpah: unknown key; allowed: alpha, axis, baseline, final_evals, margin, metric, mode, "
                     "paper, tune"),
])
def test_bad_report_settings_are_one_line(report, expect):
    msg = _error({"router": ["none", "full"], "lr": [1e-3, 3e-3], "seed": [0, 1]}, report=report)
    assert msg.startswith(expect), msg


def test_report_settings_reach_the_parent_run_params():
    grid = {"router": ["none", "full"], "lr": [1e-3, 3e-3], "seed": [0, 1]}
    spec = _spec(grid, report={"alpha": 0.01, "tune": "lr", "paper": "table-14", "mode": "max"})
    p = sweep_record(spec).to_params()
    assert (p["sweep.report.alpha"], p["sweep.report.mode"], p["sweep.report.tune"], p["sweep.report.paper"]) == \
        ("0.01", "max", "lr", "table-14")
    assert p["sweep.report.explicit"] == "alpha,mode,tune,paper"
    # defaults: alpha 0.05, the mode from the metric's name; tune and paper absent
    p = sweep_record(_spec(grid)).to_params()
    assert (p["sweep.report.alpha"], p["sweep.report.mode"], p["sweep.report.explicit"]) == ("0.05", "min", "")
    assert "sweep.report.tune" not in p and "sweep.report.paper" not in p
    acc = _spec(grid, report={"metric": "val/accuracy"})
    assert acc.report.mode == "max" and sweep_record(acc).to_params()["sweep.report.explicit"] == "metric"
    # a search sweep reports its searched metric in the search's direction unless told otherwise
    s = _spec({}, search={"metric": "val/loss", "mode": "max", "space": {"lr": {"uniform": [1e-3, 1e-2]}}},
              report={"metric": "val/loss"})
    assert s.report.mode == "max"


def test_report_tune_needs_a_grid():
    msg = _error({}, search={"space": {"lr": {"uniform": [1e-3, 1e-2]}}}, report={"tune": "lr"})
    assert msg.startswith("report.tune: only a grid sweep has an axis to tune over"), msg


def test_shipped_sweeps_state_no_new_report_keys_they_do_not_mean():
    root = Path(__file__).resolve().parents[3]
    for p in sorted((root / "sweeps").glob("[!_]*.yaml")):
        spec = load_spec(p)
        assert spec.report.alpha == 0.05 and spec.report.mode in ("min", "max"), p.stem
