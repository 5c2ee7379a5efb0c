"""Shared machinery of the synthetic tasks: examples, the character vocabulary, the task base class
with its deterministic, disjoint splits, and the task registry.

Choices, and why:

- Vocabularies are character-level and FIXED per task class (they never depend on the examples
  drawn), so a model's embedding table has the same meaning for every seed, split and parameter
  setting of a task. Ids 0, 1, 2 are always <pad>, <bos>, <eos>; the characters follow in the
  order the task lists them.
- Every prompt ends with the task's separator character (``vocab.sep``), so "prompt" is exactly
  the text a model is conditioned on at evaluation time and "target" is what it must generate.
- Splits: one random stream per (task, split, seed) proposes candidate examples, and a candidate
  is kept only if a SHA-256 hash of its prompt falls in that split's share of the hash space
  (train 80%, val 10%, test 10%). A prompt therefore belongs to exactly one split whatever the
  seeds, so no prompt can be shared by "train" and "val"/"test" (even across different seeds);
  duplicates within one split are dropped. Splits that would need too many rejected candidates
  (a parameter setting with too few distinct prompts) fail with a ConfigError instead of looping.
- ``encode`` returns ``[bos] + prompt + target + [eos]`` and a mask aligned with those ids that is
  1 exactly on the target characters and on eos (the tokens the model must predict) and 0 on bos
  and the prompt. With the usual shift (inputs ``ids[:-1]``, labels ``ids[1:]``) the loss mask is
  ``mask[1:]``. No padding is added: batches pad with ``vocab.pad_id``.
"""
from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lime_arch.errors import ConfigError
from lime_arch.specs import Registry

SPLITS: tuple[str, ...] = ("train", "val", "test")
# Upper ends of each split's share of the prompt-hash space [0, 1).
_SPLIT_BOUNDS: dict[str, tuple[float, float]] = {"train": (0.0, 0.8), "val": (0.8, 0.9), "test": (0.9, 1.0)}
# Consecutive rejected candidates (wrong split, duplicate, invalid) before generation gives up;
# a valid setting rejects about 9 in 10 candidates for val/test, so this only trips when the
# parameters admit (almost) no further distinct prompts.
MAX_CONSECUTIVE_REJECTIONS = 50_000
# Stands for ids outside the vocabulary in decode; it is in no vocabulary, so an answer that
# contains it never matches.
UNKNOWN_CHAR = "\ufffd"


@dataclass(frozen=True)
class Example:
    """One task instance: ``prompt`` (ends with the separator), ``target`` (what the model must
    generate, without eos), ``answer`` (what ``extract_answer`` must return from a correct
    generation) and ``meta`` (e.g. ``{"n_ops": 4}``)."""
    prompt: str
    target: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


