"""``LimeLM``: the LM Evaluation Harness's model interface over this project's models.

The harness asks three kinds of requests (``lm_eval.api.model.LM``), all answered here with the
trial's own tokenizer and in batches of ``batch_size`` sequences:

- ``loglikelihood(context, continuation)``: the summed log-probability of the continuation's
  tokens given the context, and whether greedy decoding would produce exactly them. The harness
  (``TemplateLM``) tokenizes the pair (context + continuation as one string, the context's
  trailing spaces moved to the continuation; an empty context is the EOS token); here the pair is
  scored in one forward pass. A pair longer than the context is truncated from the left: the
  model reads the last ``max_length`` tokens of context + continuation minus its last token, as
  the harness's own Hugging Face backend does.
- ``loglikelihood_rolling(text)``: the log-likelihood of a whole document, in the harness's
  disjoint rolling windows of ``max_length`` tokens (the first one after an EOS token), each
  token predicted once with as much context as fits.
- ``generate_until(context, {until, max_gen_toks, ...})``: greedy decoding with the KV cache
  (``orchestrator.evaluation.generation``), stopping at the stop strings or EOS; the context is
  truncated from the left to leave room for the generation (at most half the context is given to
  it). Sampling settings are ignored: decoding is greedy, as the paper's evaluations are.

Requests are sorted longest first, so a batch holds sequences of similar length (right padding
with EOS; the model is causal, so padding after a sequence cannot change its logits) and the
answers come back in request order. The model runs in eval mode, fp32 on CPU and under bf16
autocast on CUDA (the trainer's precision); log-probabilities are taken in fp32 or better.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging

import torch
import torch.nn.functional as F

from orchestrator.evaluation.generation import greedy_until

log = logging.getLogger(__name__)


def LimeLM(model, tokenizer, **kwargs):  # noqa: N802 - it stands for the class
    """A trained ``LIMeDecoder`` and its tokenizer as a harness model (an ``lm_eval`` ``TemplateLM``)."""
    return lime_lm_class()(model, tokenizer, **kwargs)


@functools.cache
def lime_lm_class() -> type:
    """``LimeRequests`` on the harness's ``TemplateLM`` (its tokenization of request pairs, its
    cache hooks). Built on first use: importing this module does not import the harness, so the
    sweep driver that dispatches evaluations stays light."""
    from lm_eval.api.model import TemplateLM

    return type("LimeLM", (LimeRequests, TemplateLM), {"__doc__": LimeRequests.__doc__})


class LimeRequests:
    """The harness's requests answered by a ``LIMeDecoder`` (the methods of ``LimeLM``)."""

    def __init__(self, model, tokenizer, *, batch_size: int = 16, max_length: int | None = None,
                 max_gen_toks: int = 256):
        super().__init__()
        self.model = model.eval()
        self.tokenizer_ = tokenizer
        self._device = next(model.parameters()).device
        self.batch_size = int(batch_size)
        limit = model.cfg.max_seq_len
        self._max_length = min(int(max_length or limit), limit)
        self.max_gen_toks = int(max_gen_toks)
        cuda = self._device.type == "cuda"
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
        self.stats = {"loglikelihood": 0, "rolling_windows": 0, "generated": 0, "truncated": 0}
        self._memo: dict[tuple, tuple[float, bool]] = {}  # (context ids, continuation ids) -> answer

    # -- the tokenizer --------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer_.eos_id)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer_, "name", "lime"))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return list(self.tokenizer_.encode(string))

    def tok_decode(self, tokens) -> str:
        return self.tokenizer_.decode(list(tokens))

    # -- log-likelihoods ------------------------------------------------------------------------
    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``requests``: ``(request strings or None, context ids, continuation ids)``. A pair
        scored before by this object (a gold-loss variant asks its task's pairs again) is not
        run again."""
        first: dict[tuple, int] = {}  # each distinct pair once
        for i, r in enumerate(requests):
            if self._key(r) not in self._memo:
                first.setdefault(self._key(r), i)
        todo = list(first.values())
        order = sorted(todo, key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        for s in range(0, len(order), self.batch_size):
            batch = order[s:s + self.batch_size]
            rows = [self._window(requests[i][1], requests[i][2]) for i in batch]
            width = max(len(inp) for inp, _ in rows)
            x = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long, device=self._device)
            for r, (inp, _) in enumerate(rows):
                x[r, :len(inp)] = torch.tensor(inp, dtype=torch.long)
            with self.autocast():
                logits = self.model(x)  # (B, T, V)
            logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
            for r, (i, (inp, cont)) in enumerate(zip(batch, rows)):  # noqa: B007 - i names the request
                n = len(cont)
                lp = logp[r, len(inp) - n:len(inp)]  # (n, V): the predictions of the continuation
                tgt = torch.tensor(cont, dtype=torch.long, device=self._device)
                answer = (float(lp.gather(-1, tgt[:, None]).sum()), bool((lp.argmax(-1) == tgt).all()))
                self._memo[self._key(requests[i])] = answer
        out = [self._memo[self._key(r)] for r in requests]
        for r, answer in zip(requests, out):
            if r[0] is not None:
                self.cache_hook.add_partial("loglikelihood", r[0], answer)
        self.stats["loglikelihood"] += len(todo)
        return out

    @staticmethod
    def _key(request) -> tuple:
        return tuple(request[1]), tuple(request[2])

    def _window(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """The model's input for a pair (left-truncated to ``max_length``) and the continuation."""
        if not continuation:
            raise ValueError("loglikelihood: an empty continuation has no tokens to score")
        if len(continuation) > self.max_length:
            raise ValueError(f"loglikelihood: a continuation of {len(continuation)} tokens is longer than the "
                             f"context of {self.max_length} tokens")
        whole = (context + continuation)[-(self.max_length + 1):]
        if len(context) + len(continuation) > self.max_length + 1:
            self.stats["truncated"] += 1
        return whole[:-1], continuation

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval import utils as lm_utils

        windows, owner = [], []
        for k, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, list(ctx), list(cont)))
                owner.append(k)
        scores = self._loglikelihood_tokens(windows) if windows else []
        totals = [0.0] * len(requests)
        for k, (ll, _) in zip(owner, scores):
            totals[k] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        self.stats["rolling_windows"] += len(windows)
        return totals

    # -- generation -----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(requests)
        for key, idx in groups.items():
            kwargs = json.loads(key)
            stops, max_new = self._stops(kwargs), int(kwargs.get("max_gen_toks") or self.max_gen_toks)
            budget = self.max_length - min(max_new, self.max_length // 2)  # tokens of context kept
            prompts = [(self.tok_encode(requests[i].args[0]) or [self.eot_token_id])[-budget:] for i in idx]
            order = sorted(range(len(idx)), key=lambda j: -len(prompts[j]))
            for s in range(0, len(order), self.batch_size):
                part = order[s:s + self.batch_size]
                texts = greedy_until(self.model, [prompts[j] for j in part], max_new=max_new, stops=stops,
                                     eos_id=self.eot_token_id, decode=self.tok_decode, device=self._device,
                                     autocast=self.autocast)
                for j, text in zip(part, texts):
                    out[idx[j]] = text
                    self.cache_hook.add_partial("generate_until", requests[idx[j]].args, text)
            self.stats["generated"] += len(idx)
        return out

    @staticmethod
    def _stops(kwargs: dict) -> list[str]:
        until = kwargs.get("until") or []
        stops = [until] if isinstance(until, str) else list(until)
        if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0) > 0:
            log.warning("generate_until: sampling settings %s ignored; decoding is greedy", kwargs)
        return [s for s in stops if isinstance(s, str) and s]
