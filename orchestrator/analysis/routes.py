"""What a trained router routes: its mixing maps, its strongest routes and the tokens where they
fire, and the logit lens of a dynamic router's keys (arXiv 2502.09245: Figures 2-5, Table 2).

**Mixing maps.** A static router's mixing is ``dense(l)``. A token-dependent one (the dynamic
routers: ``RouterKind.token_dependent``) mixes differently at every token, so its map is the
per-token dense matrix (``RouterKind.token_mixing``) averaged over the given tokens (validation
tokens at the end of a trial), and its **spread** is a second (L, L) map: the standard deviation
over tokens of the per-token source map (each token's normalized mean-|w| share per source
layer, the definition of ``metrics.router_source_map``). A static router's spread is zero and is
not computed.

**Routes** (Table 2's "semantic circuits"). A route is (layer l, routed head h, level s): the
share of head h's |weight| on the K/V heads of source layer s (levels s < l only: reading its
own layer is no route). A static route has one strength; a dynamic route's strength is its mean
share over tokens, and the tokens where it fires are those where that share is largest, shown
with a few tokens of context (the token itself in brackets).

**Logit lens of router keys.** A dynamic router scores a token's query (or, with
``model.router_dynamic.scores: hidden``, its normed hidden state) against learned keys. Each key
is mapped to the vocabulary as the authors map router rows: every token embedding, un-scaled by
the final norm's weight, through layer l's attention norm and query projection (grouped per KV
head as the router groups queries; the hidden-state scores skip the projection), scored against
the key; the tokens of highest score are the key's nearest tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from orchestrator.analysis.capture import capture

Tensor = torch.Tensor
CONTEXT = 4  # tokens of context before a firing token


@dataclass
class Maps:
    dense: list[np.ndarray]  # per layer (R, (l+1)R[, Hd]); token-dependent: the mean over tokens
    spread: np.ndarray | None  # (L, L) std over tokens of the per-token source map; None: static
    tokens: int  # tokens averaged (0: a static router's dense)


@dataclass
class Route:
    layer: int
    head: int
    level: int
    weight: float  # the head's share of |weight| on the level (dynamic: its mean over tokens)
    fires: list[tuple[str, float]] = field(default_factory=list)  # (token in context, share) where strongest
    keys: list[tuple[int, float, list[str]]] = field(default_factory=list)  # (source head, mean weight,
    #   the key's nearest tokens) of the level's strongest source heads (dynamic)


def level_shares(d: Tensor, R: int, l: int) -> Tensor:
    """Dense mixing (..., R, (l+1)R[, Hd]) -> (..., R, l+1): each routed head's share of |weight| per
    source level (per-dim: the mean over Hd first)."""
    a = d.abs().double()
    if l and a.shape[-2] == (l + 1) * R:  # per-dim: (..., R, (l+1)R, Hd) (otherwise (..., R, (l+1)R))
        a = a.mean(dim=-1)
    a = a.reshape(*a.shape[:-1], l + 1, R).sum(dim=-1)  # (..., R, l+1)
    return a / a.sum(dim=-1, keepdim=True).clamp_min(1e-300)


def _source_rows(d: Tensor, R: int, l: int) -> Tensor:
    """Per-token dense (B, T, R, (l+1)R) -> the per-token source-map row (B, T, l+1)."""
    m = d.abs().double().reshape(*d.shape[:2], R, l + 1, R).mean(dim=(2, 4))  # (B, T, l+1)
    return m / m.sum(dim=-1, keepdim=True).clamp_min(1e-300)


def _passes(model, batches):
    """(ids, the layers' queries, their raw keys, their normed inputs) per batch, in eval mode
    without gradients."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x in batches:
                x = x.to(device)
                with capture(model) as st:
                    model(x)
                yield x, st["queries"], st["keys"], st["inputs"]
    finally:
        model.train(was)


def mixing_maps(model, batches) -> Maps:
    """The router's maps: ``dense(l)`` of a static router; for a token-dependent one the mean over
    the tokens of ``batches`` (id tensors (B, T)) of its per-token dense matrices, and their spread."""
    router, L, R = model.router, model.cfg.n_layers, model.cfg.kv_heads
    if not router.kind.token_dependent:
        with torch.no_grad():
            return Maps([router.dense(l).detach().float().cpu().numpy() for l in range(L)], None, 0)
    sums: list[Tensor | None] = [None] * L
    row_sum, row_sq = np.zeros((L, L)), np.zeros((L, L))
    n = 0
    for x, queries, raw_keys, inputs in _passes(model, batches):
        for l in range(L):
            d = router.kind.token_mixing(router, l, queries[l], raw_keys, x=inputs[l]).double()  # (B, T, R, (l+1)R)
            sums[l] = d.sum(dim=(0, 1)) if sums[l] is None else sums[l] + d.sum(dim=(0, 1))
            rows = _source_rows(d, R, l).flatten(0, 1).cpu().numpy()  # (B*T, l+1)
            row_sum[l, :l + 1] += rows.sum(0)
            row_sq[l, :l + 1] += (rows ** 2).sum(0)
        n += x.shape[0] * x.shape[1]
    if n == 0:
        raise ValueError("mixing_maps: no tokens given")
    var = np.clip(row_sq / n - (row_sum / n) ** 2, 0.0, None)
    return Maps([(s / n).float().cpu().numpy() for s in sums], np.sqrt(var), n)


def _token_text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids).encode("unicode_escape").decode("ascii").replace("|", "\\|")


