"""Key-value recall: a list of key:value pairs, then a query key; the answer is the query's value.

Format (character-level; the prompt ends with the separator ``=``)::

    prompt  kp:31,xb:07,mc:55?xb=
    target  07
    answer  07

Keys are ``key_len`` random lower-case letters, distinct within one example so the answer is
unique; values are ``value_len`` random digits (leading zeros kept: the value is a string, matched
exactly). The query is one of the listed keys, drawn uniformly, so every position of the list is
probed equally often; its position is kept in ``meta["position"]``.
"""
from __future__ import annotations

import random
import re
import string
from typing import Any

from lime_arch.errors import ConfigError
from orchestrator.tasks.base import CharVocab, Example, Task, check_int, register_task

_ANSWER_RE = re.compile(r"[0-9]+")


@register_task("kv-recall")
class KVRecallTask(Task):
    vocab = CharVocab(string.ascii_lowercase + string.digits + ":,?=", sep="=")
    defaults = {"n_pairs": 8, "key_len": 2, "value_len": 2}

    def _configure(self, params: dict[str, Any]) -> dict[str, Any]:
        self.n_pairs = check_int(self.name, "n_pairs", params["n_pairs"], 1, 1000)
        self.key_len = check_int(self.name, "key_len", params["key_len"], 1, 16)
        self.value_len = check_int(self.name, "value_len", params["value_len"], 1, 16)
        if 26 ** self.key_len < self.n_pairs:
            raise ConfigError(f"task 'kv-recall': parameter 'key_len'={self.key_len} gives only "
                              f"{26 ** self.key_len} distinct keys for n_pairs={self.n_pairs}; "
                              f"raise key_len or lower n_pairs")
        return {"n_pairs": self.n_pairs, "key_len": self.key_len, "value_len": self.value_len}

    def _sample(self, rng: random.Random, index: int) -> Example | None:
        keys: list[str] = []
        seen: set[str] = set()
        while len(keys) < self.n_pairs:
            key = "".join(rng.choice(string.ascii_lowercase) for _ in range(self.key_len))
            if key not in seen:
                seen.add(key)
                keys.append(key)
        values = ["".join(rng.choice(string.digits) for _ in range(self.value_len)) for _ in keys]
        position = rng.randrange(self.n_pairs)
        pairs = ",".join(f"{k}:{v}" for k, v in zip(keys, values))
        prompt = f"{pairs}?{keys[position]}{self.vocab.sep}"
        return Example(prompt=prompt, target=values[position], answer=values[position],
                       meta={"position": position})

    def extract_answer(self, generated_text: str) -> str | None:
        """The generated digits (surrounding whitespace ignored); anything else is malformed."""
        if not isinstance(generated_text, str):
            return None
        text = generated_text.strip()
        return text if _ANSWER_RE.fullmatch(text) else None
