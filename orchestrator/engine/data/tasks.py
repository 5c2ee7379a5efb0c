"""Synthetic task data sources: ``arithmetic``, ``prosqa`` and ``kv-recall``.

The source name is the task name (``data.source: arithmetic``); the task's parameters come from
``data.task`` (passed to ``orchestrator.tasks.make_task``), the sizes from ``data.n_train`` and
``data.n_val`` (examples). The object follows the interface of ``orchestrator.engine.data.corpus``:

- ``vocab_size`` / ``eos_id`` / ``tokenizer``: the task's fixed character vocabulary (ids 0/1/2 =
  pad/bos/eos), so the model's vocabulary is tiny and identical for every trial of a task
  (``data.tokenizer`` is ignored).
- The examples are the SAME for every trial: both splits are generated with a fixed data seed,
  ``data.task.data_seed`` (default 0; it is not a task parameter and is removed before
  ``make_task``). The trial seed (``train.seed``) changes the model's init and the ORDER of the
  training examples, never the examples themselves, so seeds of a sweep are replicates on one
  data set and every trial is scored on the same held-out set. Training examples come from the
  task's "train" split, held-out ones from its "val" split; the task's hash split guarantees that
  no prompt is in both.
- ``train_batch(step, batch, seq, seed)``: epoch-wise shuffling. Example slot ``g = step * batch
  + i`` is position ``g % n_train`` of epoch ``g // n_train``, whose order is a permutation drawn
  from (seed, epoch) alone, so a batch is a pure function of (seed, step) and every epoch shows
  every example exactly once. Each example is ``[bos] + prompt + target + [eos]``; inputs are
  ``ids[:-1]``, targets ``ids[1:]`` with -100 on the prompt (the loss covers only target and
  eos) and on padding. A batch is padded (pad id in x, -100 in y) to its longest example, not to
  ``seq``: ``seq`` (train.seq_len) is only the maximum, checked against the longest example of
  both splits before training (a ConfigError naming ``train.seq_len`` and ``data.task``).
- ``val_batches(batch, seq, n)``: the first ``n * batch`` held-out examples, in order, batched
  the same way (the validation loss is the loss per target token).
- ``evaluate(model, device)``: greedy decoding with the model's KV cache on all ``n_val``
  held-out examples; the answer is extracted with the task's ``extract_answer`` (malformed ->
  wrong) and exact-matched: ``val/accuracy``, ``val/accuracy_<group>`` per ``metric_groups``
  (``val/accuracy_ops4`` ... for arithmetic) and ``val/malformed`` (the fraction of generations
  without an extractable answer).

Decoding without padding (the model has none): prompts are sorted by length and batched; the
batch is prefilled up to its shortest prompt, then every step feeds, per row, either the row's
next prompt token (while its prompt lasts) or its own greedy prediction. All rows therefore share
positions and one KV cache, and each row's output is exactly what decoding it alone would give.
A row generates at most ``max_new`` tokens (the longest held-out target plus eos); decoding stops
as soon as every row has emitted eos. The model runs in eval mode and fp32 (no autocast).
"""
from __future__ import annotations

import functools
import json

import torch

from lime_arch import ConfigError
from lime_arch.model import KVCache
from orchestrator.engine import final_names
from orchestrator.engine.data.registry import IGNORE, register_source
from orchestrator.engine.taskspec import build_task, task_error
from orchestrator.engine.trial_config import DataConfig
from orchestrator.tasks import TASKS, Example, Task, make_task

EVAL_BATCH = 128  # prompts decoded together in evaluate()
@functools.lru_cache(maxsize=8)
def _examples(name: str, params_json: str, split: str, n: int, seed: int) -> tuple[Example, ...]:
    """Generated examples, cached per process (the CLI builds the data twice, tests many times)."""
    task = make_task(name, **json.loads(params_json))
    return tuple(task.generate(split, n, seed))


def _generate(task: Task, split: str, n: int, seed: int, key: str) -> list[Example]:
    try:
        return list(_examples(task.name, json.dumps(task.params, sort_keys=True), split, n, seed))
    except ConfigError as err:
        if "distinct" in str(err):  # the parameter space has too few prompts for n
            raise ConfigError(f"{key}: {err}") from None
        raise task_error(err) from None


