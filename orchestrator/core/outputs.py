"""Where a command writes, checked before it does any work (torch-free).

``lime eval``, ``export``, ``prune``, ``analyze`` and ``report`` compute for seconds to minutes and
log to MLflow before they write their files; an output that cannot be written (a file where a
folder is wanted, a folder on a read-only or foreign file system) must be one line before that
work, not a traceback after it. Each check finds the nearest folder that exists on the way to the
output and creates (and removes) a temporary file there: the only test that is true for every
user, root included (root passes ``os.access`` on ``/sys``, whose writes still fail).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from lime_arch.errors import ConfigError


def _writable(existing: Path, flag: str, shown: str) -> None:
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ConfigError(f"{flag}: cannot write under {str(existing)!r} ({e.strerror or type(e).__name__}); "
                          f"choose a folder you can write to (got {shown!r})") from None


def _given(path: str | Path, flag: str, kind: str) -> str:
    """The path as given; an empty one is a mistake (``Path("")`` is the working directory)."""
    shown = str(path)
    if not shown.strip():
        raise ConfigError(f"{flag}: empty; give the path of the {kind} to write")
    return shown


def _nearest(path: Path, flag: str, shown: str) -> Path:
    """``path`` or its nearest existing ancestor, which must be a folder."""
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag}: {str(parent)!r} is a file, so {shown!r} cannot be created under it")
            return parent
    return Path.cwd()


def check_out_folder(path: str | Path, flag: str, *, empty: bool = False) -> Path:
    """A folder the command will create (or write into): not an existing file, under a folder this
    process can write to; ``empty``: an existing folder must hold nothing (exports never overwrite)."""
    shown = _given(path, flag, "folder")
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{flag}: {shown!r} is an existing file; the command writes a folder there")
        if empty and any(p.iterdir()):
            raise ConfigError(f"{flag}: {shown!r} exists and is not an empty folder; exports never overwrite")
        _writable(p, flag, shown)
    else:
        _writable(_nearest(p.absolute().parent, flag, shown), flag, shown)
    return p


def check_out_file(path: str | Path, flag: str, *, own: tuple[str, str] | None = None) -> Path:
    """A file the command will write: not a folder, and its folder creatable and writable. An
    existing file is replaced only when it is the command's own earlier output: ``own`` is (the
    command, the start of the first line it writes); anything else there (a typo's target, a
    user's notes) is refused rather than overwritten."""
    shown = _given(path, flag, "file")
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"{flag}: {shown!r} is a folder; give the path of the file to write")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{flag}: {shown!r} exists and is not a regular file")
    if own is not None and p.is_file() and not _starts_with(p, own[1]):
        raise ConfigError(f"{flag}: {shown!r} is an existing file that {own[0]} did not write; give a new path "
                          f"(only an earlier output of {own[0]} is replaced)")
    _writable(_nearest(p.absolute().parent, flag, shown), flag, shown)
    return p


def _starts_with(p: Path, head: str) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(len(head.encode())).decode("utf-8", "replace") == head
    except OSError:
        return False
