"""GPU readiness check (``make gpu-check`` = ``python -m orchestrator.engine.gpu_check``).

One line per check, exit code 1 if any fails (2 when there is no CUDA device at all):

- ``device``: the CUDA device, its capability and whether it runs bf16.
- ``autocast``: a forward under bf16 autocast gives bf16 logits whose loss is within 2% of the
  fp32 forward's (same weights, same batch).
- ``flash-attn``: when flash-attn is installed, ``attn_impl: flash`` runs flash-attn's kernel and
  agrees with SDPA in bf16 (max |diff| of the logits below 5e-2); otherwise a ``skip`` line.
- ``train <router> <eager|compiled>``: for one router of each kind of the registry
  (``lime_arch.RouterKind``), a 20-step training run through the engine's trainer on CUDA (bf16
  autocast, flash-attn when installed), eager and ``torch.compile``d: every loss finite, the
  loss lower at the end than at the start, and the peak memory read from the CUDA allocator.

Sized to finish in a few minutes on one GPU (most of it is compiling).
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from lime_arch import RouterKind, build_model, parse_router, preset, router_specs
from orchestrator.engine.trial import Tracking, run_trial
from orchestrator.engine.trial_config import TrialConfig

STEPS = 20
MODEL = {"n_layers": 8, "d_model": 256, "n_heads": 8, "n_kv_heads": 4, "ffn_dim": 688, "max_seq_len": 256}


def flash_installed() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def one_router_per_kind() -> list[str]:
    """The first registered router spec of every RouterKind."""
    seen: dict[RouterKind, str] = {}
    for spec in router_specs():
        seen.setdefault(parse_router(spec)[0].kind, spec)
    return [seen[k] for k in RouterKind if k in seen]


def check_device() -> str:
    i = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(i)
    if not torch.cuda.is_bf16_supported():
        raise AssertionError(f"{torch.cuda.get_device_name(i)} does not run bf16")
    return f"{torch.cuda.get_device_name(i)}, capability {major}.{minor}, torch {torch.__version__}, bf16 yes"


def check_autocast() -> str:
    torch.manual_seed(0)
    model = build_model(preset("tiny", router="full", **MODEL, vocab_size=512)).cuda()
    idx = torch.randint(0, 512, (4, 128), device="cuda")
    with torch.no_grad():
        ref = F.cross_entropy(model(idx)[:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
        got = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), idx[:, 1:].flatten())
    if logits.dtype != torch.bfloat16:
        raise AssertionError(f"logits under autocast are {logits.dtype}, not bfloat16")
    rel = abs(got.item() - ref.item()) / ref.item()
    if rel > 0.02:
        raise AssertionError(f"bf16 loss {got.item():.4f} vs fp32 {ref.item():.4f} ({rel:.1%} apart)")
    return f"logits bfloat16, loss {got.item():.4f} vs fp32 {ref.item():.4f} ({rel:.2%} apart)"


def check_flash() -> str:
    torch.manual_seed(0)
    sdpa = build_model(preset("tiny", router="full", **MODEL, vocab_size=512)).cuda()
    flash = build_model(preset("tiny", router="full", **MODEL, vocab_size=512, attn_impl="flash")).cuda()
    flash.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 512, (4, 128), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = sdpa(idx).float(), flash(idx).float()
    diff = (a - b).abs().max().item()
    if not math.isfinite(diff) or diff > 5e-2:
        raise AssertionError(f"flash-attn and SDPA logits differ by {diff:.3g}")
    return f"flash-attn agrees with SDPA in bf16 (max |diff| {diff:.2g})"


def check_training(router: str, compiled: bool) -> str:
    torch.cuda.reset_peak_memory_stats()
    cfg = TrialConfig.from_dict({
        "preset": "tiny", "model": {**MODEL, "router": router, "attn_impl": "flash" if flash_installed() else "sdpa"},
        "data": {"source": "builtin"}, "optim": {"lr": 3.0e-3, "warmup_steps": 2},
        "train": {"steps": STEPS, "batch_size": 8, "seq_len": 128, "log_interval": 1, "eval_interval": 100,
                  "eval_batches": 2, "device": "cuda", "compile": compiled}})
    t0 = time.perf_counter()
    res = run_trial(cfg, tracking=Tracking(enabled=False))
    losses = [h["train/loss"] for h in res.history if "train/loss" in h]
    peak = torch.cuda.max_memory_allocated() / 2**20
    if str(res.status) != "finished" or len(losses) != STEPS or not all(math.isfinite(x) for x in losses):
        raise AssertionError(f"{res.status} at step {res.step}, losses {losses[:3]}...{losses[-3:]}")
    if not losses[-1] < losses[0]:
        raise AssertionError(f"loss did not go down: {losses[0]:.4f} -> {losses[-1]:.4f}")
    if not peak > 0:
        raise AssertionError("the CUDA allocator reports no peak memory")
    return (f"{STEPS} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, peak {peak:.0f} MiB (CUDA allocator), "
            f"{time.perf_counter() - t0:.1f} s")


def checks() -> Iterator[tuple[str, Callable[[], str] | None]]:
    """(name, check) in order; a None check is a skip with its reason as the name."""
    yield "device", check_device
    yield "autocast bf16", check_autocast
    if flash_installed():
        yield "flash-attn", check_flash
    else:
        yield "flash-attn: not installed (pip install flash-attn); attn_impl flash falls back to SDPA", None
    for router in one_router_per_kind():
        for compiled in (False, True):
            yield f"train {router} {'compiled' if compiled else 'eager'}", \
                (lambda r=router, c=compiled: check_training(r, c))


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: FAIL no CUDA device (torch.cuda.is_available() is False; torch "
              f"{torch.__version__}{', a CPU build' if torch.version.cuda is None else ''})")
        return 2
    failed = 0
    for name, check in checks():
        if check is None:
            print(f"skip  {name}", flush=True)
            continue
        try:
            print(f"ok    {name}: {check()}", flush=True)
        except Exception as e:  # noqa: BLE001 - every check reports, then the exit code says it
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                  flush=True)
    print(f"gpu-check: {'all checks passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
