"""The trial's tokenizer as a Hugging Face fast tokenizer (``tokenizer.json`` and its config).

- The byte tokenizer (UTF-8 bytes, ids 0-255, EOS 256) has no file of its own: it is written as a
  byte-level BPE without merges whose 256 tokens are GPT-2's printable stand-ins for the bytes
  (``bytes_to_unicode``) with id = byte value, plus ``<|endoftext|>`` = 256. Encoding a text gives
  exactly its UTF-8 bytes, as the project's ``ByteTokenizer`` does, also where the text spells a
  special token: the literal ``<|endoftext|>`` is its 13 bytes, never id 256 (transformers'
  ``split_special_tokens``, saved in ``tokenizer_config.json``); decoding joins the bytes back.
- A BPE trained by the trial, GPT-2's, a hub tokenizer or a ``tokenizer.json``: already a
  ``tokenizers`` tokenizer, saved as it is, with its EOS token named.
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.engine.data.corpus import ByteTokenizer

EOS = "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters (printable ASCII and
    Latin-1 map to themselves, the rest to U+0100 onwards, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_tokenizer():
    """A ``tokenizers.Tokenizer`` that encodes text to its UTF-8 bytes (see the module)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])  # id 256, the byte tokenizer's EOS
    return tok


def save_tokenizer(tokenizer, folder: Path, max_length: int) -> list[Path]:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` of the trial's
    tokenizer in ``folder``."""
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, ByteTokenizer):
        # the project reads text as bytes only: EOS is an id the data pipeline appends, never text
        tok, eos, split = byte_tokenizer(), EOS, True
    else:
        # a tokenizers tokenizer matches its special tokens in text, in the project as here
        tok, split = tokenizer.tok, False
        eos = tok.id_to_token(tokenizer.eos_id)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=None,
                                   model_max_length=max_length, split_special_tokens=split)
    fast.save_pretrained(str(folder))
    return sorted(p for p in folder.iterdir() if p.name.startswith(("tokenizer", "special_tokens")))
