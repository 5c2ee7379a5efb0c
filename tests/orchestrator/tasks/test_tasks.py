"""Tests of the synthetic tasks (arithmetic, ProsQA, kv-recall): generation, splits, scoring, encoding.

Expectations are computed independently of the task code: arithmetic steps are evaluated with
Python's own parser (``ast``) over ``fractions.Fraction``, ProsQA reachability with a BFS over
facts parsed back from the prompt text, kv-recall answers from the parsed pairs.
"""
from __future__ import annotations

import ast
import random
import re
import string
from collections import Counter, deque
from fractions import Fraction

import pytest

from lime_arch.errors import ConfigError
from orchestrator.tasks import TASKS, CharVocab, Example, make_task, reduce_expression, register_task

PAPER_EXAMPLE = "(7+5)/(6+4*3-2*7) = 12/(6+4*3-2*7) = 12/(6+12-2*7) = 12/(18-2*7) = 12/(18-14) = 12/4 = 3"
SMALL = {  # small but non-trivial settings, to keep the suite fast
    "arithmetic": {"n_ops": [4, 5, 6]},
    "prosqa": {"n_concepts": 8, "n_facts": 10, "min_depth": 1, "max_depth": 3},
    "kv-recall": {"n_pairs": 6},
}


@pytest.fixture(scope="module")
def samples() -> dict[str, dict[str, list[Example]]]:
    out = {}
    for name, params in SMALL.items():
        task = make_task(name, **params)
        n_train = 600 if name == "arithmetic" else 200
        out[name] = {"train": task.generate("train", n_train, 0), "val": task.generate("val", 60, 0),
                     "test": task.generate("test", 60, 0)}
    return out


# --- arithmetic ---------------------------------------------------------------------------------

def _py_eval(expr: str, bound: int) -> Fraction:
    """Evaluate a step with Python's parser ('~' is the unary minus), checking that every
    sub-expression is an integer within [-bound, bound]."""
    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            value = Fraction(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = -ev(node.operand)
        elif isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b}
            value = ops[type(node.op)]()
        else:
            raise AssertionError(f"unexpected syntax in {expr!r}: {ast.dump(node)}")
        assert value.denominator == 1 and abs(value) <= bound, (expr, value)
        return value
    return ev(ast.parse(expr.replace("~", "-"), mode="eval").body)


def _n_binary_ops(expr: str) -> int:
    return sum(expr.count(op) for op in "+-*/")


def test_paper_example_reduces_exactly_as_shown() -> None:
    expr = PAPER_EXAMPLE.split(" = ")[0]
    assert " = ".join(reduce_expression(expr)) == PAPER_EXAMPLE
    ex = make_task("arithmetic").example_from_expression(expr)
    assert ex.prompt + ex.target == PAPER_EXAMPLE.replace(" ", "")
    # n_ops counts operands (numbers): the example has 7 of them, i.e. 6 operations.
    assert (ex.answer, ex.meta["n_ops"]) == ("3", 7)


@pytest.mark.parametrize("expr, steps", [
    ("4-(3-5)", ["4-(3-5)", "4-~2", "6"]),
    ("2-5*3", ["2-5*3", "2-15", "~13"]),
    ("8/(4/2)", ["8/(4/2)", "8/2", "4"]),
    ("8/4/2", ["8/4/2", "2/2", "1"]),
    ("(1-9)/(3-5)*2", ["(1-9)/(3-5)*2", "~8/(3-5)*2", "~8/~2*2", "4*2", "8"]),
])
def test_reduction_order_and_negative_rendering(expr: str, steps: list[str]) -> None:
    assert reduce_expression(expr) == steps


@pytest.mark.parametrize("bad", ["", "1+", "(1+2", "1+2)", "1--2", "3/2", "4/(2-2)", "a+1"])
def test_reduce_expression_rejects_malformed_or_inexact(bad: str) -> None:
    with pytest.raises(ValueError):
        reduce_expression(bad)


