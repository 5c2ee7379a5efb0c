"""What a sweep will need that this machine may not give it, said by the dry run (one line each)
before anything starts: GPUs or CPUs a local Ray does not have (the run itself refuses those),
and downloads from the Hugging Face hub (a dataset named on the hub rather than a local
``save_to_disk`` folder, a tokenizer that is not a local file)."""
from __future__ import annotations

import os
from collections.abc import Iterable

from lime_arch.errors import ConfigError
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.sweep.schema import SweepSpec

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
HF_DEFAULT_TOKENIZER = "gpt2"  # what data.tokenizer: byte means with data.source: hf (engine/data/corpus.py)


def warnings(spec: SweepSpec, configs: Iterable[TrialConfig], address: str | None = None) -> list[str]:
    """The dry run's warnings for ``spec`` whose trials have ``configs``; ``address``: the Ray
    cluster the run would connect to (None: a local Ray on this machine)."""
    out = [] if address else resources(spec)
    return out + downloads(configs)


def check_local(spec: SweepSpec) -> None:
    """A local Ray cannot give a trial more than this machine has: one ConfigError line instead of
    waiting forever (``lime sweep run`` without a cluster calls it before Ray loads: torch only for
    a GPU count)."""
    r = spec.resources
    each = f" x {r.workers} workers" if r.workers > 1 else ""
    if r.gpu > 0:
        import torch

        ngpu = torch.cuda.device_count()
        if r.gpu * r.workers > ngpu:
            raise ConfigError(f"resources.gpu: {r.gpu:g} per trial{each}, but this machine has {ngpu} GPUs "
                              "(local Ray); use the sweep's -cpu version or connect to a GPU cluster "
                              "(--address or RAY_ADDRESS)")
    ncpu = os.cpu_count() or 1
    if r.cpu * r.workers > ncpu:
        raise ConfigError(f"resources.cpu: {r.cpu:g} per trial{each}, but this machine has {ncpu} CPUs "
                          "(local Ray); lower it or connect to a cluster (--address or RAY_ADDRESS)")


def resources(spec: SweepSpec) -> list[str]:
    """Per-trial resources a local Ray on this machine cannot give (a run here refuses them)."""
    r, out = spec.resources, []
    if r.gpu > 0:
        import torch

        n = torch.cuda.device_count()
        if r.gpu > n:
            out.append(f"resources.gpu: {r.gpu:g} per trial, but this machine has {n} GPUs and no Ray cluster is "
                       "given (--address or RAY_ADDRESS): a run here refuses; use the sweep's -cpu version or a GPU "
                       "cluster")
    ncpu = os.cpu_count() or 1
    if r.cpu > ncpu:
        out.append(f"resources.cpu: {r.cpu:g} per trial, but this machine has {ncpu} CPUs and no Ray cluster is "
                   "given (--address or RAY_ADDRESS): a run here refuses")
    return out


def _offline() -> str | None:
    return next((k for k in OFFLINE_ENV if os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")),
                None)


def downloads(configs: Iterable[TrialConfig]) -> list[str]:
    """What the trials would fetch from the Hugging Face hub, once per dataset and tokenizer."""
    out: list[str] = []
    offline = _offline()
    for cfg in configs:
        d = cfg.data
        if d.source != "hf":
            continue
        lines = []
        if not os.path.isdir(os.path.expanduser(d.hf_name)):
            what = f"the dataset {d.hf_name}" + (f" ({d.hf_config})" if d.hf_config else "")
            if offline:
                lines.append(f"data.hf_name: needs {what} in the Hugging Face cache ({offline} is set: nothing is "
                             "downloaded)")
            elif d.hf_streaming:
                lines.append(f"data.hf_name: will stream {what} from the Hugging Face hub in every trial (needs "
                             "network; a local save_to_disk folder as data.hf_name avoids it)")
            else:
                lines.append(f"data.hf_name: will download {what} from the Hugging Face hub (once, into the "
                             "Hugging Face cache; a local save_to_disk folder as data.hf_name avoids it)")
        tok = HF_DEFAULT_TOKENIZER if d.tokenizer == "byte" else d.tokenizer
        if d.tokenizer != "bpe" and not os.path.isfile(os.path.expanduser(tok)):
            named = f"the tokenizer {tok!r}" + (" (data.tokenizer: byte means GPT-2's with hf)"
                                                if d.tokenizer == "byte" else "")
            lines.append(f"data.tokenizer: needs {named} in the Hugging Face cache ({offline} is set)" if offline else
                         f"data.tokenizer: will download {named} from the Hugging Face hub (a local tokenizer.json "
                         "path avoids it)")
        out += [x for x in lines if x not in out]
    return out
