"""A malformed sweep file or trial config is refused before torch, Ray or MLflow load: one line on
stderr, exit code 2 (``lime sweep run``, ``lime plan``, ``lime report FILE``, ``lime train``), and
every well-formed file, the shipped sweeps included, validates without them. Each check runs in a
fresh interpreter, so what is in ``sys.modules`` afterwards is what validating imported. (How
fast: ``make refusal-bench``, a measurement, not a test.)"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scipy.stats import binom

from tools.refusal_bench import TRIAL, cases, median_interval

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "ray", "mlflow", "scipy", "pandas", "statsmodels", "datasets", "tokenizers")


def _fresh(code: str, cwd: Path) -> dict:
    """Run ``code`` (which leaves its findings in ``out``) in a new interpreter; ``out`` plus the
    heavy modules that ended up imported."""
    prog = f"import json, sys\nout = {{}}\n{code}\nout['heavy'] = sorted(m for m in {HEAVY!r} if m in sys.modules)\n" \
           "print(json.dumps(out))"
    done = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_every_malformed_input_is_one_error_line_before_anything_heavy(tmp_path):
    todo = cases(tmp_path)
    assert len(todo) >= 30
    argvs = json.dumps({c.name: list(c.argv) for c in todo})
    out = _fresh(f"""
import contextlib, io
from orchestrator.cli import main
for name, argv in json.loads({argvs!r}).items():
    err, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
        rc = main(argv)
    out[name] = [rc, stdout.getvalue(), err.getvalue()]
""", tmp_path)
    assert out.pop("heavy") == []
    for c in todo:
        rc, stdout, stderr = out[c.name]
        assert (rc, stdout) == (2, ""), (c.name, rc, stdout, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("error: "), (c.name, stderr)
        assert c.expect in stderr, (c.name, c.expect, stderr)


def test_every_shipped_sweep_and_a_good_trial_config_validate_torch_free(tmp_path):
    (tmp_path / "trial.yaml").write_text(yaml.safe_dump(TRIAL))
    (tmp_path / "task.yaml").write_text(yaml.safe_dump({**TRIAL, "data": {"source": "prosqa"}}))
    out = _fresh(f"""
import argparse
from orchestrator.cli.train import trial_from_args
from orchestrator.engine.sources import check_source
from orchestrator.sweep.files import is_base, sweep_files
from orchestrator.sweep.spec import load_spec
out['sweeps'] = {{f.stem: load_spec(f).n_trials() for f in sweep_files({str(ROOT / 'sweeps')!r}) if not is_base(f)}}
for name in ('trial.yaml', 'task.yaml'):
    args = argparse.Namespace(config=name, preset=None, router='first-2', data=None, steps=None, seed=None,
                              set=['model.depth_mix=hyper-connections'])
    cfg = trial_from_args(args)
    check_source(cfg.data)
    out[name] = cfg.model['router'] + ' ' + cfg.model['depth_mix'] + ' ' + cfg.data.source
""", tmp_path)
    assert out["heavy"] == []
    shipped = {p.stem for p in (ROOT / "sweeps").glob("*.yaml") if not p.name.startswith("_")}
    assert set(out["sweeps"]) == shipped and all(n >= 1 for n in out["sweeps"].values())
    assert (out["trial.yaml"], out["task.yaml"]) == ("first-2 hyper-connections builtin",
                                                     "first-2 hyper-connections prosqa")


def test_a_dry_run_of_a_valid_file_loads_the_heavy_parts_after_validation(tmp_path, mlflow_uri):
    argv = ["sweep", "run", str(ROOT / "sweeps" / "default.yaml"), "--dry-run"]
    out = _fresh(f"""
import contextlib, io
from orchestrator.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    out['rc'] = main({argv!r})
out['text'] = buf.getvalue()
""", tmp_path)
    assert out["rc"] == 0 and out["text"].rstrip().endswith("dry run: nothing was started")
    assert "24 trials" in out["text"] and "torch" in out["heavy"]  # the estimate counts FLOPs with the model


@pytest.mark.parametrize("n", [3, 6, 9, 20, 51, 255])
def test_the_benchmark_interval_is_the_binomial_order_statistics_one(n):
    # the largest k with P(B <= k - 1) <= 2.5%, B ~ Binomial(n, 1/2): order statistics k and n + 1 - k
    k = max((k for k in range(1, n // 2 + 1) if binom.cdf(k - 1, n, 0.5) <= 0.025), default=0)
    xs = [float(i) for i in range(n)]
    random.Random(n).shuffle(xs)
    med, lo, hi, coverage = median_interval(xs)
    assert med == (n - 1) / 2
    if k:
        assert (lo, hi) == (k - 1, n - k) and coverage == pytest.approx(1 - 2 * binom.cdf(k - 1, n, 0.5))
    else:  # too few runs for 95%: the whole range, with the coverage it has
        assert (lo, hi) == (0, n - 1) and coverage == pytest.approx(1 - 2 * 0.5 ** n)
