"""Evaluations through the harness on the shipped local tasks (``tasks/``), checked against scores
computed here by hand from the model's forward pass; task resolution and the offline checks."""
from __future__ import annotations

import json
import math

import pytest
import torch

from lime_arch import ConfigError
from lime_arch.generate import generate
from orchestrator.engine.data import hub
from orchestrator.engine.data.corpus import ByteTokenizer
from orchestrator.evaluation.checks import resolve
from orchestrator.evaluation.harness import evaluate
from orchestrator.evaluation.settings import eval_settings
from tests.orchestrator.evaluation.helpers import tiny_model

TOK = ByteTokenizer()
MC_DOCS = [("What is two plus two?", ["four", "five", "a banana"], 0),
           ("Which keyword defines a function in Python?", ["class", "def", "lambda x"], 1),
           ("The colour of the sky on a clear day?", ["green", "blue", "red"], 1),
           ("Which is a prime number?", ["nine", "fifteen", "seven"], 2)]


def seq_ll(model, ctx: bytes, cont: bytes) -> float:
    ids = list(ctx + cont)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].double(), -1)
    return sum(float(lp[i - 1, ids[i]]) for i in range(len(ctx), len(ids)))


def scores(outcome) -> dict[str, float]:
    return {f"{s.task}/{s.metric}": s.value for s in outcome.scores}


def test_multiple_choice_accuracy_and_gold_bpb_match_a_hand_computation(task_dir):
    model = tiny_model(dtype=torch.float64)
    out = evaluate(model, TOK, eval_settings({"tasks": ["tiny_mc"], "include": [str(task_dir)], "num_fewshot": 0}))
    got = scores(out)
    acc, acc_norm, bpb, nll = [], [], [], []
    for q, choices, gold in MC_DOCS:
        ctx = f"Q: {q}\nA:".encode()
        lls = [seq_ll(model, ctx, (" " + c).encode()) for c in choices]  # target delimiter " "
        acc.append(float(max(range(3), key=lambda i: lls[i]) == gold))
        # the harness normalises by the choice's length (without the delimiter)
        acc_norm.append(float(max(range(3), key=lambda i: lls[i] / len(choices[i])) == gold))
        nll.append(-lls[gold])
        bpb.append(-lls[gold] / (math.log(2) * len((" " + choices[gold]).encode())))
    assert got["tiny_mc/acc"] == pytest.approx(sum(acc) / 4)
    assert got["tiny_mc/acc_norm"] == pytest.approx(sum(acc_norm) / 4)
    assert got["tiny_mc_bpb/bpb"] == pytest.approx(sum(bpb) / 4, rel=1e-9)
    assert got["tiny_mc_bpb/nll"] == pytest.approx(sum(nll) / 4, rel=1e-9)
    se = next(s.stderr for s in out.scores if s.task == "tiny_mc_bpb" and s.metric == "bpb")
    mean = sum(bpb) / 4
    assert se == pytest.approx(math.sqrt(sum((b - mean) ** 2 for b in bpb) / 3 / 4), rel=1e-9)  # stderr of a mean
    assert out.primary == {"tiny_mc": ("acc", True), "tiny_mc_bpb": ("bpb", False)}
    assert out.metrics()["eval/tiny_mc_bpb/bpb_stderr"] == pytest.approx(se)


def test_per_document_results_match_a_hand_computation_and_the_scores(task_dir):
    """Every document's acc, acc_norm and gold bits per byte, as the report pairs them, computed here from
    the forward pass; their means are the task's scores; a metric with tuple values per document (the
    rolling perplexity's) has no per-document file."""
    from types import SimpleNamespace

    from orchestrator.core import eval_items
    from orchestrator.evaluation.record import done_keys

    model = tiny_model(dtype=torch.float64, seed=3)
    out = evaluate(model, TOK, eval_settings({"tasks": ["tiny_mc", "tiny_gen", "tiny_ppl"], "include": [str(task_dir)],
                                              "num_fewshot": 0}))
    acc, acc_norm, bpb = [], [], []
    for q, choices, gold in MC_DOCS:
        ctx = f"Q: {q}\nA:".encode()
        lls = [seq_ll(model, ctx, (" " + c).encode()) for c in choices]
        acc.append(int(max(range(3), key=lambda i: lls[i]) == gold))
        acc_norm.append(int(max(range(3), key=lambda i: lls[i] / len(choices[i])) == gold))
        bpb.append(-lls[gold] / (math.log(2) * len((" " + choices[gold]).encode())))
    mc = out.items["tiny_mc"]
    assert mc["doc_id"] == [0, 1, 2, 3] and mc["key"] == out.keys["tiny_mc"]
    assert mc["metrics"] == {"acc": acc, "acc_norm": acc_norm}
    assert out.items["tiny_mc_bpb"]["metrics"]["bpb"] == pytest.approx(bpb, rel=1e-9)
    assert len(set(mc["doc_hash"])) == 4 and mc["doc_hash"] == out.items["tiny_mc_bpb"]["doc_hash"]  # same documents
    assert sum(acc) / 4 == pytest.approx(scores(out)["tiny_mc/acc"])
    gen = out.items["tiny_gen"]["metrics"]["exact_match"]
    assert len(gen) == 3 and sum(gen) / 3 == pytest.approx(scores(out)["tiny_gen/exact_match"])
    assert "tiny_ppl" not in out.items and "tiny_ppl" in out.keys
    # the file round-trips, and a task scored before per-document results were logged is not skipped
    assert eval_items.loads(eval_items.dumps(mc)) == mc
    tags = {"eval/tiny_mc/config": "k1", "eval/tiny_mc/items": "4", "eval/tiny_gen/config": "k2"}
    assert done_keys(SimpleNamespace(data=SimpleNamespace(tags=tags))) == {"tiny_mc": "k1"}


