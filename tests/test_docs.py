"""Every file path the README cites exists in a checkout (a reader follows them to the code)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("rltrain/", "scripts/", "tests/", "docs/", ".ci/", "hydra_plugins/")


def cited_paths(text: str) -> set[str]:
    found = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        path = token.split(":", 1)[0].rstrip("/")
        if path.startswith(ROOTS) and not re.search(r"[<>*{}]", path):
            found.add(path)
    return found


def test_every_path_the_readme_cites_exists():
    cited = cited_paths((REPO / "README.md").read_text())
    assert len(cited) > 10  # the README does cite code; an empty set would mean the pattern broke
    missing = sorted(p for p in cited if not (REPO / p).exists())
    assert missing == []


def test_the_path_finder_sees_a_missing_path():
    assert cited_paths("see `rltrain/nowhere.py` and `rltrain/conf/algo/<name>.yaml`") == {"rltrain/nowhere.py"}
