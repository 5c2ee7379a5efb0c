"""torch.compile of every router: the custom-op routing path (``lime_arch.routing.ops``).

Three levels, cheapest first:
- the op path run eagerly equals the autograd-function path bit for bit (every router, several
  layer-block sizes, MHA/GQA/one KV head, grad and no-grad), and its fake kernels give exactly the
  shapes, strides and offsets of the real outputs (Inductor generates code from the fake ones);
- the mixer alone, compiled with forced layer blocks (the blocked path: old-slot products and
  members' weights), equals eager;
- compiled training (Dynamo + AOTAutograd, ``aot_eager``: no C++ build) equals eager training
  for every registered router, ``none``, the concatenation and any registered depth mix, then
  compiled evaluation, and cached generation after compiled training;
- the same with Inductor (C++ kernels built with the installed gcc), generation through the
  compiled model included (``-m slow``: a cold Inductor cache costs ~25 s of gcc per model).

Tolerance: models run in float64. Inductor fuses and reorders reductions (RMSNorm, softmax,
cross-entropy), which moves results by rounding only: measured <= 1e-15 relative on the losses
and <= 2e-13 of the largest gradient entry after three AdamW steps. The checks allow 1e-11 and
1e-9: four orders of magnitude above rounding, while a routing mistake (a missing or doubled
source, a wrong block term, a misordered backward) changes them at O(1). The evaluation after the
steps compares the compiled graph with the eager forward of its own weights (1e-11), and the
twins' logits with each other at 1e-9: AdamW normalises each entry's update, so an entry whose
gradient is tiny and mostly cancellation carries its relative rounding into the weight at lr
scale. Measured with MUDDFormer under Inductor: its W1 (whose gradient passes through the
zero-initialised W2) drifted 4e-10 in three steps, the logits 7e-11, while the compiled forward on
equal weights agreed to 7e-15.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from dynamic_reference import PAPER, V1, options
from torch._subclasses.fake_tensor import FakeTensorMode

import lime_arch
from lime_arch import build_model, preset
from lime_arch.generate import generate
from lime_arch.routers import build_router, parse_router, router_specs
from lime_arch.routing import ops
from lime_arch.routing.kinds.buffered import BufferedKind
from lime_arch.routing.mixers import SMALL_N, make_mixer

L, HD, B, T = 9, 4, 2, 3


def _depth_mix_cases() -> list[str]:
    """Depth mixes (a second registry beside the routers) when this library has one: each composed
    with ``full`` routing as ``full+<mix>``; none until that registry exists."""
    specs = getattr(lime_arch, "depth_mix_specs", None)
    # Dynamo traces the peers' stream mixing layer by layer: 20-70 s per case for DenseFormer and
    # HC on 2 cores, 17-23 s for mHC (its Sinkhorn rounds), 12-13 s for AttnRes (a read per source),
    # so those run with the slow tests (make test-all); the others (MUDDFormer: 8 s, its separate
    # K/V inputs through the decoder) stay in make test
    heavy = ("denseformer", "hyper-connections", "mhc", "attn-res")
    return [pytest.param(f"full+{m}", marks=pytest.mark.slow) if m.startswith(heavy) else f"full+{m}"
            for m in specs()] if callable(specs) else []


# the dynamic router's forms (``model.router_dynamic``, ``dynamic_reference.py``) as ``spec:form``
FORMS = {"v1": V1, "paper": PAPER, "query-layers": ("query", "layers", True),
         "hidden-heads": ("hidden", "layers-heads", True)}
FORM_CASES = ["dynamic:v1", "dynamic:paper", "dynamic-last-2:query-layers", "dynamic-first-2:hidden-heads",
              "dynamic:v1/concat"]
MODEL_CASES = [*router_specs(), "full/concat", *FORM_CASES, *_depth_mix_cases()]
# Compiled training in `make test`: 5-15 s a case on 2 cores, 25 cases. A representative set stays there,
# chosen so that each compiled code path is traced once: the op path of a static router (full, its
# linear kind) and of a per-dim one (its own weight shape through the ops), the concatenation (no ops),
# a token-dependent router over a sparse source set (dynamic-first-4: the dynamic kind with first's
# sources) and the depth mix with its own K/V inputs through the decoder (MUDDFormer, every way). The
# rest are marked slow (`make test-slow`, `make test-all`): every router's eager path is checked in
# make test against the references (test_reference.py, test_kinds.py, test_op_path_... above) and
# every depth mix's (test_peer_reference.py), so what only the slow cases add is Dynamo tracing one
# more router of an already traced kind, form or mix family.
FAST_COMPILED = {"full", "per-dim", "full/concat", "dynamic-first-4", "full+mudd"}
BUFFERED = [s for s in router_specs((2,)) if isinstance(parse_router(s)[0].kind, BufferedKind)]  # buffer mixer
LEARNED = [s for s in router_specs((2, 4)) if isinstance(parse_router(s)[0].kind, BufferedKind)]


@pytest.fixture(autouse=True)
def _f64_and_fresh_dynamo():
    torch.set_default_dtype(torch.float64)
    torch._dynamo.reset()
    lime_arch.model._announced.clear()  # compile before any eager call, as a fresh process does
    yield
    torch.set_default_dtype(torch.float32)
    left = dict(ops.PASSES.states)
    ops.PASSES.states.clear()
    assert not left, "a routing pass was left open"


# -- the op path, eagerly --------------------------------------------------------------------------
def _raw(R, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, T, R, HD, generator=g, requires_grad=True),
             torch.randn(B, T, R, HD, generator=g, requires_grad=True)) for _ in range(L)]


def _route_all(router, raw, block, use_ops, grad_weights=None):
    mixer = make_mixer(router, "buffer", block=block, use_ops=use_ops)
    outs = [o for l, (k, v) in enumerate(raw) for o in mixer.route(l, k, v)]
    if grad_weights is None:
        return outs, []
    loss = sum((o * w).sum() for o, w in zip(outs, grad_weights))
    params = list(router.parameters()) + [t for kv in raw for t in kv]
    return [o.detach() for o in outs], torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("spec", LEARNED)
@pytest.mark.parametrize("R", [4, 1])
def test_op_path_is_the_eager_path_bit_for_bit(spec, R):
    router = build_router(spec, n_layers=L, n_kv_heads=R, head_dim=HD, init="paper")
    raw = _raw(R)
    g = torch.Generator().manual_seed(1)
    gw = [torch.randn(B, R, T, HD, generator=g) for _ in range(2 * L)]
    for block in (None, 1, 2, 3, L):
        ref_out, ref_grads = _route_all(router, raw, block, False, gw)
        out, grads = _route_all(router, raw, block, True, gw)
        assert all(torch.equal(a, b) for a, b in zip(out, ref_out)), f"{spec} block={block}"
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(grads, ref_grads))
        with torch.no_grad():  # enough tokens that eager, too, runs the blocked buffer (not the few-token path)
            rep = SMALL_N // router.kind.few_token_columns(B, T, HD) + 1
            big = [(k.detach().repeat(1, rep, 1, 1), v.detach().repeat(1, rep, 1, 1)) for k, v in raw]
            ref, got = _route_all(router, big, block, False)[0], _route_all(router, big, block, True)[0]
            assert all(torch.equal(a, b) for a, b in zip(got, ref)), f"no-grad {spec} block={block}"


def _fake_twin(op, mode):
    """``op`` that also runs its fake kernel on fake copies of the inputs and checks the outputs'
    metadata against the real ones."""
    def meta(x):
        if isinstance(x, torch.Tensor):
            return (tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device)
        return [meta(y) for y in x] if isinstance(x, (list, tuple)) else x

    def fake(x):
        if isinstance(x, torch.Tensor):
            return mode.from_tensor(x)
        return [fake(y) for y in x] if isinstance(x, list) else x

    def run(*args):
        real = op(*args)
        with mode:
            got = op(*[fake(a) for a in args])
        assert meta(got) == meta(real), f"{op}: fake {meta(got)} != real {meta(real)}"
        run.calls += 1
        return real
    run.calls = 0
    return run


@pytest.mark.parametrize("spec", ["full", "first-2", "last-2", "dilated-3", "no-head-mix", "per-dim"])
def test_fake_kernels_give_the_real_strides(spec, monkeypatch):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    twins = {name: _fake_twin(getattr(ops, name), mode)
             for name in ("route_layer", "route_layer_backward", "route_begin_backward")}
    for name, twin in twins.items():
        monkeypatch.setattr(ops, name, twin)
    router = build_router(spec, n_layers=L, n_kv_heads=2, head_dim=HD, init="paper")
    raw = _raw(2)
    gw = [torch.randn(B, 2, T, HD) for _ in range(2 * L)]
    for block in (None, 2):
        _route_all(router, raw, block, True, gw)
    assert twins["route_layer"].calls == 2 * (L - 1) and twins["route_layer_backward"].calls == 2 * (L - 1)
    assert twins["route_begin_backward"].calls == 2


def test_a_pass_without_backward_is_dropped_after_max_passes():
    """Grad-mode passes whose backward never runs stay open until MAX_PASSES newer ones push them
    out; the backward of a dropped pass is one clear error."""
    router = build_router("full", n_layers=3, n_kv_heads=2, head_dim=HD, init="paper")
    raw = _raw(2)[:3]
    first = _route_all(router, raw, None, True)[0]
    for _ in range(ops.MAX_PASSES):
        _route_all(router, raw, None, True)
    assert len(ops.PASSES.states) == ops.MAX_PASSES
    with pytest.raises(RuntimeError, match="routing pass .* is gone"):
        sum(o.sum() for o in first).backward()
    ops.PASSES.states.clear()


# -- compiled ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", BUFFERED)
def test_compiled_blocked_mixer_equals_eager(spec):
    """The mixer alone, compiled (aot_eager, fullgraph) with layer blocks of 2 and 3, so the blocks'
    old-slot products and the members' weights go through the ops (at the models' depths below the
    chooser takes one block)."""
    router = build_router(spec, n_layers=7, n_kv_heads=2, head_dim=HD, init="paper")
    raw = _raw(2)[:7]
    gw = [torch.randn(B, 2, T, HD) for _ in range(14)]
    for block in (2, 3):
        def fn(*kv, block=block):
            mixer = make_mixer(router, "buffer", block=block)
            return [o for l in range(7) for o in mixer.route(l, kv[2 * l], kv[2 * l + 1])]
        flat = [t for kv in raw for t in kv]
        params = list(router.parameters()) + flat
        ref = _route_all(router, raw, block, False, gw)
        torch._dynamo.reset()
        outs = torch.compile(fn, backend="aot_eager", fullgraph=True)(*flat)
        grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, gw)), params, allow_unused=True)
        for a, b in zip([o.detach() for o in outs] + list(grads), ref[0] + list(ref[1])):
            assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-12, atol=1e-13), f"{spec} block={block}"


def _model(case: str, layers: int = 4):
    spec, _, impl = case.partition("/")
    router, _, mix = spec.partition("+")
    router, _, form = router.partition(":")
    extra = {"depth_mix": mix} if mix else {}
    if form:
        extra["router_dynamic"] = options(FORMS[form])
    cfg = preset("tiny", n_layers=layers, d_model=32, n_heads=4, n_kv_heads=2, router=router, vocab_size=48,
                 max_seq_len=24, routing_impl=impl or "buffer", **extra)
    torch.manual_seed(0)
    return build_model(cfg).double()


def _train_both(case: str, backend: str, steps: int = 2, layers: int = 4):
    """Eager and compiled (fullgraph: no graph break) twins, ``steps`` AdamW steps on the same
    batches; checks losses and gradients at every step, then the no-grad (evaluation) graph.
    Returns (eager model, compiled twin, its compiled callable)."""
    eager = _model(case, layers)
    twin = copy.deepcopy(eager)
    fwd = torch.compile(twin, backend=backend, fullgraph=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, twin)]
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randint(0, 48, (2, 13), generator=g)
        losses = []
        for f in (eager, fwd):
            loss = F.cross_entropy(f(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-11), f"{case} step {step}"
        for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
            err = (p.grad - q.grad).abs().max().item()
            assert err <= 1e-9 * p.grad.abs().max().item() + 1e-300, f"{case} step {step} {name}: {err:.2e}"
        for opt in opts:
            opt.step()
            opt.zero_grad()
    x = torch.randint(0, 48, (3, 10), generator=g)
    with torch.no_grad():
        # the compiled graph against the eager forward of the same (twin's) weights: after the steps
        # the twins' weights differ by AdamW-amplified rounding (module docstring)
        torch.testing.assert_close(fwd(x), twin(x), rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(twin(x), eager(x), rtol=1e-9, atol=1e-9)
    return eager, twin, fwd


def _generate_all(case: str, eager, twin, fwd) -> None:
    """Cached greedy generation through the compiled model (prefill and one-token graphs), through
    its eager twin after compiled training, and through the eager-trained model: the same tokens."""
    x = torch.randint(0, 48, (3, 5), generator=torch.Generator().manual_seed(2))
    want = generate(eager, x, 6)
    assert torch.equal(generate(twin, x, 6), want), case
    if fwd is not None:
        assert torch.equal(generate(fwd, x, 6), want), case


def _fast_first(cases: list) -> list:
    """``cases`` with every case outside FAST_COMPILED marked slow (the depth mixes' heavy ones are
    already ``pytest.param``s marked slow)."""
    return [c if not isinstance(c, str) or c in FAST_COMPILED else pytest.param(c, marks=pytest.mark.slow)
            for c in cases]


@pytest.mark.parametrize("case", _fast_first(MODEL_CASES))
def test_compiled_training_equals_eager(case):
    """Dynamo + AOTAutograd (the graphs Inductor gets): every router, ``none``, the concatenation."""
    eager, twin, _ = _train_both(case, "aot_eager")
    _generate_all(case, eager, twin, None)


def test_the_fast_compiled_cases_are_registered_cases():
    """A renamed router or mix must not silently drop a case from the fast set."""
    assert FAST_COMPILED.issubset(c for c in MODEL_CASES if isinstance(c, str))


@pytest.mark.slow
def test_compiled_training_and_generation_with_inductor():
    """Inductor itself (C++ kernels built by gcc; ~25 s of gcc with a cold cache, hence slow):
    training, evaluation, cached generation through the compiled model."""
    _generate_all("first-2", *_train_both("first-2", "inductor", layers=3))


@pytest.mark.slow
@pytest.mark.parametrize("case", MODEL_CASES)
def test_compiled_training_with_inductor_every_router(case):
    """Every router with Inductor, six layers, three steps, and generation through the compiled model."""
    _generate_all(case, *_train_both(case, "inductor", steps=3, layers=6))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("spec", ["full", "first-4", "per-dim"])
def test_compiled_bf16_training_on_cuda(spec, mode):
    """bf16 autocast on CUDA, compiled (reduce-overhead: the routing ops are tagged
    cudagraph-unsafe, so Inductor keeps them out of CUDA graphs) vs eager: losses and gradients
    agree to bf16 precision."""
    torch.set_default_dtype(torch.float32)
    eager = _model(spec, 6).float().cuda()
    twin = copy.deepcopy(eager)
    fwd = torch.compile(twin, mode=mode)
    x = torch.randint(0, 48, (4, 17), generator=torch.Generator().manual_seed(1)).cuda()
    for _ in range(3):
        losses = []
        for f in (eager, fwd):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = f(x[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=2e-2)
        for p, q in zip(eager.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=0.1, atol=0.05 * p.grad.abs().max().item())
            p.grad = q.grad = None
