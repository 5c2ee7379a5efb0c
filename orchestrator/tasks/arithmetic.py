"""Arithmetic expression task (AET of the paper): integer expressions with + - * / and parentheses,
the target being the step-by-step reduction ending with the exact integer answer.

Format (the paper's example, arXiv 2502.09245 Sec. 5, with the spaces around "=" removed, because for a character-level
model they are two extra tokens per step that carry no information)::

    prompt  (7+5)/(6+4*3-2*7)=
    target  12/(6+4*3-2*7)=12/(6+12-2*7)=12/(18-2*7)=12/(18-14)=12/4=3
    answer  3

Reduction order: each step evaluates ONE operation, the leftmost operation in the parse tree whose
two operands are both numbers (leftmost-innermost), then re-renders the whole remaining
expression; parentheses around a group that became a single number are dropped. This is exactly
the order of the paper's example, which evaluates ``6+12`` before ``2*7``: a plain "all * and / of
a group first, then + and -" order would not reproduce it.

Rendering: minimal parentheses that make the string determine the tree (a left operand is
parenthesized when its operator binds looser than its parent's, a right operand when it binds
looser or equally, so ``a-(b-c)`` and ``a*(b/c)`` keep theirs). Negative intermediate values use a
distinct unary-minus character ``~`` (``4-(3-5)=4-~2=6``, ``2-5*3=2-15=~13``), so ``-`` always means
subtraction, a number is always one atom, and every step has exactly one binary operator fewer
than the previous one. Parsed input keeps its own parentheses (even redundant ones) until the
group is reduced to a number.

Generation: a random binary tree over the requested number of operands (each split point
uniform), leaves uniform in ``[min_operand, max_operand]``; bottom-up, each node's operator is
drawn uniformly among those whose result is an exact integer (no division by zero, no remainder)
within ``[-max_value, max_value]``. Because the reduction evaluates every subtree once, the
intermediate values are exactly the subtree values, so every step is an exact integer within the
bound. Examples cycle through ``n_ops`` so each operand count gets the same number of examples.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.tasks.base import CharVocab, Example, Task, check_int, register_task

NEG = "~"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ANSWER_RE = re.compile(r"0|~?[1-9][0-9]*")
_NUMBER_RE = re.compile(r"~?[0-9]+")


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Node
    right: Node
    paren: bool = False  # written in parentheses in the parsed input


Node = Num | BinOp


def apply_op(op: str, a: int, b: int) -> int:
    """Exact integer arithmetic; ValueError for division by zero or with a remainder."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0 or a % b != 0:
        raise ValueError(f"{a}/{b} is not an exact integer")
    return a // b


def render_number(value: int) -> str:
    return f"{NEG}{-value}" if value < 0 else str(value)


def render(node: Node) -> str:
    """The canonical string of a tree (see the module docstring for the parenthesization)."""
    if isinstance(node, Num):
        return render_number(node.value)
    text = _render_child(node.left, node.op, right=False) + node.op + _render_child(node.right, node.op, right=True)
    return f"({text})" if node.paren else text


def _render_child(child: Node, op: str, right: bool) -> str:
    text = render(child)
    if isinstance(child, BinOp) and not child.paren:
        p, q = _PREC[child.op], _PREC[op]
        if p < q or (right and p == q):
            return f"({text})"
    return text


def parse_expression(text: str) -> Node:
    """Parse ``+ - * /``, parentheses, non-negative integers and ``~``-negated integers (spaces
    ignored), with the usual precedence and left associativity; ValueError if malformed."""
    s = text.replace(" ", "")
    pos = 0

    def peek() -> str:
        return s[pos] if pos < len(s) else ""

    def expr() -> Node:
        nonlocal pos
        node = term()
        while peek() in ("+", "-"):
            op = s[pos]
            pos += 1
            node = BinOp(op, node, term())
        return node

    def term() -> Node:
        nonlocal pos
        node = atom()
        while peek() in ("*", "/"):
            op = s[pos]
            pos += 1
            node = BinOp(op, node, atom())
        return node

    def atom() -> Node:
        nonlocal pos
        if peek() == "(":
            pos += 1
            inner = expr()
            if peek() != ")":
                raise ValueError(f"expected ')' at position {pos} of {text!r}")
            pos += 1
            return BinOp(inner.op, inner.left, inner.right, True) if isinstance(inner, BinOp) else inner
        m = _NUMBER_RE.match(s, pos)
        if m is None:
            raise ValueError(f"expected a number or '(' at position {pos} of {text!r}")
        pos = m.end()
        digits = m.group()
        return Num(-int(digits[1:]) if digits.startswith(NEG) else int(digits))

    node = expr()
    if pos != len(s):
        raise ValueError(f"unexpected {s[pos]!r} at position {pos} of {text!r}")
    return node


