"""KV-cache decoding: greedy or sampled (temperature, top-k).

The cache stores each layer's routed, post-RoPE K/V, so its size equals the baseline's; each
step routes the new token's raw K/V of all layers (routing is per position)."""
from __future__ import annotations

import torch

from lime_arch.model import KVCache, LIMeDecoder


@torch.no_grad()
def generate(model: LIMeDecoder, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """idx: (B, T) prompt -> (B, T + n) with n <= max_new_tokens (stops early when all hit eos)."""
    B, T = idx.shape
    total = min(T + max_new_tokens, model.cfg.max_seq_len)
    cache = KVCache(model.cfg, B, total, idx.device, next(model.parameters()).dtype)
    logits = model(idx, cache)[:, -1]  # prefill
    out, done = [idx], torch.zeros(B, dtype=torch.bool, device=idx.device)
    for _ in range(total - T):
        nxt = _pick(logits, temperature, top_k, generator)  # (B, 1)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done |= nxt[:, 0] == eos_id
        out.append(nxt)
        if cache.pos >= total or (eos_id is not None and bool(done.all())):
            break
        logits = model(nxt, cache)[:, -1]
    return torch.cat(out, dim=1)


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)
