"""Data sources: the built-in corpus, local text files, Hugging Face datasets, synthetic tasks.

Every source returns an object with the same small interface, so the trainer never branches on
the source:
  vocab_size, eos_id, tokenizer          the tokenizer the model's vocabulary follows
  train_batch(step, batch, seq, seed)    (x, y) for a step: a pure function of (seed, step), so
                                         the data position of a checkpoint is just its step
  val_batches(batch, seq, n)             a fixed held-out set, the same for every trial (corpora:
                                         data.val_tokens spread over the held-out documents,
                                         ``heldout.window_starts``; tasks: n batches of examples)
  evaluate(model, device)                extra validation metrics (task accuracy), {} for corpora
  describe()                             numbers worth logging (tokens per split, ...)
Targets use -100 where the loss is masked (synthetic prompts).
"""
from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import torch

from lime_arch import ConfigError
from orchestrator.engine.data import hub
from orchestrator.engine.data.heldout import drop_near_duplicates, window_starts
from orchestrator.engine.data.registry import register_source
from orchestrator.engine.sources import expand_paths
from orchestrator.engine.trial_config import DataConfig


# -- tokenizers --------------------------------------------------------------------------------
class ByteTokenizer:
    """UTF-8 bytes plus one EOS id: no training, no download."""

    vocab_size, eos_id, name = 257, 256, "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers` tokenizer (trained here, loaded from a file, or named on the hub)."""

    EOS_CANDIDATES = ("<|endoftext|>", "</s>", "[EOS]", "<eos>")

    def __init__(self, tok, name: str):
        self.tok, self.name = tok, name
        eos = next((t for t in self.EOS_CANDIDATES if tok.token_to_id(t) is not None), None)
        if eos is None:
            tok.add_special_tokens(["<|endoftext|>"])
            eos = "<|endoftext|>"
        self.eos_id = tok.token_to_id(eos)
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))