class CharTokenizer:
    """The task vocabulary behind the tokenizer interface (encode adds no bos/eos)."""

    def __init__(self, task: Task):
        self.vocab = task.vocab
        self.name = f"char-{task.name}"
        self.vocab_size, self.eos_id = task.vocab.size, task.vocab.eos_id
        self.pad_id, self.bos_id = task.vocab.pad_id, task.vocab.bos_id

    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(text)

    def decode(self, ids) -> str:
        return self.vocab.decode(ids)


class _Encoded:
    """Examples as padded id rows ``[bos] + prompt + target + [eos]`` and their shifted targets."""

    def __init__(self, task: Task, examples: list[Example]):
        rows = [task.encode(ex, 1 << 30) for ex in examples]
        self.lengths = torch.tensor([len(ids) for ids, _ in rows], dtype=torch.long)
        width = int(self.lengths.max())
        pad = task.vocab.pad_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        tgt = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        for r, (row, mask) in enumerate(rows):
            t = torch.tensor(row, dtype=torch.long)
            ids[r, :len(row)] = t
            tgt[r, :len(row)] = torch.where(torch.tensor(mask, dtype=torch.bool), t, IGNORE)
        # Small vocabularies: int16 storage halves/quarters the memory of 150k-example sets.
        self.ids, self.tgt = ids.to(torch.int16), tgt.to(torch.int16)
        self.max_len = width

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        L = int(self.lengths[rows].max())
        return self.ids[rows, :L - 1].long(), self.tgt[rows, 1:L].long()


