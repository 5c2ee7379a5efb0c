"""``make dashboard-check``: the MLflow dashboard of a real sweep, looked at in a real browser.

1. an ``mlflow server`` on a free local port (sqlite store and artifacts in a private temp folder);
2. a small sweep against it (``router: [none, full]`` x ``seed: [0, 1]``, a 2-layer model, 20
   steps: seconds per trial), then ``lime report`` (``report.html`` on the parent run);
3. headless Chromium (``tools/browser.py``) opens what ``lime sweep run`` prints and what a reader
   clicks next, and asserts on the rendered page text:
   - the runs view (the saved comparison view): every trial, its ``router`` value, the
     ``final/val_loss`` column and each trial's value of it;
   - the same view's charts: the bar charts of ``final/val_loss``, step time and memory;
   - MLflow's compare page of the four trials: every trial, ``router`` and ``final/val_loss``;
   - the parent run's ``report/report.html`` in MLflow's artifact viewer: the report, with every
     plot decoded from its data URI;
4. screenshots of each page and ``check.json`` in ``$LIME_RESULTS/dashboard`` (default
   ``results/dashboard``), and the time each phase took.

Every process it starts (the server, the sweep and its local Ray, Chromium) runs in a session of
its own and is ended by its PID (process group), also on failure or Ctrl-C; Ray's processes are
found by the private temp folder in their command line. Exit 0 when every check holds, 1 otherwise
(each failed check printed), 2 when a prerequisite is missing (no Chromium).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.core import dashboard  # noqa: E402
from tools.browser import CHROMIUM, Browser, BrowserError  # noqa: E402
from tools.procs import Proc, free_port, pids_naming, send, wait_http  # noqa: E402

BIN = Path(sys.executable).parent
SWEEP = "dashboard-check"
SWEEP_YAML = f"""# the sweep of `make dashboard-check`: four trials of a few seconds each
name: {SWEEP}
description: "make dashboard-check: none vs full on a 2-layer model, 2 seeds, 20 steps"
base:
  preset: tiny
  model: {{n_layers: 2, d_model: 32, n_heads: 4, ffn_dim: 64, max_seq_len: 64}}
  data: {{source: builtin}}
  optim: {{lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 5}}
  train: {{steps: 20, batch_size: 4, seq_len: 32, log_interval: 5, eval_interval: 10, eval_batches: 2}}
grid:
  router: [none, full]
  seed: [0, 1]
