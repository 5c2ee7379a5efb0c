"""``LimeLM`` against hand computations: every answer is recomputed here from the model's own
forward pass on the whole sequence (float64 models: no float noise to hide a wrong index), the
harness's tokenization rules written out, and generation compared with ``lime_arch.generate``
decoding one prompt alone."""
from __future__ import annotations

import math

import pytest
import torch
from lm_eval.api.instance import Instance

import lime_arch
from lime_arch.generate import generate
from orchestrator.engine.data.corpus import ByteTokenizer
from orchestrator.evaluation.adapter import LimeLM
from orchestrator.evaluation.generation import cut_at_stop
from tests.orchestrator.evaluation.helpers import tiny_model

TOK = ByteTokenizer()
EOS = TOK.eos_id


def ll_request(ctx: str, cont: str) -> Instance:
    return Instance("loglikelihood", {}, (ctx, cont), 0)


def logprobs(model, ids: list[int]) -> torch.Tensor:
    """(len(ids) - 1, V) float64 log-probabilities of each next token given all before it."""
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]]))[0].double()
    return torch.log_softmax(logits, -1)


def hand_loglikelihood(model, ctx_ids: list[int], cont_ids: list[int], max_len: int) -> tuple[float, bool]:
    """The harness's rule: the model reads the last ``max_len`` tokens of context + continuation
    (minus the last); sum the log-probabilities of the continuation's tokens."""
    whole = (ctx_ids + cont_ids)[-(max_len + 1):]
    lp = logprobs(model, whole)
    n = len(cont_ids)
    rows = lp[len(whole) - 1 - n:]
    total = sum(float(rows[i, t]) for i, t in enumerate(cont_ids))
    greedy = all(int(rows[i].argmax()) == t for i, t in enumerate(cont_ids))
    return total, greedy


@pytest.mark.parametrize("router", lime_arch.router_specs((2,)))
def test_loglikelihood_is_the_sum_of_the_continuations_token_logprobs(router):
    model = tiny_model(router, dtype=torch.float64)
    lm = LimeLM(model, TOK, batch_size=3)
    reqs = [("Hello", " world"), ("def f(x):", " return x"), ("", "abc"), ("a", "b")]
    got = lm.loglikelihood([ll_request(c, x) for c, x in reqs])
    for (ctx, cont), (ll, greedy) in zip(reqs, got):
        ctx_ids = list(ctx.encode()) if ctx else [EOS]  # an empty context is the EOS token
        want, want_greedy = hand_loglikelihood(model, ctx_ids, list(cont.encode()), 64)
        assert ll == pytest.approx(want, abs=1e-9), (router, ctx, cont)
        assert greedy == want_greedy


def test_a_trailing_space_of_the_context_belongs_to_the_continuation():
    model = tiny_model(dtype=torch.float64)
    lm = LimeLM(model, TOK)
    (ll, _), = lm.loglikelihood([ll_request("Hello ", "world")])
    want, _ = hand_loglikelihood(model, list(b"Hello"), list(b" world"), 64)
    assert ll == pytest.approx(want, abs=1e-9)


def test_long_requests_are_truncated_from_the_left_to_the_context():
    model = tiny_model(dtype=torch.float64)
    lm = LimeLM(model, TOK, max_length=40)
    ctx, cont = "x" * 30 + "The quick brown fox jumps over the lazy", " dog"
    (ll, _), = lm.loglikelihood([ll_request(ctx, cont)])
    whole = list((ctx + cont).encode())
    assert len(whole) > 41
    want, _ = hand_loglikelihood(model, list(ctx.encode()), list(cont.encode()), 40)
    assert ll == pytest.approx(want, abs=1e-9)
    assert lm.stats["truncated"] == 1
    # the hand rule reads exactly the last 40 input tokens: a different far prefix changes nothing
    (ll2, _), = lm.loglikelihood([ll_request("y" * 30 + ctx[30:], cont)])
    assert ll2 == pytest.approx(ll, abs=1e-9)


def test_greedy_flag_is_true_exactly_for_the_models_own_greedy_continuation():
    model = tiny_model(dtype=torch.float64)
    ctx = list(b"Once upon a time")
    out = generate(model, torch.tensor([ctx]), 4)[0, len(ctx):].tolist()
    greedy_text = bytes(t for t in out if t < 256).decode("latin-1")
    lm = LimeLM(model, TOK)
    if any(t >= 128 for t in out):  # a non-UTF-8 byte cannot be written as text: pick a context that works
        pytest.skip("the tiny model's greedy bytes are not ASCII")
    (_, g1), (_, g2) = lm.loglikelihood([ll_request("Once upon a time", greedy_text),
                                         ll_request("Once upon a time", greedy_text[:-1] + chr((out[-1] + 1) % 128))])
    assert g1 and not g2


