"""The references in docs/ are the schema's: every key a sweep file or a trial config accepts has
its row in docs/SWEEPS.md or docs/CONFIG.md, and every documented key is one the schema accepts.
The blocks are found by walking the schema's dataclasses, so a new block or key fails here until
it is documented."""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from lime_arch.config import ModelConfig
from orchestrator.engine.trial_config import TrialConfig
from orchestrator.sweep.schema import SweepSpec

ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^## (?:`(?P<block>[a-z_.]+)`|(?P<top>Top level))\s*$")
ROW = re.compile(r"^\| `(?P<key>[a-z_][a-z0-9_]*)` \|")


def documented(doc: Path) -> dict[str, set[str]]:
    """Block ("" for the top level) -> the keys of its table."""
    out: dict[str, set[str]] = {}
    block = None
    for line in doc.read_text().splitlines():
        m = HEADING.match(line)
        if m:
            block = "" if m.group("top") else m.group("block")
            out.setdefault(block, set())
        elif line.startswith("## "):
            block = None
        elif block is not None and (r := ROW.match(line)):
            out[block].add(r.group("key"))
    return out


def _dataclass_of(tp) -> type | None:
    """The dataclass a field's annotation holds (through Annotated, Optional, unions)."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (dict, list):
        return None  # a mapping of names (search.space) or a list: no block of fixed keys
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Annotated:
        args = args[:1]  # the type, not its metadata
    for arg in args:
        found = _dataclass_of(arg)
        if found is not None:
            return found
    return None


def schema(cls: type, prefix: str = "", extra: dict[str, type] | None = None) -> dict[str, set[str]]:
    """Block -> the keys a file may write there (fields the file sets: ``init=True``)."""
    resolved = getattr(cls, "__pydantic_fields__", {})  # pydantic resolved the annotations
    hints = {} if resolved else typing.get_type_hints(cls)  # a plain dataclass's (string) annotations
    fields = [f for f in dataclasses.fields(cls) if f.init]
    out = {prefix.rstrip("."): {f.name for f in fields}}
    for f in fields:
        tp = resolved[f.name].annotation if f.name in resolved else hints.get(f.name, f.type)
        sub = (extra or {}).get(f.name) or _dataclass_of(tp)
        if sub is not None and not isinstance(sub, types.GenericAlias):
            out.update(schema(sub, f"{prefix}{f.name}."))
    return out


CASES = [("docs/SWEEPS.md", schema(SweepSpec)),
         ("docs/CONFIG.md", schema(TrialConfig, extra={"model": ModelConfig}))]


@pytest.mark.parametrize(("doc", "keys"), CASES, ids=[c[0] for c in CASES])
def test_every_key_is_documented_and_every_documented_key_exists(doc, keys):
    have = documented(ROOT / doc)
    missing_blocks = sorted(b or "(top level)" for b in keys if b not in have)
    assert not missing_blocks, f"{doc}: no section for block(s) {missing_blocks}"
    for block, want in keys.items():
        got = have[block]
        assert got == want, (f"{doc}, {block or 'top level'}: undocumented {sorted(want - got)}, "
                             f"documented but not in the schema {sorted(got - want)}")
    extra = sorted(b for b in have if b not in keys)
    assert not extra, f"{doc}: sections for blocks the schema does not have: {extra}"


def test_the_check_can_fail(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("## Top level\n| `name` | x |\n| `ghost` | y |\n## `report`\n| `metric` | z |\n## Other\n| `no` |\n")
    assert documented(doc) == {"": {"name", "ghost"}, "report": {"metric"}}


def test_readme_points_to_files_that_exist():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links, "README.md links nowhere"
    missing = [p for p in links if not p.startswith("http") and not (ROOT / p).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
