"""GPU readiness (orchestrator.engine.gpu_check): the real CUDA checks as `gpu` tests (skipped
without CUDA), and, everywhere, that `make gpu-check` fails with one line on a machine without it."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from orchestrator.engine import gpu_check

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_gpu_check_without_cuda_is_one_line_and_exit_2():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = subprocess.run([sys.executable, "-m", "orchestrator.engine.gpu_check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout.count("\n") == 1 and r.stdout.startswith("gpu-check: FAIL no CUDA"), r
    assert "Traceback" not in r.stderr


def test_one_router_of_each_kind_is_checked():
    from lime_arch import ROUTER_KINDS, parse_router

    routers = gpu_check.one_router_per_kind()
    assert sorted(parse_router(r)[0].kind.name for r in routers) == sorted(ROUTER_KINDS)


@pytest.mark.gpu
@cuda
def test_device_runs_bf16():
    assert "bf16 yes" in gpu_check.check_device()


@pytest.mark.gpu
@cuda
def test_bf16_autocast_forward_is_bf16_and_close_to_fp32():
    assert "logits bfloat16" in gpu_check.check_autocast()


@pytest.mark.gpu
@cuda
@pytest.mark.skipif(not gpu_check.flash_installed(), reason="flash-attn is not installed")
def test_flash_attn_kernel_agrees_with_sdpa():
    assert "agrees with SDPA" in gpu_check.check_flash()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("router", gpu_check.one_router_per_kind())
def test_twenty_cuda_training_steps(router, compiled):
    assert "peak" in gpu_check.check_training(router, compiled)
