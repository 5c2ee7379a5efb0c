"""The validation loss of a model on the fixed validation batches, and its standard error.

The windows are the units: each window's targets are summed, and the loss is the total over the
total count of targets (the loss per target token). The standard error is over windows
(``mean_and_se``): tokens within a window are far from independent, windows of one held-out
document are correlated too, so it is the noise of the window sample given the held-out
documents (``orchestrator.engine.data.heldout`` spreads the windows over all of them).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from orchestrator.engine.data import IGNORE


@torch.no_grad()
def window_losses(model, batches, device, autocast) -> tuple[list[float], list[int]]:
    """Per validation window (row of a batch): the summed loss of its targets and their count
    (eval mode, back to train mode after)."""
    model.eval()
    sums: list[float] = []
    counts: list[int] = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast():
            logits = model(x)
        tok = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="none")
        sums.extend(tok.view(y.shape).sum(1).tolist())
        counts.extend((y != IGNORE).sum(1).tolist())
    model.train()
    return sums, counts


def mean_and_se(sums: list[float], counts: list[int]) -> tuple[float, float]:
    """The loss per target token over the windows and its standard error over windows: the
    ratio estimator's, sqrt(n / (n - 1) * sum (s_i - m c_i)^2) / sum c_i, which for windows of
    equal counts is the sd of the window means / sqrt(n). Windows are the units because the
    tokens of one window are strongly correlated; windows of one document are correlated too, so
    this is the noise of the window sample, a lower bound when a document dominates (NaN with
    one window)."""
    n, total = len(sums), sum(counts)
    if not total:
        return 0.0, float("nan")
    m = sum(sums) / total
    if n < 2:
        return m, float("nan")
    dev = sum((s - m * c) ** 2 for s, c in zip(sums, counts))
    return m, math.sqrt(n / (n - 1) * dev) / total


def evaluate_loss(model, batches, device, autocast) -> float:
    """Mean loss per target token over the batches (eval mode, back to train mode after)."""
    return mean_and_se(*window_losses(model, batches, device, autocast))[0]
