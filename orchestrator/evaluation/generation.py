"""Batched greedy decoding with the model's KV cache, stopping at stop strings or EOS.

The model has no padding mask, so prompts of different lengths share one cache without padding:
the batch is prefilled up to its shortest prompt, then every step feeds, per row, either the
row's next prompt token (while its prompt lasts) or its own greedy prediction. Every row keeps
positions 0.. of its own tokens, so its output is exactly what decoding it alone would give
(``tests/orchestrator/evaluation/test_adapter.py`` checks this against one-row decoding).

A row stops at EOS, when its decoded text contains a stop string, after ``max_new`` tokens, or
when the model's context is full. What comes back is the generated text cut before the first
stop string (the harness's convention: the stop sequence is not part of the answer).
"""
from __future__ import annotations

import torch

from lime_arch.model import KVCache


def cut_at_stop(text: str, stops: list[str]) -> str:
    """``text`` up to (without) the earliest occurrence of any stop string."""
    end = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:end]


@torch.no_grad()
def greedy_until(model, prompts: list[list[int]], *, max_new: int, stops: list[str], eos_id: int, decode,
                 device, autocast) -> list[str]:
    """Greedy continuations of ``prompts`` (token ids, each already fitting the context with room
    for its generation) as text, each cut at its first stop string."""
    B = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=device)
    lo, hi = int(lens.min()), int(lens.max())
    total = min(hi + max_new, model.cfg.max_seq_len)
    buf = torch.full((B, total), eos_id, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):
        buf[r, :len(p)] = torch.tensor(p, dtype=torch.long)
    cache = KVCache(model.cfg, B, total, device, next(model.parameters()).dtype)
    with autocast():
        logits = model(buf[:, :lo], cache)[:, -1]  # (B, V) prediction for position lo
    gen: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    pos = lo
    while pos < total:
        pred = logits.float().argmax(-1)  # (B,)
        fed = torch.where(pos >= lens, pred, buf[:, pos])  # a row past its prompt feeds its prediction
        buf[:, pos] = fed
        for r in range(B):
            if done[r] or pos < int(lens[r]):
                continue
            tok = int(fed[r])
            if tok == eos_id:
                done[r] = True
                continue
            gen[r].append(tok)
            if len(gen[r]) >= max_new or any(s and s in decode(gen[r]) for s in stops):
                done[r] = True
        pos += 1
        if all(done) or pos >= total:
            break
        with autocast():
            logits = model(fed[:, None], cache)[:, -1]
    return [cut_at_stop(decode(g), stops) for g in gen]