def test_few_shot_contexts_come_from_the_training_split(task_dir):
    model = tiny_model(dtype=torch.float64)
    out = evaluate(model, TOK, eval_settings({"tasks": ["tiny_mc"], "include": [str(task_dir)], "num_fewshot": 2,
                                              "gold_loss": False}))
    assert out.shots == {"tiny_mc": 2}
    assert out.harness["n-shot"] == {"tiny_mc": 2}
    assert [s.task for s in out.scores] == ["tiny_mc", "tiny_mc"]  # acc and acc_norm, no variant


def test_generation_scores_the_greedy_continuation_up_to_the_stop_string(task_dir):
    model = tiny_model(dtype=torch.float64)
    out = evaluate(model, TOK, eval_settings({"tasks": ["tiny_gen"], "include": [str(task_dir)]}))
    hits = 0
    for prompt, target in (("abc abc ab", "c"), ("The end", "ing"), ("x", "yz")):
        ids = list(prompt.encode())
        gen = generate(model, torch.tensor([ids]), 5, eos_id=256)[0, len(ids):].tolist()
        text = TOK.decode(gen[:gen.index(256)] if 256 in gen else gen).split(".")[0]
        hits += text == target
    assert scores(out)["tiny_gen/exact_match"] == pytest.approx(hits / 3)
    assert out.requests["generated"] == 3


def test_rolling_perplexity_bits_per_byte_match_a_hand_computation(task_dir):
    model = tiny_model(dtype=torch.float64)
    out = evaluate(model, TOK, eval_settings({"tasks": ["tiny_ppl"], "include": [str(task_dir)]}))
    texts = [json.loads(line)["text"] for line in (task_dir / "tiny_ppl.jsonl").read_text().splitlines()]
    total_ll, total_bytes = 0.0, 0
    for text in texts:
        t = list(text.encode())
        seq, start = [256] + t, 0
        while start < len(t):  # the disjoint windows of a 64-token context
            end = min(start + 64, len(t))
            lo = max(0, end - 64)
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([seq[lo:end]]))[0].double(), -1)
            total_ll += sum(float(lp[i - lo, seq[i + 1]]) for i in range(start, end))
            start = end
        total_bytes += len(t)
    assert len(texts[2].encode()) > 64  # one document needs several windows
    assert scores(out)["tiny_ppl/bits_per_byte"] == pytest.approx(-total_ll / total_bytes / math.log(2), rel=1e-9)
    assert out.requests["rolling_windows"] == 1 + 1 + math.ceil(len(texts[2].encode()) / 64)


def test_tasks_scored_under_the_same_key_are_skipped(task_dir):
    model = tiny_model()
    s = eval_settings({"tasks": ["tiny_mc", "tiny_gen"], "include": [str(task_dir)]})
    first = evaluate(model, TOK, s)
    again = evaluate(model, TOK, s, skip=first.keys)
    assert sorted(again.skipped) == sorted(first.keys) and not again.scores and not again.requests
    other = evaluate(model, TOK, eval_settings({"tasks": ["tiny_mc"], "include": [str(task_dir)], "num_fewshot": 1}),
                     skip=first.keys)
    assert not other.skipped and "tiny_mc" in other.keys  # other shots: another key


def test_a_variant_asked_by_name_runs_alone(task_dir):
    out = evaluate(tiny_model(), TOK, eval_settings({"tasks": ["tiny_mc_bpb"], "include": [str(task_dir)],
                                                     "gold_loss": False}))
    assert sorted(out.keys) == ["tiny_mc_bpb"]


@pytest.mark.slow  # an unknown name is looked up in the harness's own ~15,000 tasks too (seconds)
def test_an_unknown_task_is_one_line_with_suggestions(task_dir):
    with pytest.raises(ConfigError, match=r"eval.tasks: unknown task 'tiny_mcq'.*did you mean tiny_mc"):
        resolve(eval_settings({"tasks": ["tiny_mcq"], "include": [str(task_dir)]}))


def test_an_include_that_is_no_folder_is_one_line():
    with pytest.raises(ConfigError, match=r"eval.include\[0\]: '/no/such' is not a folder"):
        resolve(eval_settings({"tasks": ["tiny_mc"], "include": ["/no/such"]}))


def test_a_hub_task_offline_is_one_line_naming_the_task(task_dir, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"eval.tasks: task 'hub_task' needs the dataset lime-sweeps-tests/"
                                          r"no-such-dataset, which is not in the Hugging Face cache"
                                          r".*HF_DATASETS_OFFLINE.*dataset_path: json"):
        resolve(eval_settings({"tasks": ["tiny_mc", "hub_task"], "include": [str(task_dir)]}))


def test_a_hub_task_with_the_hub_unreachable_is_one_line_naming_the_task(task_dir, monkeypatch):
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "unreachable", lambda timeout=3.0: "Connection refused")
    with pytest.raises(ConfigError, match=r"task 'hub_task' needs the dataset .* from the Hugging Face hub, "
                                          r"which is not reachable .*Connection refused.*HF_DATASETS_OFFLINE=1"):
        resolve(eval_settings({"tasks": ["hub_task"], "include": [str(task_dir)]}))


def test_a_missing_local_data_file_is_one_line(tmp_path):
    (tmp_path / "t.yaml").write_text("task: gone\ndataset_path: json\n"
                                     "dataset_kwargs: {data_files: {test: nope.jsonl}}\n"
                                     "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\n"
                                     "doc_to_target: '{{text}}'\n")
    with pytest.raises(ConfigError, match=r"task 'gone': its data file 'nope.jsonl' does not exist"):
        resolve(eval_settings({"tasks": ["gone"], "include": [str(tmp_path)]}))