def reduce_once(node: BinOp) -> Node:
    """Evaluate the leftmost operation whose operands are both numbers."""
    if isinstance(node.left, Num) and isinstance(node.right, Num):
        return Num(apply_op(node.op, node.left.value, node.right.value))
    # Any operator subtree contains a reducible operation, so the leftmost one is in the left
    # operand whenever that is not a number.
    if isinstance(node.left, BinOp):
        return BinOp(node.op, reduce_once(node.left), node.right, node.paren)
    assert isinstance(node.right, BinOp)
    return BinOp(node.op, node.left, reduce_once(node.right), node.paren)


def reduce_tree(node: Node) -> list[str]:
    """Renderings of the expression and of every reduction step, ending with the number."""
    steps = [render(node)]
    while isinstance(node, BinOp):
        node = reduce_once(node)
        steps.append(render(node))
    return steps


def reduce_expression(expr: str) -> list[str]:
    """``reduce_expression("(7+5)/(6+4*3-2*7)")`` -> ``["(7+5)/(6+4*3-2*7)", "12/(6+4*3-2*7)",
    "12/(6+12-2*7)", "12/(18-2*7)", "12/(18-14)", "12/4", "3"]``; ValueError when malformed or
    when a division is not exact."""
    return reduce_tree(parse_expression(expr))


@register_task("arithmetic")
class ArithmeticTask(Task):
    vocab = CharVocab("0123456789+-*/()=" + NEG, sep="=")
    defaults = {"n_ops": (4, 5, 6), "min_operand": 1, "max_operand": 9, "max_value": 100}

    def _configure(self, params: dict[str, Any]) -> dict[str, Any]:
        n_ops = params["n_ops"]
        if isinstance(n_ops, int) and not isinstance(n_ops, bool):
            n_ops = [n_ops]
        if not isinstance(n_ops, (list, tuple)) or not n_ops:
            raise ConfigError(f"task 'arithmetic': parameter 'n_ops' must be a non-empty list of "
                              f"operand counts (integers in [2, 32]), got {params['n_ops']!r}")
        self.n_ops = tuple(check_int(self.name, "n_ops", k, 2, 32) for k in n_ops)
        if len(set(self.n_ops)) != len(self.n_ops):
            raise ConfigError(f"task 'arithmetic': parameter 'n_ops' lists an operand count twice: {list(n_ops)}")
        self.min_operand = check_int(self.name, "min_operand", params["min_operand"], 0)
        self.max_operand = check_int(self.name, "max_operand", params["max_operand"], max(self.min_operand, 1))
        self.max_value = check_int(self.name, "max_value", params["max_value"], self.max_operand)
        return {"n_ops": list(self.n_ops), "min_operand": self.min_operand,
                "max_operand": self.max_operand, "max_value": self.max_value}

    def _tree(self, rng: random.Random, n: int) -> tuple[Node, int] | None:
        if n == 1:
            v = rng.randint(self.min_operand, self.max_operand)
            return Num(v), v
        k = rng.randint(1, n - 1)
        left, right = self._tree(rng, k), self._tree(rng, n - k)
        if left is None or right is None:
            return None
        (lt, lv), (rt, rv) = left, right
        results = []
        for op in "+-*/":
            try:
                value = apply_op(op, lv, rv)
            except ValueError:
                continue
            if abs(value) <= self.max_value:
                results.append((op, value))
        if not results:
            return None
        op, value = rng.choice(results)
        return BinOp(op, lt, rt), value

    def _sample(self, rng: random.Random, index: int) -> Example | None:
        n = self.n_ops[index % len(self.n_ops)]
        built = self._tree(rng, n)
        if built is None:
            return None
        return self._example(built[0], n)

    def _example(self, tree: Node, n: int) -> Example:
        steps = reduce_tree(tree)
        return Example(prompt=steps[0] + self.vocab.sep, target=self.vocab.sep.join(steps[1:]),
                       answer=steps[-1], meta={"n_ops": n})

    def example_from_expression(self, expr: str) -> Example:
        """The example of a given expression (e.g. the paper's); ValueError if it is malformed,
        not exact, or leaves [-max_value, max_value] at some step."""
        tree = parse_expression(expr)
        if not isinstance(tree, BinOp):
            raise ValueError(f"{expr!r} has no operation to reduce")
        steps = reduce_tree(tree)
        # Every intermediate value appears as a number in some step.
        if any(abs(int(v.replace(NEG, "-"))) > self.max_value for s in steps for v in _NUMBER_RE.findall(s)):
            raise ValueError(f"{expr!r} has a value beyond max_value={self.max_value}")
        return self._example(tree, len(_NUMBER_RE.findall(steps[0])))

    def extract_answer(self, generated_text: str) -> str | None:
        """The canonical integer after the last '=' (or the whole text when it has none)."""
        if not isinstance(generated_text, str):
            return None
        last = generated_text.rsplit(self.vocab.sep, 1)[-1].strip()
        return last if _ANSWER_RE.fullmatch(last) else None

    def metric_groups(self, example: Example) -> list[str]:
        return [f"ops{example.meta['n_ops']}"]
