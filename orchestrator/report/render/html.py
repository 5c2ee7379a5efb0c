"""The report as one self-contained HTML file, ``report.html`` beside ``report.md``.

MLflow's artifact viewer shows a markdown artifact as text with its images as literal
``![caption](x.png)``; an HTML artifact it renders, in a sandboxed frame that loads nothing from
elsewhere. So the HTML carries everything: a small stylesheet and every PNG the markdown refers
to, embedded as a ``data:image/png;base64`` URI. It is made from ``report.md`` itself (one source
of truth) by a converter of the markdown subset that ``orchestrator.report.render.sections`` writes:
``#`` headings, paragraphs, ``- `` lists, pipe tables, fenced code blocks, images alone on a line,
``**bold**``, ```code``` and ``[links](url)``. Deterministic, like the markdown: the same report
gives the same bytes.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328;
       max-width: 1100px; margin: 24px auto; padding: 0 16px; }
h1, h2, h3 { line-height: 1.25; margin: 1.2em 0 0.5em; }
h1 { font-size: 1.8em; } h2 { font-size: 1.4em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
table { border-collapse: collapse; margin: 0.6em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; white-space: nowrap; }
th { background: #f6f8fa; } tr:nth-child(even) td { background: #fbfcfd; }
code { background: #f6f8fa; padding: 0 3px; border-radius: 3px; font-size: 90%; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; } pre code { background: none; padding: 0; }
img { max-width: 100%; } figure { margin: 0.8em 0; } figcaption { color: #59636e; font-size: 90%; }
""".strip()

_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)$")
_ROW = re.compile(r"^\|.*\|$")
_RULE = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")


def write_html(md_path: Path, title: str) -> Path:
    """``report.html`` beside ``md_path``, with the images it refers to embedded."""
    md_path = Path(md_path)
    out = md_path.with_suffix(".html")
    out.write_text(to_html(md_path.read_text(), md_path.parent, title))
    return out


def to_html(md: str, folder: Path, title: str) -> str:
    body = "\n".join(_blocks(md.splitlines(), Path(folder)))
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_esc(title)}</title>\n'
            f"<style>\n{STYLE}\n</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def _blocks(lines: list[str], folder: Path) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            j = _until(lines, i + 1, lambda s: s.startswith("```"))
            lang = line[3:].strip()
            cls = f' class="language-{_esc(lang)}"' if lang else ""
            out.append(f"<pre><code{cls}>" + _esc("\n".join(lines[i + 1:j])) + "</code></pre>")
            i = j + 1
        elif m := re.match(r"^(#{1,6}) (.*)$", line):
            n = len(m.group(1))
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
            i += 1
        elif m := _IMAGE.match(line.strip()):
            out.append(_figure(m.group("alt"), m.group("src"), folder))
            i += 1
        elif _ROW.match(line.strip()):
            j = _until(lines, i, lambda s: not _ROW.match(s.strip()))
            out.append(_table(lines[i:j]))
            i = j
        elif line.startswith("- "):
            j = _until(lines, i, lambda s: not s.startswith(("- ", "  ")) or not s.strip())
            items = re.split(r"\n(?=- )", "\n".join(lines[i:j]))
            out.append("<ul>\n" + "\n".join(f"<li>{_inline(' '.join(x[2:].split()))}</li>" for x in items)
                       + "\n</ul>")
            i = j
        else:
            j = _until(lines, i, lambda s: not s.strip() or s.startswith(("#", "```", "- ", "|", "![")))
            out.append(f"<p>{_inline(' '.join(s.strip() for s in lines[i:max(j, i + 1)]))}</p>")
            i = max(j, i + 1)
    return out


def _until(lines: list[str], start: int, stop) -> int:
    """The index of the first line at or after ``start`` where ``stop`` holds (len(lines) if none)."""
    return next((k for k in range(start, len(lines)) if stop(lines[k])), len(lines))


def _cells(row: str) -> list[str]:
    inner = row.strip()[1:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def _table(rows: list[str]) -> str:
    head, body = rows[0], rows[1:]
    if body and _RULE.match(body[0].strip()):
        body = body[1:]
    th = "".join(f"<th>{_inline(c)}</th>" for c in _cells(head))
    trs = "\n".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(r)) + "</tr>" for r in body)
    return f"<table>\n<thead><tr>{th}</tr></thead>\n<tbody>\n{trs}\n</tbody>\n</table>"


def _figure(alt: str, src: str, folder: Path) -> str:
    """An image as a data URI (a file the report does not have stays a link, with a note)."""
    path = folder / src
    if "/" in src or not path.is_file():
        return f'<p><a href="{_esc(src)}">{_esc(alt or src)}</a> (image not found beside the report)</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    kind = "png" if path.suffix.lower() == ".png" else path.suffix.lower().lstrip(".")
    return (f'<figure><img alt="{_esc(alt)}" src="data:image/{kind};base64,{data}">'
            f"<figcaption>{_esc(alt)}</figcaption></figure>")


def _inline(text: str) -> str:
    """Escape, then code spans (kept verbatim), bold, links; ``\\|`` in a table cell is ``|``."""
    parts = re.split(r"(`[^`]*`)", text.replace("\\|", "|"))
    out = []
    for k, part in enumerate(parts):
        if k % 2:
            out.append(f"<code>{_esc(part[1:-1])}</code>")
            continue
        s = _esc(part)
        s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
        s = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', s)
        out.append(s)
    return "".join(out)


def _esc(s: str) -> str:
    return html.escape(s, quote=True)