def test_every_arithmetic_step_is_checked_independently(samples) -> None:
    task = make_task("arithmetic", **SMALL["arithmetic"])
    examples = [ex for split in samples["arithmetic"].values() for ex in split]
    for ex in examples:
        assert ex.prompt.endswith("=") and ex.prompt.count("=") == 1
        expr = ex.prompt[:-1]
        operands = re.findall(r"[0-9]+", expr)
        assert len(operands) == ex.meta["n_ops"] and "~" not in expr
        assert all(1 <= int(v) <= 9 for v in operands)
        steps = [expr, *ex.target.split("=")]
        assert len(steps) == ex.meta["n_ops"]  # one step per operation
        final = _py_eval(steps[0], task.max_value)
        for prev, step in zip(steps, steps[1:]):
            assert _py_eval(step, task.max_value) == final, (prev, step)
            assert _n_binary_ops(step) == _n_binary_ops(prev) - 1, (prev, step)
        assert re.fullmatch(r"0|~?[1-9][0-9]*", steps[-1])
        assert int(steps[-1].replace("~", "-")) == final
        assert ex.answer == steps[-1]
        assert task.score(ex, ex.target)


def test_arithmetic_operand_counts_balanced_and_groups(samples) -> None:
    task = make_task("arithmetic", **SMALL["arithmetic"])
    train = samples["arithmetic"]["train"]
    assert Counter(ex.meta["n_ops"] for ex in train) == {4: 200, 5: 200, 6: 200}
    assert task.metric_groups(train[0]) == [f"ops{train[0].meta['n_ops']}"]
    assert all(re.fullmatch(r"ops[456]", g) for ex in train for g in task.metric_groups(ex))
    # All four operators and negative intermediates actually occur.
    assert set("+-*/") <= set("".join(ex.prompt for ex in train))
    assert any("~" in ex.target for ex in train)


def test_arithmetic_bound_and_operand_range_are_respected() -> None:
    task = make_task("arithmetic", n_ops=[5], min_operand=2, max_operand=12, max_value=30)
    for ex in task.generate("train", 150, 3):
        for step in [ex.prompt[:-1], *ex.target.split("=")]:
            _py_eval(step, 30)
        assert all(2 <= int(v) <= 12 for v in re.findall(r"[0-9]+", ex.prompt))


# --- prosqa -------------------------------------------------------------------------------------

def _parse_prosqa(prompt: str) -> tuple[dict[str, set[str]], str, str, tuple[str, str]]:
    assert prompt.endswith("?|")
    sentences = re.findall(r"[^.?]+[.?]", prompt[:-1])
    *facts, person_fact, question = [s.strip() for s in sentences]
    graph: dict[str, set[str]] = {}
    for fact in facts:
        m = re.fullmatch(r"Every ([a-z]+) is a ([a-z]+)\.", fact)
        assert m, fact
        graph.setdefault(m.group(1), set()).add(m.group(2))
    m = re.fullmatch(r"([A-Z][a-z]+) is a ([a-z]+)\.", person_fact)
    assert m, person_fact
    person, start = m.groups()
    q = re.fullmatch(rf"Is {person} a ([a-z]+) or ([a-z]+)\?", question)
    assert q, question
    return graph, person, start, (q.group(1), q.group(2))


def _reachable(graph: dict[str, set[str]], start: str) -> dict[str, int]:
    dist, queue = {start: 0}, deque([start])
    while queue:
        u = queue.popleft()
        for v in graph.get(u, ()):
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def test_prosqa_exactly_one_option_reachable_and_path_valid(samples) -> None:
    task = make_task("prosqa", **SMALL["prosqa"])
    first_option_is_answer = Counter()
    for ex in [ex for split in samples["prosqa"].values() for ex in split]:
        graph, person, start, options = _parse_prosqa(ex.prompt)
        dist = _reachable(graph, start)
        assert [o in dist for o in options].count(True) == 1, ex.prompt
        (answer,) = [o for o in options if o in dist]
        assert ex.answer == answer and options[0] != options[1]
        first_option_is_answer[options[0] == answer] += 1
        # The distractor is a conclusion of some fact, like the answer.
        assert all(any(o in targets for targets in graph.values()) for o in options)
        chain, final = ex.target.split(" # ")
        assert final == f"{person} is a {answer}."
        sentences = re.findall(r"[^.]+\.", chain)
        assert sentences[0] == f"{person} is a {start}."
        node = start
        for s in sentences[1:]:
            m = re.fullmatch(r" Every ([a-z]+) is a ([a-z]+)\.", s)
            assert m and m.group(1) == node and m.group(2) in graph[node], (s, ex.prompt)
            node = m.group(2)
        assert node == answer
        assert len(sentences) - 1 == dist[answer] == ex.meta["depth"]  # a shortest path
        assert SMALL["prosqa"]["min_depth"] <= ex.meta["depth"] <= SMALL["prosqa"]["max_depth"]
        assert task.score(ex, ex.target)
    assert first_option_is_answer[True] > 50 and first_option_is_answer[False] > 50


