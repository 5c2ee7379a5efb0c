"""ProsQA-style graph search: a random DAG of invented concepts stated as "Every X is a Y." facts, a
person who "is a X", and a two-option question of which exactly one option is reachable from X.

Format (character-level; the prompt ends with the separator ``|``)::

    prompt  Every lumo is a tasepi. Every kora is a lumo. ... Dabi is a kora. Is Dabi a tasepi or vunek?|
    target  Dabi is a kora. Every kora is a lumo. Every lumo is a tasepi. # Dabi is a tasepi.
    answer  tasepi

The target is the chain of steps (the person's fact, then the facts of a shortest path from the
person's concept to the reachable option, found by breadth-first search) followed by ``#`` and the
answer sentence; the answer is the reachable option's name, extracted from the sentence after the
last ``#``.

Generation: concept names are 2-3 consonant-vowel syllables ("lumo", "tasepi"; always lower case,
so never "every", "is", "a" or "or"), the person's name two syllables, capitalized; all names of
one example are distinct. The DAG: a random order of ``n_concepts`` concepts and ``n_facts``
distinct edges among the pairs that go forward in that order (so no cycle), drawn without
replacement with weight 1/gap^2 (gap = distance in the order): with uniform pairs almost every
shortest path has 2 edges, while local edges make long chains, and so deep questions, common (as in
ProsQA's layered graphs). The question: a depth d uniform in ``[min_depth, max_depth]``, a start
concept X with some concept at shortest distance exactly d, a reachable option A at that distance,
and an unreachable option B other than X that is the conclusion of some fact (so "appears in a
conclusion" does not give the answer away); X, A and B are each uniform among the valid choices
and the two options are written in random order. A graph without a valid question of depth d is
redrawn (keeping the depths uniform). Facts are listed in random order, the person's fact and
the question last.
"""
from __future__ import annotations

import heapq
import random
import re
import string
from collections import deque
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.tasks.base import CharVocab, Example, Task, check_int, register_task

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_ANSWER_RE = re.compile(r"[A-Z][a-z]+ is a ([a-z]+)\.")
# Graphs drawn for one example before the parameters are declared unable to pose a question.
_MAX_GRAPH_TRIES = 1000


def _name(rng: random.Random, n_syllables: int) -> str:
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n_syllables))


def shortest_paths(adj: dict[str, list[str]], start: str) -> dict[str, str | None]:
    """Breadth-first search from ``start``: every reachable concept -> its predecessor on one
    shortest path (None for ``start``); neighbours are visited in their listed order."""
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if v not in parent:
                parent[v] = u
                queue.append(v)
    return parent


def path_to(parent: dict[str, str | None], goal: str) -> list[str]:
    path = [goal]
    while (prev := parent[path[-1]]) is not None:
        path.append(prev)
    return path[::-1]


@register_task("prosqa")
class ProsQATask(Task):
    vocab = CharVocab(string.ascii_letters + " .?#|", sep="|")
    defaults = {"n_concepts": 12, "n_facts": 16, "min_depth": 2, "max_depth": 4}

    def _configure(self, params: dict[str, Any]) -> dict[str, Any]:
        self.min_depth = check_int(self.name, "min_depth", params["min_depth"], 1)
        self.max_depth = check_int(self.name, "max_depth", params["max_depth"], self.min_depth)
        # The start, a path of max_depth edges and the unreachable option need max_depth + 2.
        self.n_concepts = check_int(self.name, "n_concepts", params["n_concepts"], self.min_depth + 2, 200)
        n_pairs = self.n_concepts * (self.n_concepts - 1) // 2
        # min_depth facts are needed for the path and one more for the unreachable option's
        # conclusion; with every forward pair present the question is rarely possible.
        self.n_facts = check_int(self.name, "n_facts", params["n_facts"], self.min_depth + 1, n_pairs - 1)
        return {"n_concepts": self.n_concepts, "n_facts": self.n_facts,
                "min_depth": self.min_depth, "max_depth": self.max_depth}

    def _names(self, rng: random.Random) -> tuple[list[str], str]:
        concepts: list[str] = []
        seen: set[str] = set()
        while len(concepts) < self.n_concepts:
            name = _name(rng, rng.choice((2, 3)))
            if name not in seen:
                seen.add(name)
                concepts.append(name)
        while (person := _name(rng, 2)) in seen:
            pass
        return concepts, person.capitalize()

    def _edges(self, rng: random.Random, concepts: list[str]) -> list[tuple[str, str]]:
        n = self.n_concepts
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        # Weighted sampling without replacement (Efraimidis-Spirakis): key u**(1/weight), keep the
        # n_facts largest keys; weight = 1/gap**2.
        keys = [rng.random() ** ((j - i) ** 2) for i, j in pairs]
        chosen = heapq.nlargest(self.n_facts, range(len(pairs)), key=keys.__getitem__)
        return [(concepts[pairs[k][0]], concepts[pairs[k][1]]) for k in chosen]

    def _question(self, rng: random.Random, concepts: list[str], edges: list[tuple[str, str]],
                  d: int) -> tuple[str, str, str, list[str]] | None:
        adj: dict[str, list[str]] = {c: [] for c in concepts}
        for u, v in edges:
            adj[u].append(v)
        conclusions = {v for _, v in edges}
        choices = []
        for x in concepts:
            parent = shortest_paths(adj, x)
            depth: dict[str, int] = {}
            for c, p in parent.items():  # insertion order is BFS order: parents come first
                depth[c] = 0 if p is None else depth[p] + 1
            reachable = [a for a in parent if depth[a] == d]
            unreachable = [b for b in concepts if b not in parent and b in conclusions]
            if reachable and unreachable:
                choices.append((x, parent, reachable, unreachable))
        if not choices:
            return None
        x, parent, reachable, unreachable = rng.choice(choices)
        a, b = rng.choice(reachable), rng.choice(unreachable)
        return x, a, b, path_to(parent, a)

    def _sample(self, rng: random.Random, index: int) -> Example | None:
        # The depth is drawn once, before any redraw of the graph, so that depths stay uniform.
        depth = rng.randint(self.min_depth, self.max_depth)
        for _ in range(_MAX_GRAPH_TRIES):
            concepts, person = self._names(rng)
            edges = self._edges(rng, concepts)
            question = self._question(rng, concepts, edges, depth)
            if question is not None:
                break
        else:
            raise ConfigError(f"task 'prosqa': parameters {self.params} admit no question of depth "
                              f"{depth} in {_MAX_GRAPH_TRIES} random graphs; widen [min_depth, max_depth] or "
                              f"change n_facts relative to n_concepts")
        x, a, b, path = question
        options = [a, b] if rng.random() < 0.5 else [b, a]
        facts = [f"Every {u} is a {v}." for u, v in edges]
        rng.shuffle(facts)
        prompt = " ".join([*facts, f"{person} is a {x}.", f"Is {person} a {options[0]} or {options[1]}?"])
        steps = [f"{person} is a {x}."] + [f"Every {u} is a {v}." for u, v in zip(path, path[1:])]
        target = " ".join(steps) + f" # {person} is a {a}."
        return Example(prompt=prompt + self.vocab.sep, target=target, answer=a,
                       meta={"depth": len(path) - 1, "person": person})

    def extract_answer(self, generated_text: str) -> str | None:
        """The concept of the answer sentence "<Person> is a <concept>." after the last '#'."""
        if not isinstance(generated_text, str) or "#" not in generated_text:
            return None
        m = _ANSWER_RE.fullmatch(generated_text.rsplit("#", 1)[1].strip())
        return m.group(1) if m else None
