"""The MLflow UI as the comparison surface of a sweep: where its pages are, and the saved view that
opens on the comparison (docs/ARCHITECTURE.md, "Tracking"; README, "The dashboard").

- Every experiment is created as a *model training* experiment (tag ``mlflow.experimentKind``), so
  MLflow 3's UI opens it on its runs, not on the GenAI overview of traces.
- A sweep's experiment carries one saved view (experiment tag ``mlflow.sharedViewState.<id>``,
  the format of the UI's own "Save view": a JSON envelope with the view's name, its creation time
  and its state). It lists the trials sorted by the compared metric with the compared axes as
  columns, and its charts are bar charts of the metric, the median step time and the peak
  training memory, one bar per trial, coloured by the compared value (run tag ``mlflow.runColor``).
  The view's link is ``#/experiments/<id>/runs?viewStateShareKey=<id>``; it is also under "Views"
  on the runs page.
- Links: the runs view of an experiment, one run, and the compare page of several runs, each with
  ``workflowType=machine_learning`` (the UI's "Model training" mode: a fresh browser starts in
  its GenAI mode, whose menu has traces and prompts instead of runs and models). A server
  store (``http://...``) is its own UI; for a local store (sqlite) the UI is ``mlflow ui`` on
  127.0.0.1:5000 (what ``make mlflow-ui`` starts), and the command that serves that store is given.

Torch-free, no MLflow import: names and JSON only.
"""
from __future__ import annotations

import json
import shlex
import sys
import time
import urllib.parse
from pathlib import Path

KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
EXPERIMENT_TAGS = {KIND_TAG: TRAINING_KIND}
VIEW_ID = "lime-compare"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"
RUN_COLOR_TAG = "mlflow.runColor"
LOCAL_UI = "http://127.0.0.1:5000"
MODE = "workflowType=machine_learning"
# what the view charts beside the compared metric: latency and memory, one number per trial
COST_METRICS = ("final/step_time_ms", "final/train_mem_mb")
# matplotlib's tab10: distinct at a glance, and the colours of the report's plots
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


def ui_base(uri: str) -> str:
    """The web address of the UI that shows the store ``uri``."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return LOCAL_UI


def ui_command(uri: str) -> str | None:
    """The command that serves a local store's UI on 127.0.0.1:5000 (None: the store is a server)."""
    if uri.startswith(("http://", "https://")):
        return None
    exe = Path(sys.executable).parent / "mlflow"
    try:
        exe = exe.relative_to(Path.cwd())
    except ValueError:
        pass
    mlflow = str(exe) if exe.exists() else "mlflow"
    return f"{mlflow} ui --backend-store-uri {shlex.quote(uri)} --host 127.0.0.1 --port 5000"


def runs_url(uri: str, experiment_id: str, view: bool = False) -> str:
    """The experiment's runs table (``view``: opened on the saved comparison view)."""
    url = f"{ui_base(uri)}/#/experiments/{experiment_id}/runs?{MODE}"
    return f"{url}&viewStateShareKey={VIEW_ID}" if view else url


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(uri)}/#/experiments/{experiment_id}/runs/{run_id}?{MODE}"


def compare_url(uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare page of ``run_ids`` (params and metrics side by side, with plots)."""
    q = {"runs": json.dumps(list(run_ids), separators=(",", ":")),
         "experiments": json.dumps([str(experiment_id)], separators=(",", ":"))}
    return f"{ui_base(uri)}/#/compare-runs?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote) + f"&{MODE}"


def ui_lines(uri: str, experiment_id: str, *, view: bool = False, run_id: str | None = None) -> list[str]:
    """What to print so a reader can open the dashboard: the UI command (local store) and the link."""
    lines = []
    cmd = ui_command(uri)
    if cmd:
        lines.append(f"MLflow UI: `{cmd}` (or `make mlflow-ui` with MLFLOW_TRACKING_URI={uri}), then open")
    else:
        lines.append("MLflow UI:")
    lines.append("  " + (run_url(uri, experiment_id, run_id) if run_id else runs_url(uri, experiment_id, view)))
    return lines


def run_color(value, values: list) -> str | None:
    """The colour of a trial whose compared axis has ``value`` among ``values`` (None: not among them)."""
    strs = [str(v) for v in values]
    return PALETTE[strs.index(str(value)) % len(PALETTE)] if str(value) in strs else None


def column(kind: str, key: str) -> str:
    """The UI's column id of a param/metric/tag (``metrics.`final/val_loss```)."""
    return f"{kind}.`{key}`"


def compare_view(*, axes: list[str], metric: str, mode: str, parent_run_id: str | None, title: str,
                 created_ms: int | None = None) -> str:
    """The saved view's tag value: the trials sorted by ``metric`` (best first) with ``axes`` (param
    names) and the metric, step time and memory as columns; bar charts of the same three metrics
    first, the other metric sections after them, folded. The parent run stays in the table (it
    holds the report) but not in the charts."""
    metrics = [metric, *[m for m in COST_METRICS if m != metric]]
    section = "lime-compare"
    charts = [{"uuid": f"lime-bar-{i}", "type": "BAR", "metricKey": m, "metricSectionId": section,
               "deleted": False, "isGenerated": False, "runsCountToCompare": 100} for i, m in enumerate(metrics)]
    sections = [{"uuid": section, "name": f"{title} (one bar per trial)", "display": True, "isReordered": False,
                 "deleted": False, "isGenerated": False}]
    for name in ("final", "val", "train", "perf", "model", "analysis"):  # every trial metric's section, folded
        sections.append({"uuid": f"lime-{name}", "name": name, "display": False, "isReordered": False,
                         "deleted": False, "isGenerated": True})
    state = {
        "orderByKey": column("metrics", metric), "orderByAsc": mode != "max", "searchFilter": "",
        "startTime": "ALL", "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        "selectedColumns": [column("params", a) for a in axes] + [column("metrics", m) for m in metrics],
        "columnWidths": {column("metrics", m): 150 for m in metrics},
        "runsExpanded": {parent_run_id: True} if parent_run_id else {},
        "runsHiddenMode": "SHOW_ALL", "runsVisibilityMap": {parent_run_id: False} if parent_run_id else {},
        "compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": True,
        "hideEmptyCharts": True, "useGroupedValuesInCharts": True, "autoRefreshEnabled": True,
        "viewMaximized": False, "runListHidden": False, "groupBy": None, "groupsExpanded": {},
    }
    created = int(time.time() * 1000) if created_ms is None else created_ms
    return json.dumps({"name": title, "createdAt": created, "state": json.dumps(state, sort_keys=True)})
