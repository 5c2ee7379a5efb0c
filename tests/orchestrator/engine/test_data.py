import pytest
import torch

from lime_arch import ConfigError
from orchestrator.engine.data import SOURCES, make_batches, register_source
from orchestrator.engine.data.corpus import ByteTokenizer, train_bpe
from orchestrator.engine.trial_config import DATA_SOURCES, DataConfig, TrialConfig


def test_one_table_of_source_names():
    """The config checks names against the declared table; the data package registers a function
    for each of them and may register no other name."""
    assert list(SOURCES) == list(DATA_SOURCES) and SOURCES.missing() == []
    assert DATA_SOURCES[:3] == ("builtin", "text", "hf") and {"arithmetic", "prosqa", "kv-recall"} <= set(DATA_SOURCES)
    with pytest.raises(ValueError, match="source name 'wiki' is not declared; declared: builtin, text, hf, "):
        register_source("wiki")(lambda cfg: None)
    with pytest.raises(ValueError, match="source name 'text' is registered already"):
        register_source("text")(lambda cfg: None)
    assert list(SOURCES) == list(DATA_SOURCES)
    with pytest.raises(ConfigError) as e:
        TrialConfig.from_dict({"data": {"source": "wiki"}})
    assert str(e.value) == f"data.source: unknown source 'wiki'; allowed: {', '.join(DATA_SOURCES)}"


def test_builtin_split_is_deterministic_and_disjoint():
    a, b = make_batches(DataConfig()), make_batches(DataConfig())
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    eos = a.eos_id
    train_docs = set(bytes(t) for t in _docs(a.train.tolist(), eos))
    val_docs = set(bytes(t) for t in _docs(a.val.tolist(), eos))
    assert train_docs and val_docs and not (train_docs & val_docs)
    assert a.vocab_size == 257


def _docs(ids, eos):
    doc, out = [], []
    for i in ids:
        if i == eos:
            out.append(doc)
            doc = []
        else:
            doc.append(i)
    return out


def test_train_batch_is_a_function_of_seed_and_step():
    d = make_batches(DataConfig())
    x1, y1 = d.train_batch(3, 4, 16, seed=0)
    x2, _ = d.train_batch(3, 4, 16, seed=0)
    x3, _ = d.train_batch(4, 4, 16, seed=0)
    x4, _ = d.train_batch(3, 4, 16, seed=1)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3) and not torch.equal(x1, x4)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    v1, v2 = d.val_batches(4, 16, 3), d.val_batches(4, 16, 3)
    # a corpus's set is data.val_tokens (32768) targets: 2048 windows of 16, in batches of 8192 // 16 = 512
    assert all(torch.equal(a[0], b[0]) for a, b in zip(v1, v2)) and [len(x) for x, _ in v1] == [512] * 4


def test_text_source_reads_globs(tmp_path):
    for i in range(5):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i} " * 50)
    d = make_batches(DataConfig(source="text", paths=[str(tmp_path / "*.txt")], val_fraction=0.2))
    assert d.describe()["train_docs"] == 4 and d.describe()["val_docs"] == 1
    assert ByteTokenizer().decode(d.val[:18].tolist()) == "document number 4 "


@pytest.mark.parametrize("cfg,field", [
    (DataConfig(source="text", paths=["/definitely/missing.txt"]), "data.paths"),
    (DataConfig(source="text", paths=[]), "data.paths"),
    (DataConfig(source="wiki"), "data.source"),
    (DataConfig(tokenizer="gpt2"), "data.tokenizer"),
])
def test_bad_sources(cfg, field):
    with pytest.raises(ConfigError) as e:
        make_batches(cfg)
    assert str(e.value).startswith(field)


def test_empty_corpus(tmp_path):
    (tmp_path / "a.txt").write_text("   \n")
    (tmp_path / "b.txt").write_text("")
    with pytest.raises(ConfigError, match=r"data.paths: \S+/a.txt holds only whitespace"):  # the first one found
        make_batches(DataConfig(source="text", paths=[str(tmp_path / "*.txt")]))


def test_bpe_tokenizer_trained_locally_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LIME_CACHE", str(tmp_path))
    texts = ["the cat sat on the mat. " * 40, "a dog ran in the park. " * 40]
    tok = train_bpe(texts, 300)
    assert list(tmp_path.glob("bpe-300-*.json"))
    ids = tok.encode("the cat sat")
    assert tok.decode(ids) == "the cat sat" and len(ids) < len("the cat sat")
    assert train_bpe(texts, 300).encode("the cat sat") == ids  # the cached file gives the same ids


def test_hf_source_on_a_local_dataset(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    docs = [f"doc {i}: " + "lorem ipsum dolor sit amet " * (i % 5 + 1) for i in range(40)]
    datasets.Dataset.from_dict({"body": docs, "id": list(range(40))}).save_to_disk(str(tmp_path / "ds"))
    tok = train_bpe(docs, 280)
    tok.tok.save(str(tmp_path / "tokenizer.json"))
    cfg = DataConfig(source="hf", hf_name=str(tmp_path / "ds"), hf_text_field="body", hf_val_docs=5,
                     tokenizer=str(tmp_path / "tokenizer.json"))
    d = make_batches(cfg)
    assert d.vocab_size == tok.vocab_size
    # documents are packed with an EOS after each one; the first 5 are the validation set
    assert int((d.val == d.eos_id).sum()) == 5 and int((d.train == d.eos_id).sum()) == 35
    assert tok.decode(d.val[: d.val.tolist().index(d.eos_id)].tolist()) == docs[0]
    x, y = d.train_batch(0, 2, 8, seed=0)
    assert x.shape == (2, 8)
    bad = DataConfig(source="hf", hf_name=str(tmp_path / "ds"), hf_text_field="text",
                     tokenizer=str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match="data.hf_text_field"):
        make_batches(bad)
