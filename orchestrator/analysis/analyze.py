"""Representation analysis of one model on a fixed evaluation set (the paper's analysis metrics, arXiv 2502.09245).

Per layer: matrix Renyi entropy of the values actually attended and of the hidden states,
a linear separability probe on near-synonym words (is/are/was/were by default), and from the
router: the normalized source map (Figure 5) and the expected retrieved source layer (Figure 4),
for a token-dependent (dynamic) router of its mixing averaged over the evaluation tokens, with the
spread over tokens as a second map, and the strongest routes with the tokens where they fire
(Table 2; ``orchestrator.analysis.routes``).
Metric keys: ``analysis/<value|hidden>_entropy/layer_<l>`` (and ``_std``),
``analysis/<value|hidden>_probe/layer_<l>``, ``analysis/expected_source/layer_<l>``.
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from orchestrator.analysis.capture import capture
from orchestrator.analysis.metrics import expected_source_layer, layer_entropies, probe_accuracy, router_source_map
from orchestrator.analysis.routes import Route, mixing_maps, strongest_routes

log = logging.getLogger("lime.analysis")
DEFAULT_WORDS = ("is", "are", "was", "were")


@dataclass
class Analysis:
    metrics: dict[str, float]
    value_entropy: tuple[np.ndarray, np.ndarray]
    hidden_entropy: tuple[np.ndarray, np.ndarray]
    value_probe: tuple[np.ndarray, np.ndarray] | None
    hidden_probe: tuple[np.ndarray, np.ndarray] | None
    source_map: np.ndarray
    expected_source: np.ndarray
    notes: list[str] = field(default_factory=list)
    spread_map: np.ndarray | None = None  # token-dependent routers: the source map's std over tokens
    routes: list[Route] = field(default_factory=list)  # the strongest routes (Table 2)


def word_positions(ids: torch.Tensor, tokenizer, words) -> tuple[list[tuple[int, int]], list[str]]:
    """(sequence, token index of the word's last token) and its label for each whole-word match."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)
    pos, labels = [], []
    for b, row in enumerate(ids.tolist()):
        pieces = [tokenizer.decode([t]) for t in row]  # per-token text, so offsets map back to tokens
        ends = np.cumsum([len(p) for p in pieces])
        text = "".join(pieces)
        for m in pattern.finditer(text):
            t = int(np.searchsorted(ends, m.end(), side="left"))  # token holding the last character
            if t < len(row):
                pos.append((b, t))
                labels.append(m.group(1).lower())
    return pos, labels


@torch.no_grad()
def analyze_model(model, data, *, sequences: int = 32, seq_len: int = 128, alpha: float = 0.5,
                  words=DEFAULT_WORDS, seed: int = 0, chunk: int = 8, routes: int = 10) -> Analysis:
    device = next(model.parameters()).device
    seq_len = min(seq_len, model.cfg.max_seq_len)
    x = torch.cat([b[0] for b in data.val_batches(sequences, seq_len, 1)])[:sequences]  # (N, T)
    was_training = model.training
    model.eval()
    hidden, values = [[] for _ in model.blocks], [[] for _ in model.blocks]
    for i in range(0, len(x), chunk):
        with capture(model) as st:
            model(x[i:i + chunk].to(device))
        for l in range(len(model.blocks)):
            hidden[l].append(st["hidden"][l].float().cpu())
            values[l].append(st["values"][l].float().cpu())
    model.train(was_training)
    hidden = [torch.cat(h).numpy() for h in hidden]  # per layer (N, T, C)
    values = [torch.cat(v).numpy() for v in values]  # per layer (N, T, R*Hd)
    ve, he = layer_entropies(values, alpha), layer_entropies(hidden, alpha)
    metrics: dict[str, float] = {}
    for name, (mean, std) in (("value_entropy", ve), ("hidden_entropy", he)):
        for l in range(len(mean)):
            metrics[f"analysis/{name}/layer_{l}"] = float(mean[l])
            metrics[f"analysis/{name}_std/layer_{l}"] = float(std[l])
    notes: list[str] = []
    if len(x) < sequences:  # --sequences beyond the validation set: all of it, said in the outputs
        notes.append(f"{len(x)} evaluation sequences: all the validation set holds at {seq_len} tokens (asked for "
                     f"{sequences})")
    vp = hp = None
    pos, labels = word_positions(x, data.tokenizer, words)
    counts = Counter(labels)
    rare = [w for w in words if counts[w] < 5]
    if rare:
        notes.append(f"probe: word(s) {', '.join(rare)} occur fewer than 5 times in {len(x)} evaluation "
                     f"sequences ({dict(counts)}); left out of the probe")
    keep = [i for i, lab in enumerate(labels) if lab not in rare]
    if len({labels[i] for i in keep}) >= 2:
        y = np.array([labels[i] for i in keep])
        idx = [pos[i] for i in keep]
        res = {}
        for name, reps in (("value_probe", values), ("hidden_probe", hidden)):
            acc = [probe_accuracy(np.stack([reps[l][b, t] for b, t in idx]), y, seed=seed) for l in range(len(reps))]
            res[name] = (np.array([a[0] for a in acc]), np.array([a[1] for a in acc]))
            for l, (m, _s) in enumerate(acc):
                metrics[f"analysis/{name}/layer_{l}"] = float(m)
        vp, hp = res["value_probe"], res["hidden_probe"]
    else:
        notes.append("probe: fewer than 2 words frequent enough; no probe (use more --sequences or other --words)")
    for n in notes:
        log.warning(n)
    batches = [x[i:i + chunk] for i in range(0, len(x), chunk)]
    maps = mixing_maps(model, batches)  # dense(l), or a dynamic router's mean over these tokens
    dense = [None] + maps.dense[1:]
    smap = router_source_map(dense, model.cfg.kv_heads)
    exp = expected_source_layer(dense, model.cfg.kv_heads)
    for l, e in enumerate(exp):
        metrics[f"analysis/expected_source/layer_{l}"] = float(e)
    top = strongest_routes(model, batches, data.tokenizer, top=routes)
    return Analysis(metrics, ve, he, vp, hp, smap, exp, notes, maps.spread, top)