def _context(tokenizer, ids: Tensor, b: int, t: int) -> str:
    row = ids[b].tolist()
    return _token_text(tokenizer, row[max(0, t - CONTEXT):t]) + "[" + _token_text(tokenizer, row[t:t + 1]) + "]"


def _top_routes(strength: dict[int, Tensor], top: int) -> list[tuple[int, int, int, float]]:
    """(layer, head, level, strength) of the ``top`` strongest routes below the diagonal."""
    cands = [(l, h, s, float(w[h, s])) for l, w in strength.items() for h in range(w.shape[0]) for s in range(l)]
    return sorted(cands, key=lambda c: (-c[3], c[0], c[1], c[2]))[:top]


def strongest_routes(model, batches, tokenizer, *, top: int = 10, per_route: int = 5, lens: int = 5,
                     key_heads: int = 2) -> list[Route]:
    """The ``top`` strongest routes (layer, head, level < layer); for a token-dependent router with
    the ``per_route`` tokens of ``batches`` where each fires most, and the nearest tokens (``lens``)
    of the keys of the level's ``key_heads`` strongest source heads."""
    router, L, R = model.router, model.cfg.n_layers, model.cfg.kv_heads
    if not router.kind.token_dependent:
        with torch.no_grad():
            strength = {l: level_shares(router.dense(l).detach(), R, l) for l in range(1, L)}
        return [Route(l, h, s, w) for l, h, s, w in _top_routes(strength, top)]
    sums: dict[int, Tensor] = {}
    mean_dense: dict[int, Tensor] = {}
    best: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (values (k, R, l+1), token index (k, R, l+1))
    kept_ids: list[Tensor] = []
    offset, n = 0, 0
    for x, queries, raw_keys, inputs in _passes(model, batches):
        kept_ids.append(x.cpu())
        B, T = x.shape
        for l in range(1, L):
            d = router.kind.token_mixing(router, l, queries[l], raw_keys, x=inputs[l]).double()  # (B, T, R, (l+1)R)
            share = level_shares(d, R, l).flatten(0, 1).cpu()  # (B*T, R, l+1)
            sums[l] = share.sum(0) if l not in sums else sums[l] + share.sum(0)
            mean_dense[l] = d.sum(dim=(0, 1)).cpu() + mean_dense.get(l, 0)
            idx = torch.arange(offset, offset + B * T)[:, None, None].expand_as(share)
            vals, where = share, idx
            if l in best:
                vals, where = torch.cat((best[l][0], vals)), torch.cat((best[l][1], where))
            k = min(per_route, vals.shape[0])
            v, i = vals.topk(k, dim=0)
            best[l] = (v, where.gather(0, i))
        offset, n = offset + B * T, n + B * T
    ids = torch.cat(kept_ids)  # (N, T)
    T = ids.shape[1]
    routes = []
    for l, h, s, w in _top_routes({l: t / n for l, t in sums.items()}, top):
        v, where = best[l]
        fires = [(_context(tokenizer, ids, int(j) // T, int(j) % T), float(val))
                 for val, j in zip(v[:, h, s], where[:, h, s])]
        i = router.sources(l).index(s)
        cols = (mean_dense[l] / n)[h, s * R:(s + 1) * R]  # the mean weight on each source head of the level
        heads = [int(g) for g in cols.argsort(descending=True)[:key_heads]]
        per_head = router.kind.route_keys(router, l).shape[1] > len(router.sources(l))  # else one key per layer
        keys = [(g, float(cols[g]), nearest_tokens(model, tokenizer, l, h, i * R + g if per_head else i, lens))
                for g in heads]
        routes.append(Route(l, h, s, w, fires, keys))
    return routes


@torch.no_grad()
def nearest_tokens(model, tokenizer, l: int, h: int, c: int, k: int = 5) -> list[str]:
    """The logit lens of layer l's key (routed head h, source column c): the k tokens whose
    embedding (un-scaled by the final norm's weight, through layer l's attention norm and query
    projection, grouped per KV head) scores highest against it; a dynamic router scoring the
    hidden state (``model.router_dynamic.scores: hidden``) scores the normed embedding itself.
    [] for a router without keys."""
    keys = model.router.kind.route_keys(model.router, l)
    if keys is None:
        return []
    cfg = model.cfg
    H, R, Hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    blk = model.blocks[l]
    scale = model.norm.weight.detach()
    e = model.embed.weight.detach() / torch.where(scale.abs() < 1e-6, torch.full_like(scale, 1e-6), scale)
    if cfg.router_dynamic is not None and cfg.router_dynamic.scores == "hidden":
        xv = blk.attn_norm(e)  # (V, D)
        score = xv @ keys[h, c].to(xv.dtype)  # (V,): the hidden-state scores are unscaled
    else:
        qv = blk.attn.wq(blk.attn_norm(e)).view(-1, R, H // R, Hd).mean(dim=2)[:, h]  # (V, Hd)
        score = qv @ keys[h, c].to(qv.dtype) / math.sqrt(Hd)  # (V,)
    top = score.topk(min(k, score.shape[0])).indices.tolist()
    return [_token_text(tokenizer, [t]) for t in top]


def routes_markdown(label: str, routes: list[Route]) -> list[str]:
    """Table 2's layout: the strongest routes, the tokens where they fire, their keys' nearest tokens."""
    lines = [f"## {label}: strongest routes", "",
             "Layer l's routed head h reading source layer s < l; `share`: the head's share of |weight| on "
             "that layer (token-dependent routers: the mean over the analysed tokens).", ""]
    if not routes:
        return lines + ["(no routes: a router that reads only the current layer)", ""]
    fires = any(r.fires for r in routes)
    lines += ["| layer | head | level | share |" + (" tokens where it fires (share) | keys: nearest tokens |"
                                                  if fires else ""),
              "|---:|---:|---:|---:|" + ("---|---|" if fires else "")]
    for r in routes:
        row = f"| {r.layer} | {r.head} | {r.level} | {r.weight:.3f} |"
        if fires:
            tok = "; ".join(f"`{t}` ({w:.2f})" for t, w in r.fires)
            keys = "; ".join(f"head {g} ({w:.2f}): " + " ".join(f"`{x}`" for x in toks) for g, w, toks in r.keys)
            row += f" {tok} | {keys} |"
        lines.append(row)
    return lines + [""]
