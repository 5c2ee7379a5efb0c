"""The downstream tasks this project generates, as harness YAML tasks with local JSON data.

Table 1 of the paper has two tasks the harness does not have, KV (key-value retrieval) and
Induction; the paper publishes neither its prompts nor its data, so these are this project's
definitions, drawn with fixed seeds from its own generators (the same examples on every machine):

- ``lime_kv`` (multiple choice, ``acc``): the prompt of ``orchestrator.tasks.KVRecallTask`` with 4
  pairs of 2-letter keys and 2-digit values, ``kp:31,xb:07,mc:55,qe:90?xb=``; the choices are the
  4 listed values (all different), the gold one is the queried key's. Chance: 25%. The model must
  find the key in its context and copy what follows it: retrieval from context, the ability LIMe
  claims to improve. 3-shot by default (examples separated by a newline).
- ``lime_induction`` (generative, ``exact_match``): induction copying. Four random 3-letter words,
  then the first two again: ``qab xel mor tiv qab xel``; the answer is the word that followed them
  the first time (``mor``). Greedy generation up to 6 tokens, stopped at a newline; the first word
  of it is matched. Only copying can answer (the words are random letters). 3-shot by default.
- ``lime_pydoc_cloze`` (multiple choice, ``acc`` and ``acc_norm``): a passage of eight words
  (at most 64 characters) of the built-in corpus' held-out documents (Python's documentation
  topics, ``data.source: builtin``; the last 10% of its fixed document order, its validation split
  at the default ``val_fraction``, never trained on); the choices are its next four words and
  three spans of four words from elsewhere in the held-out documents (each at most 32
  characters: some documentation "words" are long code or URLs, and an answer must fit a small
  model's context). Chance: 25%. 0-shot. Scored: 200 passages whose hash is not in the train
  share.

Splits: every example's prompt falls into one of train/val/test by a hash of its text
(``orchestrator.tasks.split_of``), so the few-shot pool (train) and the scored examples (test;
for the cloze val and test) never share a prompt. The files are written once per version under
``$LIME_CACHE/eval-tasks/`` (atomically: concurrent evaluations may write the same files) and the
folder is handed to the harness as an include path.
"""
from __future__ import annotations

import json
import os
import random
import re
import string
from pathlib import Path
from typing import Any

import yaml

from orchestrator.engine.data.corpus import builtin_documents, cache_dir, split_documents
from orchestrator.evaluation.suites import CLOZE, INDUCTION, KV
from orchestrator.tasks import CharVocab, Example, KVRecallTask, Task, split_of

VERSION = 2  # bump when a definition or its data changes: the files go to a new folder
SEED = 0
N_TRAIN, N_TEST = 32, 200  # few-shot pool, scored examples
# the cloze's passage in words, and its passage and choices at most so many characters
CONTEXT_WORDS, MAX_CONTEXT, MAX_SPAN = 8, 64, 32


class InductionCopy(Task):
    """Random words, then a prefix of them again; the target is the word that came next (not
    registered as a training task: it exists for evaluation only)."""

    name = "induction-copy"
    vocab = CharVocab(string.ascii_lowercase + " ", sep=" ")
    defaults = {"n_words": 4, "word_len": 3, "n_repeat": 2}

    def _configure(self, params: dict[str, Any]) -> dict[str, Any]:
        self.n_words, self.word_len, self.n_repeat = params["n_words"], params["word_len"], params["n_repeat"]
        return dict(params)

    def _sample(self, rng: random.Random, index: int) -> Example | None:
        words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(self.word_len))
                 for _ in range(self.n_words)]
        if len(set(words)) < len(words):
            return None  # a repeated word would make the answer ambiguous
        prompt = " ".join(words + words[:self.n_repeat]) + " "
        nxt = words[self.n_repeat]
        return Example(prompt=prompt, target=nxt, answer=nxt)

    def extract_answer(self, generated_text: str) -> str | None:
        m = re.match(r"\s*(\S+)", generated_text)
        return m.group(1) if m else None


def _kv_docs(split: str, n: int) -> list[dict]:
    task = KVRecallTask(n_pairs=4, key_len=2, value_len=2)
    docs: list[dict] = []
    k = n
    while len(docs) < n:  # keep the examples whose values differ, so the gold choice is unique
        docs = []
        for ex in task.generate(split, k, SEED):
            values = [pair.split(":")[1] for pair in ex.prompt.split("?")[0].split(",")]
            if len(set(values)) == len(values):
                docs.append({"prompt": ex.prompt, "choices": values, "gold": ex.meta["position"]})
        k += n
    return docs[:n]