def test_prosqa_facts_count_and_names(samples) -> None:
    for ex in samples["prosqa"]["train"][:50]:
        assert ex.prompt.count("Every ") == SMALL["prosqa"]["n_facts"]
        graph, _, start, _ = _parse_prosqa(ex.prompt)
        concepts = set(graph) | {v for vs in graph.values() for v in vs} | {start}
        assert len(concepts) <= SMALL["prosqa"]["n_concepts"]


# --- kv-recall ----------------------------------------------------------------------------------

def test_kv_recall_answer_is_the_value_of_the_query(samples) -> None:
    task = make_task("kv-recall", **SMALL["kv-recall"])
    for ex in [ex for split in samples["kv-recall"].values() for ex in split]:
        m = re.fullmatch(r"([a-z0-9:,]+)\?([a-z]+)=", ex.prompt)
        assert m, ex.prompt
        pairs = [p.split(":") for p in m.group(1).split(",")]
        assert len(pairs) == 6 and all(re.fullmatch(r"[a-z]{2}", k) and re.fullmatch(r"[0-9]{2}", v) for k, v in pairs)
        table = dict(pairs)
        assert len(table) == len(pairs)  # distinct keys
        assert ex.answer == ex.target == table[m.group(2)]
        assert task.score(ex, ex.target) and task.score(ex, f" {ex.target}\n")


# --- all tasks: splits, determinism, extraction, encoding, vocab ------------------------------

@pytest.mark.parametrize("name", sorted(SMALL))
def test_splits_disjoint_and_deduplicated(samples, name: str) -> None:
    prompts = {split: [ex.prompt for ex in exs] for split, exs in samples[name].items()}
    for split, ps in prompts.items():
        assert len(set(ps)) == len(ps), f"duplicate prompt in {split}"
    assert not set(prompts["train"]) & set(prompts["test"])
    assert not set(prompts["train"]) & set(prompts["val"])
    assert not set(prompts["val"]) & set(prompts["test"])
    # Disjoint across seeds too: a test set of another seed never meets this train set.
    other = make_task(name, **SMALL[name]).generate("test", 60, 1)
    assert not set(prompts["train"]) & {ex.prompt for ex in other}


def test_splits_disjoint_in_a_small_space() -> None:
    # Two-operand expressions: a few hundred prompts exist, so independent draws for train and
    # test would collide; disjointness must come from the partition, for every seed pair.
    task = make_task("arithmetic", n_ops=[2])
    train = {ex.prompt for seed in range(3) for ex in task.generate("train", 100, seed)}
    held = {split: {ex.prompt for seed in range(3) for ex in task.generate(split, 8, seed)}
            for split in ("val", "test")}
    assert len(train) > 120 and len(held["val"]) >= 8 and len(held["test"]) >= 8
    assert not train & held["val"] and not train & held["test"] and not held["val"] & held["test"]


@pytest.mark.parametrize("name", sorted(SMALL))
def test_generation_deterministic_by_seed(samples, name: str) -> None:
    task = make_task(name, **SMALL[name])
    again = task.generate("test", 60, 0)
    assert again == samples[name]["test"]
    assert task.generate("test", 20, 0) == again[:20]  # a shorter request is a prefix
    other = task.generate("test", 60, 1)
    assert len({ex.prompt for ex in other} & {ex.prompt for ex in again}) < 10


