"""Depth mixes on CUDA under bf16 autocast (the paper's training setting): a training step runs,
Hyper-Connections' streams stay in the residual stream's dtype (fp32), cached decoding matches
the full forward. Skipped without CUDA."""
import pytest
import torch
import torch.nn.functional as F

from lime_arch import build_model, preset
from lime_arch.depth_mix import depth_mix_specs
from lime_arch.model import KVCache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("spec", depth_mix_specs())
@pytest.mark.parametrize("router", ["none", "full"])
def test_bf16_autocast_step_and_cache(spec, router):
    dev = torch.device("cuda")
    model = build_model(preset("tiny", router=router, n_kv_heads=2, depth_mix=spec, attn_impl="flash")).to(dev)
    idx = torch.randint(0, 256, (2, 33), device=dev)
    streams = []
    hook = model.blocks[1].register_forward_hook(lambda _m, _i, o: streams.append(o.dtype))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(idx[:, :-1])
    hook.remove()
    assert streams == [torch.float32]  # the residual state is not truncated to bf16
    loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(model.cfg, 2, 33, dev, torch.float32)
        steps = [model(idx[:, :8], cache)] + [model(idx[:, t:t + 1], cache) for t in range(8, 33)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)
