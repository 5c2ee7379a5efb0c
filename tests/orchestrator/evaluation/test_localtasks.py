"""The generated tasks (KV, Induction, the built-in corpus' cloze) and the suites: their data read
back from the files, checked against the generators' own rules; suite expansion and settings."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from lime_arch import ConfigError
from orchestrator.engine.data import make_batches
from orchestrator.engine.data.corpus import builtin_documents, split_documents
from orchestrator.engine.trial_config import DataConfig
from orchestrator.evaluation import suites
from orchestrator.evaluation.loading import trial_tokenizer
from orchestrator.evaluation.localtasks import DEFINITIONS, write_local_tasks
from orchestrator.evaluation.settings import eval_settings
from orchestrator.tasks import split_of


def read(root, name: str, split: str) -> list[dict]:
    return [json.loads(line) for line in (root / name / f"{split}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_local_tasks(tmp_path_factory.mktemp("tasks"))


def test_every_local_task_is_a_harness_yaml_task_with_local_data(root):
    for name in suites.LOCAL_TASKS:
        cfg = yaml.safe_load((root / name / f"{name}.yaml").read_text())
        assert cfg["task"] == name and cfg["dataset_path"] == "json"
        for split in ("train", "test"):
            assert cfg["dataset_kwargs"]["data_files"][split] == str((root / name / f"{split}.jsonl").resolve())
        train, test = read(root, name, "train"), read(root, name, "test")
        assert len(train) == 32 and len(test) >= 100
        assert not {d["prompt"] for d in train} & {d["prompt"] for d in test}  # few-shot pool never scored
        scored = {"test", "val"} if name == suites.CLOZE else {"test"}  # the cloze scores all but train
        assert all(split_of(d["prompt"] + (" " if name == suites.INDUCTION else "")) in scored for d in test)
    assert set(DEFINITIONS) == set(suites.LOCAL_TASKS)


def test_kv_choices_are_the_listed_values_and_gold_is_the_queried_keys(root):
    for d in read(root, suites.KV, "test"):
        pairs, query = d["prompt"].rstrip("=").split("?")
        kv = dict(p.split(":") for p in pairs.split(","))
        assert d["choices"] == list(kv.values()) and len(set(d["choices"])) == 4
        assert d["choices"][d["gold"]] == kv[query]


def test_induction_answer_is_the_word_after_the_repeated_prefix(root):
    for d in read(root, suites.INDUCTION, "test"):
        words = d["prompt"].split(" ")
        first, again = words[:4], words[4:]
        assert again == first[:2] and len(set(first)) == 4
        assert d["target"] == first[2] and re.fullmatch(r"[a-z]{3}", d["target"])


def test_cloze_gold_is_the_text_that_follows_in_a_held_out_document(root):
    held_out = [re.sub(r"\s+", " ", t).strip() for t in split_documents(builtin_documents(), 0.1)[1]]
    trained = [re.sub(r"\s+", " ", t).strip() for t in split_documents(builtin_documents(), 0.1)[0]]
    docs = read(root, suites.CLOZE, "test")
    for d in docs:
        gold = d["choices"][d["gold"]]
        passage = d["prompt"] + " " + gold
        assert any(passage in t for t in held_out)
        assert len(set(d["choices"])) == 4 and all(len(c.split(" ")) == 4 and len(c) <= 32 for c in d["choices"])
        assert len(d["prompt"].split(" ")) == 8 and len(d["prompt"]) <= 64
    assert not any(docs[0]["prompt"] + " " + docs[0]["choices"][docs[0]["gold"]] in t for t in trained)


def test_files_are_the_same_on_every_write(tmp_path):
    a, b = write_local_tasks(tmp_path / "a"), write_local_tasks(tmp_path / "b")
    for name in suites.LOCAL_TASKS:
        assert (a / name / "test.jsonl").read_bytes() == (b / name / "test.jsonl").read_bytes()


def test_suites_expand_in_order_each_task_once_with_the_papers_shots():
    plan = suites.plan(["paper-qa", "arc_easy", "lime_kv", "paper-table-1"])
    assert plan[:4] == [("arc_easy", 3), ("arc_challenge", 3), ("hellaswag", 3), ("openbookqa", 3)]
    assert plan[4] == ("lime_kv", None)  # named alone first: the task's own shots
    assert [t for t, _ in plan].count("arc_easy") == 1 and ("multirc", 3) in plan
    assert suites.plan(["paper-360m"]) == [(t, None) for t in ("arc_challenge", "commonsense_qa", "hellaswag", "gsm8k")]
    assert all(n == 0 for _, n in suites.plan(["paper-glue"], num_fewshot=0))
    assert suites.base_of_variant("arc_easy_bpb") == "arc_easy" and suites.base_of_variant("arc_easy") is None


@pytest.mark.parametrize("block, message", [
    ({"tasks": []}, r"eval.tasks: a non-empty list"),
    ({"tasks": ["ok", "a/b"]}, r"eval.tasks\[1\]: 'a/b' is not a task or suite name"),
    ({"tasks": ["x"], "limit": 0}, r"eval.limit: must be an integer >= 1 .* or a fraction in \(0, 1\), got 0"),
    ({"tasks": ["x"], "limit": 1.5}, r"eval.limit: .* got 1.5"),
    ({"tasks": ["x"], "num_fewshot": -1}, r"eval.num_fewshot: must be"),
    ({"tasks": ["x"], "batch_size": 0}, r"eval.batch_size: must be"),
    ({"tasks": ["x"], "shots": 3}, r"eval.shots: unknown key; allowed: batch_size, gold_loss, include"),
    ({"tasks": "paper-qa"}, r"eval.tasks: must be a non-empty list"),
])
def test_a_bad_eval_block_is_one_line_naming_the_key(block, message):
    with pytest.raises(ConfigError, match=message):
        eval_settings(block)


def test_task_keys_change_with_what_decides_a_score():
    s = eval_settings({"tasks": ["x"]})
    k = s.task_key("x", 3, 1.0)
    assert k.startswith("3-shot,limit=None,") and k == s.task_key("x", 3, 1.0)
    assert k != s.task_key("x", 0, 1.0) != s.task_key("x", 3, 2.0)
    assert k != eval_settings({"tasks": ["x"], "limit": 10}).task_key("x", 3, 1.0)
    assert k == eval_settings({"tasks": ["x"], "batch_size": 3}).task_key("x", 3, 1.0)  # batching changes nothing


def test_the_trials_tokenizer_comes_back_without_reading_its_data(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    assert trial_tokenizer(DataConfig(source="builtin")).encode("é!") == [195, 169, 33]
    bpe = make_batches(DataConfig(source="builtin", tokenizer="bpe", bpe_vocab_size=300)).tokenizer
    path = tmp_path / "tokenizer.json"
    bpe.tok.save(str(path))
    named = trial_tokenizer(DataConfig(source="hf", tokenizer=str(path)))  # a tokenizer.json of an hf trial
    text = "def f(x):\n    return x"
    assert named.encode(text) == bpe.encode(text) and named.eos_id == bpe.eos_id
    again = trial_tokenizer(DataConfig(source="builtin", tokenizer="bpe", bpe_vocab_size=300))  # from the cache
    assert again.encode(text) == bpe.encode(text)
    with pytest.raises(ConfigError, match=r"data.tokenizer: the tokenizer 'gpt2' is not in the Hugging Face cache"):
        trial_tokenizer(DataConfig(source="hf", tokenizer="byte"))  # offline: GPT-2's, not cached here