MALFORMED = ["", " ", "garbage", "=", "==", "#", "# ", "~", "-3", "3.0", "03", "~0", "12/(18", "12/4=",
             "#Tom is a", "# Tom is a .", "# tom is a wumpus", "# Tom is a Wumpus.", "\ufffd", "1\ufffd",
             "kp:31", "?", "|", "\x00", "é", "# Tom is a wumpus. extra"]


@pytest.mark.parametrize("name", sorted(SMALL))
def test_extractor_survives_malformed_generations(samples, name: str) -> None:
    task = make_task(name, **SMALL[name])
    ex = samples[name]["test"][0]
    for text in MALFORMED:
        assert task.extract_answer(text) is None or task.extract_answer(text) != ex.answer, text
        assert not task.score(ex, text)
    assert task.extract_answer(None) is None  # type: ignore[arg-type]
    # Truncations of the target never raise; only the complete target is sure to score.
    for cut in range(len(ex.target)):
        task.score(ex, ex.target[:cut])
    rng = random.Random(0)
    chars = "".join(t for t in task.vocab.tokens[3:]) + "\ufffd\n"
    for _ in range(300):
        task.score(ex, "".join(rng.choice(chars) for _ in range(rng.randint(0, 40))))
    # A wrong final answer with a well-formed shape scores False.
    wrong = {"arithmetic": ex.target + "1", "prosqa": ex.target.replace(f"{ex.answer}.", "zzz."),
             "kv-recall": "x" + ex.target}[name]
    assert not task.score(ex, wrong)


def test_extractor_specifics() -> None:
    arith, prosqa, kv = make_task("arithmetic"), make_task("prosqa"), make_task("kv-recall")
    assert arith.extract_answer("12/4=3") == "3"
    assert arith.extract_answer("1-5=~4") == "~4"
    assert arith.extract_answer("3=12/4") is None
    assert prosqa.extract_answer("Tom is a lumo. # Tom is a lumo.") == "lumo"
    assert prosqa.extract_answer("Tom is a lumo. # Tom is a lumo") is None
    assert kv.extract_answer("07") == "07" and kv.extract_answer("0a") is None


@pytest.mark.parametrize("name", sorted(SMALL))
def test_encode_mask_covers_exactly_the_target(samples, name: str) -> None:
    task = make_task(name, **SMALL[name])
    vocab = task.vocab
    for ex in samples[name]["val"][:20]:
        ids, mask = task.encode(ex, 4096)
        assert len(ids) == len(mask) == 1 + len(ex.prompt) + len(ex.target) + 1
        assert ids[0] == vocab.bos_id and ids[-1] == vocab.eos_id
        assert ids.count(vocab.eos_id) == 1 and vocab.pad_id not in ids
        assert set(mask) == {0, 1} and sum(mask) == len(ex.target) + 1
        first = mask.index(1)
        assert all(mask[first:]) and not any(mask[:first])
        assert vocab.decode(ids[:first]) == ex.prompt and ids[first - 1] == vocab.sep_id
        assert vocab.decode(i for i, m in zip(ids, mask) if m) == ex.target
        assert task.encode_prompt(ex) == ids[:first]
        with pytest.raises(ConfigError, match="max_len"):
            task.encode(ex, len(ids) - 1)
        assert task.encode(ex, len(ids))[0] == ids


@pytest.mark.parametrize("name", sorted(SMALL))
def test_vocab_fixed_and_roundtrip(samples, name: str) -> None:
    task = make_task(name, **SMALL[name])
    other = make_task(name)  # default parameters: same vocabulary
    assert task.vocab.tokens == other.vocab.tokens and task.vocab.size == len(task.vocab.tokens)
    assert task.vocab.tokens[:3] == ["<pad>", "<bos>", "<eos>"]
    assert len(set(task.vocab.tokens)) == task.vocab.size
    for ex in samples[name]["train"][:50]:
        for text in (ex.prompt, ex.target):
            assert task.vocab.decode(task.vocab.encode(text)) == text
    ids = task.vocab.encode(samples[name]["train"][0].target)
    assert task.vocab.decode([task.vocab.bos_id, *ids, task.vocab.eos_id, *ids]) == samples[name]["train"][0].target
    assert task.vocab.decode([task.vocab.size + 5]) == "\ufffd"
    with pytest.raises(ValueError):
        task.vocab.encode("\u00e9")