resources: {{cpu: 0.5, gpu: 0}}
max_concurrent: 4
"""
PAGE_TIMEOUT_S = 90.0


class Check:
    """The checks' results: each a name, whether it held, and what was seen when it did not."""

    def __init__(self) -> None:
        self.results: list[dict] = []

    def expect(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append({"check": name, "ok": bool(ok), **({"detail": detail} if not ok else {})})
        print(f"  {'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if not ok and detail else ""), flush=True)
        return ok

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.results)


def close_assistant(b: Browser) -> None:
    """MLflow 3 opens its assistant panel beside every page; the screenshots are of the dashboard."""
    b.eval("""(() => { for (const el of document.querySelectorAll('button[aria-label="Close"]')) {
        let p = el; for (let i = 0; i < 8 && p; i++, p = p.parentElement) {
          if ((p.innerText || '').includes('MLflow Assistant')) { el.click(); return true; } } }
        return false; })()""")
    time.sleep(0.5)


def look(b: Browser, chk: Check, name: str, url: str, must: list[str], shot: Path, scroll_to: str = "") -> str:
    """Open ``url``, wait until every string of ``must`` is on the page, screenshot (and a second one
    scrolled to the element whose text is ``scroll_to``); the page text."""
    b.goto(url)
    try:
        text = b.wait_for(lambda t: all(m in t for m in must), PAGE_TIMEOUT_S)
    except BrowserError:
        text = b.text()
    close_assistant(b)
    time.sleep(1.0)  # charts draw after their data
    b.screenshot(shot)
    if scroll_to:  # the last text node that says exactly ``scroll_to``, at the top of its scroll box
        b.eval(f"""(() => {{ const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
            let hit = null; for (let n = w.nextNode(); n; n = w.nextNode())
              if (n.nodeValue.trim() === {json.dumps(scroll_to)}) hit = n.parentElement;
            if (hit) hit.scrollIntoView({{block: 'start'}}); return !!hit; }})()""")
        time.sleep(0.5)
        b.screenshot(shot.with_name(f"{shot.stem}-{scroll_to.lower()}.png"))
    missing = [m for m in must if m not in text]
    chk.expect(f"{name}: shows {', '.join(must)}", not missing, f"missing {missing}; page: {text[:600]!r}")
    return text


def run(out: Path, work: Path, timings: dict) -> Check:
    chk = Check()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LIME_", "RAY_"))}
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    env.update(MLFLOW_TRACKING_URI=uri, LIME_RESULTS=str(work / "results"), LIME_CACHE=str(work / "cache"),
               RAY_TMPDIR=str(work / "ray"), MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    (work / "ray").mkdir()
    procs: list[Proc] = []
    try:
        t = time.monotonic()
        procs.append(Proc([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{work}/mlflow.db",
                           "--artifacts-destination", str(work / "artifacts"), "--host", "127.0.0.1",
                           "--port", str(port), "--workers", "1"], work / "server.log", env))
        wait_http(f"{uri}/health", 120)
        timings["server_s"] = round(time.monotonic() - t, 1)

        t = time.monotonic()
        sweep_file = work / f"{SWEEP}.yaml"
        sweep_file.write_text(SWEEP_YAML)
        for argv in (["sweep", "run", str(sweep_file)], ["report", SWEEP]):
            sweep = Proc([str(BIN / "lime"), *argv], work / "sweep.log", env)
            procs.append(sweep)
            rc = sweep.p.wait(900)
            chk.expect(f"lime {argv[0]} {argv[1]} exits 0", rc == 0, (work / "sweep.log").read_text()[-2000:])
        timings["sweep_and_report_s"] = round(time.monotonic() - t, 1)
        printed = (work / "sweep.log").read_text()
        shutil.copy2(work / "sweep.log", out / "sweep.log")

        from mlflow.tracking import MlflowClient

        cl = MlflowClient(uri)
        exp = cl.get_experiment_by_name(SWEEP)
        runs = cl.search_runs([exp.experiment_id], max_results=100)
        parent = next(r for r in runs if r.data.tags.get("sweep_role") == "parent")
        trials = sorted((r for r in runs if r.data.tags.get("sweep_role") == "trial"),
                        key=lambda r: r.data.tags["trial_id"])
        plain = [{"router", "seed"} <= set(r.data.params) for r in trials]
        chk.expect("four trial runs with router and seed params", len(trials) == 4 and all(plain),
                   str([r.data.params.get("router") for r in trials]))
        chk.expect("no per-trial path as a param", not any("train.checkpoint_dir" in r.data.params for r in trials))
        # the parent's summaries are tags (best trial, sweep/*); the report's numbers on it (scaling/*,
        # isoflop/*) have names no trial logs, so they never land among the trials' bars or curves
        shared = sorted(set(parent.data.metrics) & {k for r in trials for k in r.data.metrics})
        chk.expect("the parent's summary shares no metric with the trials (nothing in the trials' charts)",
                   not shared and not any(k.startswith(("sweep/", "best/")) for k in parent.data.metrics)
                   and parent.data.tags.get("best_trial_id") in
                   {r.data.tags["trial_id"] for r in trials}, str(shared or parent.data.metrics))
        view = dashboard.runs_url(uri, exp.experiment_id, view=True)
        chk.expect("lime sweep run prints the runs view", view in printed, printed[-800:])

        t = time.monotonic()
        names = [r.data.tags["trial_id"] for r in trials]
        losses = [repr(r.data.metrics["final/val_loss"])[:5] for r in trials]  # the runs table: full digits
        rounded = [f"{r.data.metrics['final/val_loss']:.4g}" for r in trials]  # the compare page: 4 digits
        with Browser(width=1600, height=1000) as b:
            text = look(b, chk, "runs view", view, [*names, "router", "final/val_loss", "none", "full"],
                        out / "runs.png")
            chk.expect("runs view: each trial's final/val_loss", all(v in text for v in losses), str(losses))
            look(b, chk, "charts of the runs view", view + "&compareRunsMode=CHART",
                 [*names, "compare router", "final/val_loss", "final/step_time_ms", "final/train_mem_mb"],
                 out / "charts.png")
            compare = dashboard.compare_url(uri, exp.experiment_id, [r.info.run_id for r in trials])
            text = look(b, chk, "compare page", compare, [*names, "router", "final/val_loss"], out / "compare.png",
                        scroll_to="Metrics")
            chk.expect("compare page: each trial's final/val_loss", all(v in text for v in rounded), str(rounded))
            art = dashboard.run_url(uri, exp.experiment_id, parent.info.run_id).replace(
                "?", "/artifacts/report/report.html?")
            look(b, chk, "report.html in the artifact viewer", art, ["report/report.html"], out / "report.png")
            deadline, frames = time.monotonic() + 30, []
            while time.monotonic() < deadline and not any(frames):
                frames = b.frame_eval("[document.title, document.images.length, Array.from(document.images)"
                                      ".filter(i => i.src.startsWith('data:image/png') && i.naturalWidth > 0).length]")
                time.sleep(0.5)
            report = next((f for f in frames if f and str(f[0]).startswith("Sweep report")), None)
            chk.expect("report.html renders with every plot decoded from its data URI",
                       bool(report) and report[1] >= 2 and report[1] == report[2], str(frames))
        timings["browser_s"] = round(time.monotonic() - t, 1)
        return chk
    finally:
        for p in reversed(procs):
            p.stop(grace=15.0, term_group=True)
        for pid in pids_naming(str(work)):  # Ray's processes, if the sweep was cut short
            send(pid, signal.SIGKILL)


def main() -> int:
    if not Path(CHROMIUM).is_file():
        print(f"dashboard-check: {CHROMIUM} is missing: apt-get install -y chromium (make dashboard-check does)",
              file=sys.stderr)
        return 2
    out = Path(os.environ.get("LIME_RESULTS") or ROOT / "results") / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lime-dash-"))
    t0, timings = time.monotonic(), {}
    chk = Check()
    try:
        chk = run(out, work, timings)
    except Exception as e:  # noqa: BLE001 - reported as a failed check, the processes already ended
        chk.expect("the check ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    timings["total_s"] = round(time.monotonic() - t0, 1)
    (out / "check.json").write_text(json.dumps({"ok": chk.ok, "timings": timings, "checks": chk.results}, indent=2))
    print(f"dashboard-check: {'passed' if chk.ok else 'FAILED'} ({sum(r['ok'] for r in chk.results)} of "
          f"{len(chk.results)} checks) in {timings['total_s']:.0f}s {timings}; screenshots in {out}")
    return 0 if chk.ok else 1


if __name__ == "__main__":
    sys.exit(main())