def cache_dir() -> Path:
    d = Path(os.environ.get("LIME_CACHE", Path.home() / ".cache" / "lime-sweeps"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def train_bpe(texts: list[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE trained locally on the training texts, cached by content hash."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", errors="replace"))
    path = cache_dir() / f"bpe-{vocab_size}-{h.hexdigest()[:16]}.json"
    if path.exists():
        return HFTokenizer(Tokenizer.from_file(str(path)), f"bpe-{vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)  # atomic: concurrent trials may train the same tokenizer
    return HFTokenizer(tok, f"bpe-{vocab_size}")


def load_named_tokenizer(name: str) -> HFTokenizer:
    from tokenizers import Tokenizer

    path = os.path.expanduser(name)
    if os.path.isfile(path):
        return HFTokenizer(Tokenizer.from_file(path), os.path.basename(path))
    return HFTokenizer(Tokenizer.from_file(hub.tokenizer_file(name)), name)  # hub: only when the user asked


# -- token streams -----------------------------------------------------------------------------
EVAL_BATCH_TOKENS = 8192  # targets per validation batch at least: few forward calls, no gradients kept
class TokenData:
    """A language-modelling corpus: one training and one validation stream of token ids."""

    def __init__(self, train: torch.Tensor, val: torch.Tensor, tokenizer, name: str, *, val_tokens: int,
                 **info):
        self.train, self.val, self.tokenizer, self.name, self.info = train, val, tokenizer, name, info
        self.val_tokens = val_tokens  # data.val_tokens: the size of the validation set
        self.vocab_size, self.eos_id = tokenizer.vocab_size, tokenizer.eos_id

    def train_batch(self, step: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.train.numel() - seq - 1
        if n < 1:
            raise ConfigError(f"train.seq_len: {seq} is longer than the {self.name} training split "
                              f"({self.train.numel()} tokens)")
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, n + 1, (batch,), generator=g)
        idx = starts[:, None] + torch.arange(seq + 1)
        chunk = self.train[idx]
        return chunk[:, :-1], chunk[:, 1:]

    def val_batches(self, batch: int, seq: int, n: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The validation windows (``heldout.window_starts``: ``val_tokens`` spread over the whole
        held-out stream) in batches of ``batch`` windows, or of ``EVAL_BATCH_TOKENS`` targets when
        that is more (no gradients: a pass over 32768 tokens in batches of 2 x 16 would take
        1024 forward calls); ``n`` (``train.eval_batches``) sizes only the synthetic tasks' sets,
        a corpus's size is ``data.val_tokens``."""
        starts = torch.tensor(window_starts(self.val.numel(), seq, self.val_tokens, self.name))
        chunk = self.val[starts[:, None] + torch.arange(seq + 1)]
        x, y = chunk[:, :-1], chunk[:, 1:]
        rows = max(batch, EVAL_BATCH_TOKENS // seq)
        return [(x[i:i + rows], y[i:i + rows]) for i in range(0, len(starts), rows)]

    def evaluate(self, model, device) -> dict[str, float]:
        return {}

    def describe(self) -> dict:
        return {"train_tokens": int(self.train.numel()), "val_tokens": int(self.val.numel()),
                "tokenizer": getattr(self.tokenizer, "name", "?"), **self.info}


def _stream(docs: list[list[int]], eos: int) -> torch.Tensor:
    out: list[int] = []
    for d in docs:
        out.extend(d)
        out.append(eos)
    return torch.tensor(out, dtype=torch.long)


def split_documents(texts: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(training, validation) documents of a corpus: the non-empty ones, the last
    ``val_fraction`` of them held out."""
    texts = [t for t in texts if t.strip()]
    n_val = max(1, round(len(texts) * val_fraction))
    return texts[:-n_val], texts[-n_val:]


def _corpus(texts: list[str], cfg: DataConfig, name: str) -> TokenData:
    n = sum(1 for t in texts if t.strip())
    if n < 2:
        raise ConfigError(f"data.source: the {name} corpus has {n} non-empty document(s); "
                          "need at least 2 (one for validation)")
    train_t, val_t = split_documents(texts, cfg.val_fraction)
    tok = ByteTokenizer() if cfg.tokenizer == "byte" else train_bpe(train_t, cfg.bpe_vocab_size)
    enc = tok.encode
    return TokenData(_stream([enc(t) for t in train_t], tok.eos_id),
                     _stream([enc(t) for t in val_t], tok.eos_id), tok, name, val_tokens=cfg.val_tokens,
                     train_docs=len(train_t), val_docs=len(val_t))


# the sources' cheap checks are declared in orchestrator.engine.sources
@register_source("builtin")
def _builtin(cfg: DataConfig) -> TokenData:
    """CPython's own documentation topics: ships with Python, so nothing is downloaded."""
    return _corpus(builtin_documents(), cfg, "builtin")


def builtin_documents() -> list[str]:
    """The built-in corpus' documents in their fixed order (``split_documents`` holds out the last),
    without near duplicates (``heldout.drop_near_duplicates``: they would put training text in the
    held-out documents)."""
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)]
    random.Random(1234).shuffle(texts)  # fixed shuffle: the split is the same for everyone
    return drop_near_duplicates(texts)


@register_source("text")
def _text(cfg: DataConfig) -> TokenData:
    files = expand_paths(cfg.paths)
    texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]
    if not any(t.strip() for t in texts):
        raise ConfigError(f"data.paths: the files are empty ({', '.join(files)})")
    return _corpus(texts, cfg, "text")


@register_source("hf")
def _hf(cfg: DataConfig) -> TokenData:
    """Any `datasets` dataset (hub name or a local save_to_disk folder), packed with EOS, with a
    named tokenizer (``byte``: GPT-2's), a ``tokenizer.json`` file, or a BPE trained here (``bpe``)."""
    import datasets

    hub.check_reachable(cfg)  # seconds, not minutes of retries, when the hub cannot be reached
    if os.path.isdir(cfg.hf_name):
        ds = datasets.load_from_disk(cfg.hf_name)
        if isinstance(ds, datasets.DatasetDict):
            if cfg.hf_split not in ds:
                raise ConfigError(f"data.hf_split: {cfg.hf_split!r} not in {cfg.hf_name} ({', '.join(ds)})")
            ds = ds[cfg.hf_split]
    else:
        ds = hub.load_dataset(cfg)
    names = getattr(ds, "column_names", None)
    if names is not None and cfg.hf_text_field not in names:
        raise ConfigError(f"data.hf_text_field: {cfg.hf_text_field!r} is not a column of {cfg.hf_name} "
                          f"({', '.join(names)})")
    if cfg.tokenizer == "bpe":
        return _hf_bpe(ds, cfg)
    tok = load_named_tokenizer("gpt2" if cfg.tokenizer == "byte" else cfg.tokenizer)
    val_docs, train_ids, budget = [], [], cfg.max_train_tokens
    buf: list[str] = []

    def flush():
        nonlocal budget
        for ids in tok.encode_batch(buf):
            train_ids.extend(ids)
            train_ids.append(tok.eos_id)
        budget = cfg.max_train_tokens - len(train_ids)
        buf.clear()

    for i, row in enumerate(ds):
        text = row[cfg.hf_text_field]
        if i < cfg.hf_val_docs:
            val_docs.append(tok.encode(text))
            continue
        buf.append(text)
        if len(buf) >= 256:
            flush()
            if budget <= 0:
                break
    flush()
    if not val_docs or not train_ids:
        raise ConfigError(f"data.hf_val_docs: {cfg.hf_name} has too few documents for a "
                          f"{cfg.hf_val_docs}-document validation set and a training set")
    train = torch.tensor(train_ids[: cfg.max_train_tokens], dtype=torch.long)
    return TokenData(train, _stream(val_docs, tok.eos_id), tok, f"hf:{cfg.hf_name}", val_tokens=cfg.val_tokens,
                     val_docs=len(val_docs))


BPE_CHARS_PER_TOKEN = 8  # text read per training token for a BPE trained here: more than BPE tokens span


def _hf_bpe(ds, cfg: DataConfig) -> TokenData:
    """``data.tokenizer: bpe`` with the hf source: a byte-level BPE trained here on the training
    documents (as the builtin and text sources do), read up to ``BPE_CHARS_PER_TOKEN`` characters
    per token of ``max_train_tokens``; the first ``hf_val_docs`` documents are the validation set."""
    val_t, train_t, chars = [], [], 0
    for i, row in enumerate(ds):
        text = row[cfg.hf_text_field]
        if i < cfg.hf_val_docs:
            val_t.append(text)
            continue
        train_t.append(text)
        chars += len(text)
        if chars >= BPE_CHARS_PER_TOKEN * cfg.max_train_tokens:
            break
    if not val_t or not train_t:
        raise ConfigError(f"data.hf_val_docs: {cfg.hf_name} has too few documents for a "
                          f"{cfg.hf_val_docs}-document validation set and a training set")
    tok = train_bpe(train_t, cfg.bpe_vocab_size)
    train = _stream(tok.encode_batch(train_t), tok.eos_id)[: cfg.max_train_tokens]
    return TokenData(train, _stream(tok.encode_batch(val_t), tok.eos_id), tok, f"hf:{cfg.hf_name}",
                     val_tokens=cfg.val_tokens, val_docs=len(val_t))