def test_char_vocab_basics() -> None:
    vocab = CharVocab("ab=", sep="=")
    assert vocab.size == 6 and (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
    assert vocab.encode("ba=") == [4, 3, 5] and vocab.decode([4, 0, 3, 2, 5]) == "ba"
    with pytest.raises(ValueError):
        CharVocab("aa=", sep="=")
    with pytest.raises(ValueError):
        CharVocab("ab", sep="=")


# --- registry and parameter validation ----------------------------------------------------------

def test_registry_and_make_task() -> None:
    assert set(TASKS) == {"arithmetic", "prosqa", "kv-recall"}
    for name, cls in TASKS.items():
        task = make_task(name)
        assert isinstance(task, cls) and task.name == name
    with pytest.raises(ConfigError) as e:
        make_task("sudoku")
    assert str(e.value) == "unknown task 'sudoku'; allowed: arithmetic, kv-recall, prosqa"
    with pytest.raises(ValueError, match="task name 'prosqa' is registered already"):
        register_task("prosqa")(type("Twin", (TASKS["prosqa"],), {}))
    with pytest.raises(TypeError, match="not a subclass of Task"):
        register_task("plain")(type("Plain", (), {}))
    assert set(TASKS) == {"arithmetic", "prosqa", "kv-recall"} and TASKS["prosqa"].name == "prosqa"


@pytest.mark.parametrize("name, params, needle", [
    ("arithmetic", {"n_operands": 4}, "n_ops"),  # unknown: the allowed list names n_ops
    ("arithmetic", {"n_ops": [1]}, "n_ops"),
    ("arithmetic", {"n_ops": []}, "n_ops"),
    ("arithmetic", {"n_ops": [4, 4]}, "n_ops"),
    ("arithmetic", {"n_ops": ["4"]}, "n_ops"),
    ("arithmetic", {"max_value": 5}, "max_value"),
    ("arithmetic", {"min_operand": -1}, "min_operand"),
    ("arithmetic", {"max_operand": True}, "max_operand"),
    ("prosqa", {"depth": 3}, "max_depth"),
    ("prosqa", {"min_depth": 4, "max_depth": 2}, "max_depth"),
    ("prosqa", {"n_concepts": 3}, "n_concepts"),
    ("prosqa", {"n_facts": 1000}, "n_facts"),
    ("kv-recall", {"n_pairs": 0}, "n_pairs"),
    ("kv-recall", {"key_len": 1, "n_pairs": 27}, "key_len"),
    ("kv-recall", {"value_len": 2.5}, "value_len"),
])
def test_bad_parameters_raise_config_error(name: str, params: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_task(name, **params)


def test_bad_generate_arguments_and_exhausted_space() -> None:
    task = make_task("arithmetic", n_ops=[2], min_operand=1, max_operand=2, max_value=4)
    with pytest.raises(ConfigError, match="split"):
        task.generate("dev", 3, 0)
    with pytest.raises(ConfigError, match="n"):
        task.generate("train", -1, 0)
    # At most 2*2*4 = 16 distinct prompts exist: asking for 40 must fail, not loop forever.
    with pytest.raises(ConfigError, match="distinct"):
        task.generate("train", 40, 0)


def test_vocab_covers_every_generated_character() -> None:
    # Defaults included: every character a task can emit is in its fixed vocabulary.
    for name in TASKS:
        task = make_task(name)
        allowed = set(task.vocab.tokens[3:])
        for ex in task.generate("val", 30, 7):
            assert set(ex.prompt + ex.target) <= allowed
    assert set(make_task("prosqa").vocab.tokens[3:]) == set(string.ascii_letters + " .?#|")
