"""Which ``lime_arch`` a model was made with, and whether the installed one is the same code.

An export (``orchestrator.export``) runs this project's decoder from whatever ``lime_arch`` is
importable where it is loaded, so a later change to the model code (a fixed Sinkhorn order, say)
silently changes an old export's logits. The export therefore records ``code_version()``: the git
commit of the repository ``lime_arch`` was imported from (informative; "unknown" outside a
checkout) and the sha256 of ``lime_arch``'s own source files (what decides: it also sees
uncommitted edits and installs without git). ``check(recorded)`` compares a record with the
installed package and words the mismatch as one line; ``LimeForCausalLM`` raises it as a
``LimeCodeVersionWarning`` on load (a warning, not an error: most changes leave a given model's
logits alone; ``warnings.simplefilter("error", LimeCodeVersionWarning)`` makes it strict).

Torch-free (hashing files and one ``git`` call).
"""
from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


class LimeCodeVersionWarning(UserWarning):
    """An exported model is loaded with other ``lime_arch`` code than it was made with."""


@functools.cache
def source_digest() -> str:
    """sha256 over ``lime_arch``'s ``.py`` files (their paths relative to the package and their
    bytes, in path order)."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(p.relative_to(PACKAGE).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def git_commit() -> str:
    """The 12-character commit of the checkout ``lime_arch`` lives in ("unknown" outside one)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=PACKAGE, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def code_version() -> dict[str, str]:
    """What an export records: ``{"commit": ..., "source_sha256": ...}`` of the running ``lime_arch``."""
    return {"commit": git_commit(), "source_sha256": source_digest()}


def check(recorded: dict | None) -> str | None:
    """None when ``recorded`` (an export's ``code_version()``) is the installed ``lime_arch``'s
    source; otherwise the one-line reason."""
    now = code_version()
    if not isinstance(recorded, dict) or not recorded.get("source_sha256"):
        return (f"this export records no lime_arch version (made before exports recorded one): the installed "
                f"lime_arch (commit {now['commit']}) may compute other logits than the model was trained with")
    if recorded["source_sha256"] == now["source_sha256"]:
        return None
    was = recorded.get("commit") or "unknown"
    return (f"this export was made with lime_arch commit {was} (source sha256 {recorded['source_sha256'][:12]}) but "
            f"the installed lime_arch is commit {now['commit']} (source sha256 {now['source_sha256'][:12]}): its "
            f"logits may differ from the trained model's; install lime_arch at commit {was} to load it as exported")