def _induction_docs(split: str, n: int) -> list[dict]:
    return [{"prompt": ex.prompt.rstrip(" "), "target": ex.target}
            for ex in InductionCopy().generate(split, n, SEED)]


def _cloze_docs(split: str, n: int) -> list[dict]:
    """Passages of the held-out built-in documents and four-word continuations (see the module)."""
    held_out = split_documents(builtin_documents(), 0.1)[1]
    docs_words = [re.sub(r"\s+", " ", d).strip().split(" ") for d in held_out]
    docs_words = [w for w in docs_words if len(w) >= 40]
    rng = random.Random(f"lime_pydoc_cloze/{split}/{SEED}")
    out, seen = [], set()
    for _ in range(100 * n):
        if len(out) >= n:
            break
        d = rng.randrange(len(docs_words))
        words = docs_words[d]
        start = rng.randrange(0, len(words) - 24)
        context = " ".join(words[start:start + CONTEXT_WORDS])
        gold = " ".join(words[start + CONTEXT_WORDS:start + CONTEXT_WORDS + 4])
        # the few-shot pool is the hash's train share, the scored passages all the rest
        if context in seen or (split_of(context) == "train") != (split == "train"):
            continue
        if len(context) > MAX_CONTEXT or len(gold) > MAX_SPAN:
            continue
        distractors: list[str] = []
        while len(distractors) < 3:
            o = rng.randrange(len(docs_words))
            ow = docs_words[o]
            s = rng.randrange(0, len(ow) - 4)
            cand = " ".join(ow[s:s + 4])
            if cand != gold and cand not in distractors and len(cand) <= MAX_SPAN:
                distractors.append(cand)
        choices = [gold, *distractors]
        rng.shuffle(choices)
        seen.add(context)
        out.append({"prompt": context, "choices": choices, "gold": choices.index(gold)})
    return out


def _mc(name: str, shots: int, metrics: tuple[str, ...], delimiter: str, about: str) -> dict:
    return {"task": name, "output_type": "multiple_choice", "doc_to_text": "prompt", "doc_to_choice": "choices",
            "doc_to_target": "gold", "target_delimiter": delimiter, "fewshot_delimiter": "\n", "num_fewshot": shots,
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics],
            "metadata": {"version": float(VERSION), "description": about}}


DEFINITIONS = {
    KV: (_kv_docs, _mc(KV, 3, ("acc",), "", "key-value retrieval: the queried key's value among the listed ones")),
    INDUCTION: (_induction_docs, {
        "task": INDUCTION, "output_type": "generate_until", "doc_to_text": "prompt", "doc_to_target": "target",
        "target_delimiter": " ", "fewshot_delimiter": "\n", "num_fewshot": 3,
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
        "filter_list": [{"name": "first_word", "filter": [{"function": "regex", "regex_pattern": r"^\s*(\S+)"},
                                                           {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": float(VERSION), "description": "induction copying: the word that followed the "
                                                               "repeated prefix"}}),
    CLOZE: (_cloze_docs, _mc(CLOZE, 0, ("acc", "acc_norm"), " ",
                             "the next four words of a held-out passage of the built-in corpus")),
}


def local_tasks_dir() -> Path:
    return cache_dir() / "eval-tasks" / f"v{VERSION}"


def write_local_tasks(root: Path | None = None) -> Path:
    """The generated tasks' YAML and JSON files under ``root`` (default ``local_tasks_dir()``);
    files already there are kept (their content is a pure function of the version)."""
    root = Path(root) if root is not None else local_tasks_dir()
    for name, (make, config) in DEFINITIONS.items():
        folder = root / name
        cfg_path = folder / f"{name}.yaml"
        if cfg_path.is_file():
            continue
        files = {}
        for split, n in (("train", N_TRAIN), ("test", N_TEST)):
            files[split] = str((folder / f"{split}.jsonl").resolve())
            _atomic(Path(files[split]), "".join(json.dumps(d, sort_keys=True) + "\n" for d in make(split, n)))
        cfg = {**config, "dataset_path": "json", "dataset_kwargs": {"data_files": files},
               "training_split": "train", "fewshot_split": "train", "test_split": "test"}
        _atomic(cfg_path, f"# generated by orchestrator.evaluation.localtasks (version {VERSION})\n"
                + yaml.safe_dump(cfg, sort_keys=False))
    return root


def _atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