class TaskData:
    """A synthetic task as a data source (see the module docstring)."""

    def __init__(self, name: str, cfg: DataConfig):
        self.task, self.data_seed = build_task(name, cfg)
        self.name = name
        self.tokenizer = CharTokenizer(self.task)
        self.vocab_size, self.eos_id = self.tokenizer.vocab_size, self.tokenizer.eos_id
        self.train_examples = _generate(self.task, "train", cfg.n_train, self.data_seed, "data.n_train")
        self.val_examples = _generate(self.task, "val", cfg.n_val, self.data_seed, "data.n_val")
        self._train = _Encoded(self.task, self.train_examples)
        self._val = _Encoded(self.task, self.val_examples)
        self.max_len = max(self._train.max_len, self._val.max_len)  # incl. bos and eos
        self._perms: dict[tuple[int, int], torch.Tensor] = {}

    # -- checks ----------------------------------------------------------------------------------
    def check_seq_len(self, seq: int) -> None:
        """An example is fed as ``max_len - 1`` inputs: it must fit in train.seq_len."""
        if self.max_len - 1 > seq:
            raise ConfigError(
                f"train.seq_len: {seq} is too short for the {self.name} task with data.task="
                f"{self.task.params}: its longest example needs {self.max_len - 1} positions "
                f"(bos + prompt + target); raise train.seq_len (and model.max_seq_len) to at least "
                f"{self.max_len - 1} or shrink the task parameters")

    # -- batches ---------------------------------------------------------------------------------
    def _perm(self, seed: int, epoch: int) -> torch.Tensor:
        key = (seed, epoch)
        if key not in self._perms:
            if len(self._perms) >= 4:
                self._perms.pop(next(iter(self._perms)))
            g = torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7_919 + 17) % (1 << 63))
            self._perms[key] = torch.randperm(len(self.train_examples), generator=g)
        return self._perms[key]

    def train_rows(self, step: int, batch: int, seed: int) -> torch.Tensor:
        """Indices (into the training examples) of the examples of a step."""
        n = len(self.train_examples)
        slots = torch.arange(step * batch, (step + 1) * batch)
        epochs, pos = slots // n, slots % n
        rows = torch.empty(batch, dtype=torch.long)
        for e in torch.unique(epochs).tolist():
            sel = epochs == e
            rows[sel] = self._perm(seed, e)[pos[sel]]
        return rows

    def train_batch(self, step: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.check_seq_len(seq)
        return self._train.batch(self.train_rows(step, batch, seed))

    def val_batches(self, batch: int, seq: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.check_seq_len(seq)
        k = min(n * batch, len(self.val_examples))
        return [self._val.batch(torch.arange(i, min(i + batch, k))) for i in range(0, k, batch)]

    # -- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def generate_answers(self, model, device, examples: list[Example] | None = None) -> list[str]:
        """Greedy generations (decoded text up to eos) for ``examples`` (default: the held-out set)."""
        examples = self.val_examples if examples is None else examples
        vocab = self.task.vocab
        prompts = [self.task.encode_prompt(ex) for ex in examples]
        max_new = max(len(ex.target) for ex in examples) + 1
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        texts: list[str] = [""] * len(prompts)
        was_training = model.training
        model.eval()
        try:
            for s in range(0, len(order), EVAL_BATCH):
                idx = order[s:s + EVAL_BATCH]
                gen = _decode(model, [prompts[i] for i in idx], max_new, vocab.eos_id, vocab.pad_id, device)
                for i, g in zip(idx, gen):
                    texts[i] = vocab.decode(g)
        finally:
            model.train(was_training)
        return texts

    def evaluate(self, model, device) -> dict[str, float]:
        texts = self.generate_answers(model, device)
        hits: dict[str, list[int]] = {"": []}
        malformed = 0
        for ex, text in zip(self.val_examples, texts):
            ok = int(self.task.score(ex, text))
            malformed += self.task.extract_answer(text) is None
            for g in ["", *self.task.metric_groups(ex)]:
                hits.setdefault(g, []).append(ok)
        out = {final_names.task_group(g): sum(v) / len(v) for g, v in sorted(hits.items()) if v}
        out[final_names.TASK_MALFORMED] = malformed / len(texts)
        return out

    def describe(self) -> dict:
        tr, va = self._train.lengths.float(), self._val.lengths.float()
        return {"task": self.name, "task_params": self.task.params, "data_seed": self.data_seed,
                "train_examples": len(self.train_examples), "val_examples": len(self.val_examples),
                "max_len": self.max_len, "mean_len": round(float(torch.cat([tr, va]).mean()), 2),
                "train_tokens": int(tr.sum()), "val_tokens": int(va.sum()),
                "train_target_tokens": int((self._train.tgt != IGNORE).sum()),
                "tokenizer": self.tokenizer.name}


def _decode(model, prompts: list[list[int]], max_new: int, eos_id: int, pad_id: int, device) -> list[list[int]]:
    """Greedy KV-cache decoding of prompts of (possibly) different lengths, without padding:
    prefill the shortest prompt length, then feed each row its own prompt token while its prompt
    lasts and its greedy prediction afterwards. Returns each row's (at most) ``max_new`` tokens."""
    B = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=device)
    lo, hi = int(lens.min()), int(lens.max())
    max_pos = model.cfg.max_seq_len
    total = min(hi + max_new, max_pos)
    buf = torch.full((B, total), pad_id, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):
        buf[r, :len(p)] = torch.tensor(p[:total], dtype=torch.long)
    dtype = next(model.parameters()).dtype
    cache = KVCache(model.cfg, B, total, device, dtype)
    logits = model(buf[:, :lo], cache)[:, -1]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    eos = torch.full((B,), eos_id, dtype=torch.long, device=device)
    pos = lo
    while pos < total:
        pred = logits.argmax(-1)
        gen = pos >= lens  # rows past their prompt
        tok = torch.where(gen, torch.where(done, eos, pred), buf[:, pos])
        done |= gen & (tok == eos_id)
        buf[:, pos] = tok
        pos += 1
        if pos >= total or (pos >= hi and bool(done.all())):
            break
        logits = model(tok[:, None], cache)[:, -1]
    out = buf.cpu().tolist()
    return [row[n:n + max_new] for row, n in zip(out, lens.tolist())]


def _make_source(name: str):
    def build(cfg: DataConfig) -> TaskData:
        return TaskData(name, cfg)

    build.__name__ = f"_{name.replace('-', '_')}"
    build.__doc__ = f"The synthetic {name!r} task (see orchestrator.engine.data.tasks)."
    register_source(name)(build)
    return build


for _name in TASKS:
    _make_source(_name)
