"""mkdocs hook: a page's ``<!-- settings: module.Class [prefix] -->`` becomes the table of that settings
dataclass's fields (key, type, default, meaning, source), read from the source with ``ast`` and ``tokenize``, so
the documented settings are the code's and cannot drift.

The convention it reads (docs/contributing.md, "Style"): each field carries a trailing comment
``# <meaning>. Source: <where the default comes from>``; comment-only lines directly below the field continue it.
A field without a source is no config key (a nested group, which has its own table, or a field the CLI fills
in) and gets no row; tests/test_configs.py checks that every config key has one.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- settings: ([\w.]+)(?: ([\w.]+))? -->")


def field_comments(source: str) -> dict[int, str]:
    """Line number -> the comment text on that line (tokens, so a '#' inside a string is not a comment)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string.lstrip("#").strip()
    return found


def settings_rows(dotted: str) -> list[tuple[str, str, str, str, str]]:
    """(name, type, default, meaning, source) for each field of the dataclass ``dotted`` (``pkg.mod.Class``)."""
    module, _, cls_name = dotted.rpartition(".")
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    source = path.read_text()
    lines = source.splitlines()
    comments = field_comments(source)
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    rows = []
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        kind = ast.get_source_segment(source, node.annotation)
        if kind.startswith("ClassVar"):
            continue
        default = ast.get_source_segment(source, node.value) if node.value is not None else "required"
        text = [comments[node.end_lineno]] if node.end_lineno in comments else []
        below = node.end_lineno + 1  # comment-only lines directly below continue the field's comment
        while below <= len(lines) and lines[below - 1].strip().startswith("#"):
            text.append(comments[below])
            below += 1
        comment = " ".join(text)
        if "Source:" not in comment:  # not a config key: a nested group (its own table) or an internal field
            continue
        meaning, _, origin = comment.partition("Source:")
        rows.append((node.target.id, kind, default, meaning.strip().rstrip("."), origin.strip().rstrip(".")))
    return rows


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(dotted: str, prefix: str) -> str:
    out = ["| key | type | default | meaning | source |", "|---|---|---|---|---|"]
    for name, kind, default, meaning, origin in settings_rows(dotted):
        out.append(f"| `{prefix}{name}` | `{cell(kind)}` | `{cell(default)}` | {cell(meaning)} | {cell(origin)} |")
    return "\n".join(out) + f"\n\n<small>Generated from `{dotted}`.</small>\n"


def on_page_markdown(markdown: str, **_kwargs) -> str:
    return MARKER.sub(lambda m: table(m.group(1), m.group(2) or ""), markdown)
