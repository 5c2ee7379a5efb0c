"""Training throughput of a sweep's models side by side, for ``lime report --throughput`` (issue 35).

A report's wall-clock speedup needs each variant's step time against the baseline's at the sweep's
own shape, measured alone: the trials' ``perf/step_time_ms`` were taken beside other trials
(``orchestrator.report.cosched``). This builds every model of the given shapes in one process
(``step.make_step``: the model the trials resolved, their batch, sequence length and gradient
accumulation, on their device: bf16 autocast on CUDA and fp32 on CPU as the trainer runs, compiled
where they were) and times them as ``lime bench`` does (``timing.paired_times``): in each of
``rounds`` rounds every variant's step runs between two of its baseline's, and its ratio is its time
over their mean, which cancels the machine's drift. It only measures: the statistics, the matching
of the saved file and the report are ``orchestrator.report.wallclock``'s.

``shapes``: hash -> a shape as the report writes it ({"model": resolved model fields, "batch_size",
"seq_len", "grad_accum", "device", "compile", "threads"}); ``pairs``: (baseline hash, variant hash).
The step is the benchmark's (fused AdamW where torch has it, no gradient clipping or schedule): what
both models share, the same for each.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from lime_arch.config import ModelConfig
from lime_arch.errors import ConfigError
from orchestrator.bench.step import clock, make_step
from orchestrator.bench.suite import machine_info
from orchestrator.bench.timing import paired_times
from orchestrator.core.tracking import git_sha

WARMUP = 2  # steps per model before timing: allocator pools, kernels chosen, a compiled forward built


def device_for(setting: str) -> torch.device:
    """The device the trials' ``train.device`` names (``auto``: CUDA where torch sees one, as the trainer)."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigError("report.throughput: the trials ran on cuda (train.device) and torch sees no CUDA device "
                          "here; measure on a machine like theirs")
    if setting not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"report.throughput: train.device {setting!r} of the trials is not auto, cpu or cuda")
    return torch.device("cuda" if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()) else "cpu")


def _one(values: set, what: str):
    if len(values) != 1:
        raise ConfigError(f"report.throughput: the compared trials differ in {what} ({', '.join(map(str, values))}); "
                          "one process measures one setting")
    return next(iter(values))


def model_config(fields: dict) -> ModelConfig:
    try:
        return ModelConfig.from_dict(fields)
    except ConfigError as e:  # a sweep trained by another version of the model library
        raise ConfigError(f"report.throughput: the trials' resolved model does not build with this code ({e})"
                          ) from None


def measure(shapes: dict[str, dict], pairs: list[tuple[str, str]], rounds: int, warmup: int = WARMUP) -> dict:
    """The paired rounds of every (baseline, variant) pair, with the machine they ran on (see the module)."""
    device = device_for(_one({s["device"] for s in shapes.values()}, "train.device"))
    threads = _one({s["threads"] for s in shapes.values()}, "train.threads")
    if threads:
        torch.set_num_threads(int(threads))
    threads = torch.get_num_threads()
    clk, clock_name = clock(device, threads)
    load_before, t0 = list(os.getloadavg()), time.perf_counter()
    labels = list(dict.fromkeys(h for p in pairs for h in p))
    steps = {}
    for h in labels:  # every model first: a compile mode resets Dynamo once per model, before any graph is built
        s = shapes[h]
        steps[h] = make_step(model_config(s["model"]), int(s["batch_size"]), int(s["seq_len"]), device,
                             device.type == "cuda", "default" if s["compile"] else None, int(s["grad_accum"]),
                             len(labels))
    for _ in range(warmup):
        for h in labels:
            steps[h]()
    out = []
    for base in dict.fromkeys(b for b, _ in pairs):
        variants = [v for b, v in pairs if b == base]
        times, _, ratios = paired_times(lambda h: steps[h](), [base, *variants], base, rounds, clk)
        out += [{"baseline": base, "variant": v, "ratios": ratios[v],
                 "step_ms": {"baseline": 1e3 * statistics.median(times[base]),
                             "variant": 1e3 * statistics.median(times[v])}} for v in variants]
    return {"machine": machine_info(device, threads), "commit": git_sha(),
            "load_before": load_before, "load_after": list(os.getloadavg()), "threads": threads, "clock": clock_name,
            "rounds": rounds, "warmup": warmup, "seconds": time.perf_counter() - t0, "pairs": out}