class CharVocab:
    """A fixed character-level vocabulary: ids 0/1/2 are pad/bos/eos, then one id per character."""

    PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"

    def __init__(self, chars: str, sep: str) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"vocabulary characters must be distinct: {chars!r}")
        if len(sep) != 1 or sep not in chars:
            raise ValueError(f"separator {sep!r} must be one character of the vocabulary")
        self.tokens: list[str] = [self.PAD, self.BOS, self.EOS, *chars]
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.sep = sep
        self._ids = {c: i for i, c in enumerate(self.tokens) if i > 2}
        self.sep_id = self._ids[sep]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Characters up to the first eos; pad/bos are skipped and ids outside the vocabulary (a
        model whose output layer is padded beyond ``size``) become U+FFFD, so they never crash
        decoding but make any answer containing them wrong."""
        out: list[str] = []
        for raw in ids:
            i = int(raw)
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.tokens[i] if 2 < i < len(self.tokens) else UNKNOWN_CHAR)
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharVocab(size={self.size}, sep={self.sep!r})"


def split_of(prompt: str) -> str:
    """The one split a prompt belongs to, from a hash of its text (stable across processes)."""
    u = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2.0**64
    for split, (lo, hi) in _SPLIT_BOUNDS.items():
        if lo <= u < hi:
            return split
    return SPLITS[-1]


def check_int(task: str, key: str, value: Any, lo: int, hi: int | None = None) -> int:
    """An int parameter in [lo, hi]; bools are refused although Python counts them as ints."""
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        raise ConfigError(f"task {task!r}: parameter {key!r} must be {allowed}, got {value!r}")
    return value


class Task(ABC):
    """A synthetic task. Subclasses set ``name`` (via ``register_task``), ``vocab`` and
    ``defaults`` (every accepted parameter with its default), and implement ``_configure``,
    ``_sample`` and ``extract_answer``."""

    name: ClassVar[str] = ""
    vocab: ClassVar[CharVocab]
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ConfigError(f"task {self.name!r}: unknown parameter {unknown[0]!r}; "
                              f"allowed: {', '.join(sorted(self.defaults))}")
        self.params: dict[str, Any] = self._configure({**self.defaults, **params})

    @abstractmethod
    def _configure(self, params: dict[str, Any]) -> dict[str, Any]:
        """Validate the merged parameters (ConfigError naming the bad one), store them on self and
        return them normalized."""

    @abstractmethod
    def _sample(self, rng: random.Random, index: int) -> Example | None:
        """One candidate example from ``rng`` (``index`` = how many were accepted so far, for
        round-robin balancing), or None when this draw is invalid."""

    @abstractmethod
    def extract_answer(self, generated_text: str) -> str | None:
        """The final answer in a generation, or None when it is malformed; never raises."""

    def generate(self, split: str, n: int, seed: int) -> list[Example]:
        """``n`` distinct examples of ``split``, a pure function of (task parameters, split, seed);
        a longer request extends a shorter one with the same arguments."""
        if split not in SPLITS:
            raise ConfigError(f"task {self.name!r}: unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        check_int(self.name, "n", n, 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"task {self.name!r}: seed must be an integer, got {seed!r}")
        # Seeding with a string hashes it with SHA-512: independent of PYTHONHASHSEED.
        rng = random.Random(f"{self.name}/{split}/{seed}")
        out: list[Example] = []
        seen: set[str] = set()
        rejected = 0
        while len(out) < n:
            ex = self._sample(rng, len(out))
            if ex is None or ex.prompt in seen or split_of(ex.prompt) != split:
                rejected += 1
                if rejected > MAX_CONSECUTIVE_REJECTIONS:
                    raise ConfigError(
                        f"task {self.name!r}: found only {len(out)} of {n} distinct {split!r} examples "
                        f"with parameters {self.params}; the setting admits too few distinct prompts, "
                        f"ask for fewer examples or enlarge the task")
                continue
            rejected = 0
            seen.add(ex.prompt)
            out.append(ex)
        return out

    def score(self, example: Example, generated_text: str) -> bool:
        """Exact match of the extracted answer; a malformed generation scores False."""
        answer = self.extract_answer(generated_text)
        return answer is not None and answer == example.answer

    def metric_groups(self, example: Example) -> list[str]:
        """Names of the sub-metrics an example counts towards (``val/accuracy_<group>``)."""
        return []

    def encode_prompt(self, ex: Example) -> list[int]:
        """``[bos] + prompt``: the input of open generation at evaluation time."""
        return [self.vocab.bos_id, *self.vocab.encode(ex.prompt)]

    def encode(self, ex: Example, max_len: int) -> tuple[list[int], list[int]]:
        """``([bos] + prompt + target + [eos], mask)``; mask is 1 on target and eos, 0 elsewhere."""
        prompt_ids = self.encode_prompt(ex)
        target_ids = [*self.vocab.encode(ex.target), self.vocab.eos_id]
        ids = prompt_ids + target_ids
        if len(ids) > max_len:
            raise ConfigError(
                f"task {self.name!r}: an example needs {len(ids)} tokens ({len(prompt_ids)} bos+prompt, "
                f"{len(target_ids)} target+eos) but max_len is {max_len}; raise the model's "
                f"max_seq_len or shrink the task parameters")
        return ids, [0] * len(prompt_ids) + [1] * len(target_ids)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


TASKS: Registry[type[Task]] = Registry("task", sort=True)  # errors list the names alphabetically


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: registers a Task subclass under ``name`` and sets its ``name``."""
    def deco(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"task {name!r}: {cls!r} is not a subclass of Task")
        TASKS.add(name, cls)
        cls.name = name
        return cls
    return deco


def make_task(name: str, **params: Any) -> Task:
    """The registered task ``name`` with ``params``; ConfigError for an unknown name or parameter."""
    return TASKS.lookup(name)(**params)
