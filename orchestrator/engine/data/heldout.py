"""The held-out side of a corpus: which validation windows the loss is measured on, and the
near-duplicate documents that would leak training text into them.

Validation windows (``window_starts``). The corpora (builtin, text, hf) keep their held-out
documents as one stream of token ids (documents joined by EOS, as in training). The validation
set is ``data.val_tokens // seq_len`` windows of ``seq_len`` targets, their starts spread evenly
from the first token of the stream to the last full window, so every stretch of the held-out text
is read in proportion to its length (the distribution training samples from), every held-out
document longer than the spacing between windows has windows inside it, and no two windows share
a target. A stream shorter than ``val_tokens`` is read whole (its non-overlapping windows). The
windows depend only on the held-out stream, ``seq_len`` and ``val_tokens``: the same for every
variant and seed. Reading only the first windows of the stream, as an earlier version did, scored
four documents, half of them one ASCII table.

Near duplicates (``drop_near_duplicates``). CPython's topics repeat themselves: ``typesseq-mutable``
is a section of ``typesseq``, ``if`` and ``else`` are the same text. A held-out document whose text
is in a training document is not held out; the builtin corpus drops every document at least half
of whose characters (in lines of ``MIN_LINE`` or more characters) are lines of a longer document
kept before it (466k -> 373k characters, 79 -> 57 documents).
"""
from __future__ import annotations

from lime_arch import ConfigError

MIN_LINE = 30  # shorter lines ("Example:", blank, rules of a table) repeat by chance
SHARE = 0.5  # a document with at least this share of its long-line characters seen already is a duplicate


def window_starts(n_tokens: int, seq: int, val_tokens: int, name: str = "corpus") -> list[int]:
    """Start positions (in a held-out stream of ``n_tokens`` ids) of the validation windows:
    ``seq + 1`` ids each (``seq`` inputs, ``seq`` targets shifted by one), spread evenly, targets
    disjoint; as many as ``val_tokens // seq`` (at least one) or as the stream holds."""
    room = (n_tokens - 1) // seq  # windows with disjoint targets that fit
    if room < 1:
        raise ConfigError(f"data: the {name} validation split ({n_tokens} tokens) is shorter than "
                          f"train.seq_len={seq}")
    k = min(max(1, val_tokens // seq), room)
    last = n_tokens - 1 - seq  # the last start whose seq + 1 ids fit
    if k == 1:
        return [last // 2]
    # spacing last / (k - 1) >= seq because k <= room, and rounding keeps integer gaps >= seq
    return [round(i * last / (k - 1)) for i in range(k)]


def _long_lines(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if len(s) >= MIN_LINE]


def drop_near_duplicates(texts: list[str]) -> list[str]:
    """``texts`` in their order without the near duplicates: longest first, a document is dropped
    when at least ``SHARE`` of its long-line characters are lines of a document kept already."""
    seen: set[str] = set()
    keep: set[int] = set()
    for i in sorted(range(len(texts)), key=lambda j: (-len(texts[j]), j)):
        lines = _long_lines(texts[i])
        total = sum(map(len, lines))
        repeated = sum(len(s) for s in lines if s in seen)
        if texts[i] in (texts[j] for j in keep) or (total and repeated >= SHARE * total):
            continue
        keep.add(i)
        seen.update(lines)
    return [t for i, t in enumerate(texts) if i in keep]