def test_batching_and_order_do_not_change_an_answer():
    model = tiny_model()
    reqs = [ll_request("a" * n, " bc" * (1 + n % 3)) for n in range(1, 12)]
    one = LimeLM(model, TOK, batch_size=1).loglikelihood(reqs)
    many = LimeLM(model, TOK, batch_size=5).loglikelihood(list(reversed(reqs)))[::-1]
    for (a, ga), (b, gb) in zip(one, many):
        assert a == pytest.approx(b, abs=1e-5) and ga == gb


def test_a_pair_asked_twice_is_scored_once():
    lm = LimeLM(tiny_model(), TOK)
    first = lm.loglikelihood([ll_request("ab", "c"), ll_request("ab", "c"), ll_request("ab", "d")])
    assert first[0] == first[1] and lm.stats["loglikelihood"] == 2
    again = lm.loglikelihood([ll_request("ab", "c")])
    assert again == [first[0]] and lm.stats["loglikelihood"] == 2


@pytest.mark.parametrize("n_bytes", [20, 150])
def test_rolling_loglikelihood_predicts_every_token_once_in_disjoint_windows(n_bytes):
    """The harness's windows written out: the first predicts tokens 0..L-1 from EOS + tokens; each
    next one predicts the next L tokens, its input the L tokens before its last prediction."""
    model = tiny_model(dtype=torch.float64)
    L = 64
    text = ("lorem ipsum dolor sit amet " * 10)[:n_bytes]
    t = list(text.encode())
    seq = [EOS] + t  # seq[i + 1] is token i
    want, start = 0.0, 0
    while start < len(t):
        end = min(start + L, len(t))
        inp = seq[max(0, end - L):end]
        lp = logprobs(model, inp + [seq[end]])
        for i in range(start, end):  # token i is predicted from the input up to seq[i]
            want += float(lp[i - max(0, end - L), seq[i + 1]])
        start = end
    lm = LimeLM(model, TOK)
    got, = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert got == pytest.approx(want, abs=1e-8)
    assert lm.stats["rolling_windows"] == math.ceil(len(t) / L)


@pytest.mark.parametrize("router,depth_mix", [("none", "none"), ("full", "hyper-connections"),
                                              ("per-dim", "value-residual")])
def test_batched_greedy_generation_equals_decoding_each_prompt_alone(router, depth_mix):
    model = tiny_model(router, depth_mix)
    prompts = ["abc", "Hello there, general", "x", "def main():\n    "]
    kwargs = {"until": ["e", "\n\n"], "max_gen_toks": 7}
    lm = LimeLM(model, TOK, batch_size=3)
    got = lm.generate_until([Instance("generate_until", {}, (p, dict(kwargs)), 0) for p in prompts])
    for p, text in zip(prompts, got):
        ids = list(p.encode())
        out = generate(model, torch.tensor([ids]), 7, eos_id=EOS)[0, len(ids):].tolist()
        out = out[:out.index(EOS)] if EOS in out else out
        assert text == cut_at_stop(TOK.decode(out), ["e", "\n\n"]), (router, depth_mix, p)


def test_generation_stops_at_eos_and_leaves_room_in_the_context():
    model = tiny_model()
    lm = LimeLM(model, TOK, max_length=32)
    long_prompt = "z" * 50  # longer than the context: left-truncated to leave room for the answer
    got, = lm.generate_until([Instance("generate_until", {}, (long_prompt, {"until": [], "max_gen_toks": 8}), 0)])
    ids = list(long_prompt.encode())[-(32 - 8):]
    out = generate(model, torch.tensor([ids]), 8, eos_id=EOS)[0, len(ids):].tolist()
    out = out[:out.index(EOS)] if EOS in out else out
    assert got == TOK.decode(out)


def test_cut_at_stop_takes_the_earliest_stop_string():
    assert cut_at_stop("abc.def\nghi", ["\n", "."]) == "abc"
    assert cut_at_stop("abc", ["x"]) == "abc"
    assert cut_at_stop("", ["."]) == ""
