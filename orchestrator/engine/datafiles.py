"""The ``text`` source's files, checked before any compute (torch-free: sweep validation and the dry
run call it): every path or glob matches a file, and every file is non-empty UTF-8 text.

A binary file (an image, a checkpoint, a zip matched by ``notes/*``) would otherwise be decoded
with replacement characters and trained on without a word; an empty one would silently count as
a document. What is read: the first ``SAMPLE`` bytes of each file (a NUL byte or a byte sequence
that is not UTF-8 there makes it binary), once per file and modification time in a process.
"""
from __future__ import annotations

import codecs
import glob
import os

from lime_arch.errors import ConfigError

SAMPLE = 1 << 16  # bytes read from the start of each file
KEY = "data.paths"
_checked: dict[tuple[str, int, int], str | None] = {}  # (path, size, mtime_ns) -> the problem, None if fine


def expand(paths: list[str]) -> list[str]:
    """The files ``paths`` (files or globs; ``~`` expanded) name, in order; a pattern matching no
    file, or a matched file that is empty or not text: one ConfigError line naming it."""
    files: list[str] = []
    for p in paths:
        hits = sorted(h for h in glob.glob(os.path.expanduser(p), recursive=True) if os.path.isfile(h))
        if not hits:
            raise ConfigError(f"{KEY}: no file matches {p!r}")
        for h in hits:
            problem = text_problem(h)
            if problem:
                raise ConfigError(f"{KEY}: {h} {problem}; the text source reads non-empty UTF-8 text files"
                                  + (f" (matched by {p!r})" if h != os.path.expanduser(p) else ""))
        files.extend(hits)
    return files


def text_problem(path: str) -> str | None:
    """Why ``path`` is no text file to train on ("is empty", "is not a text file (...)"), or None."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _checked:
        _checked[key] = _problem(path, st.st_size)
    return _checked[key]


def _problem(path: str, size: int) -> str | None:
    if size == 0:
        return "is empty"
    try:
        with open(path, "rb") as f:
            head = f.read(SAMPLE)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    nul = head.find(b"\0")
    if nul >= 0:
        return f"is not a text file (byte {nul} is a NUL byte)"
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:  # final only when the whole file was read: a sample may end inside a character
        decoder.decode(head, final=len(head) >= size)
    except UnicodeDecodeError as e:
        return f"is not a text file (byte {e.start} is not UTF-8)"
    if len(head) >= size and not head.strip():
        return "holds only whitespace"
    return None
