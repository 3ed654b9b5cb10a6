"""CI installs exactly what the README says: the same pip commands, so a green CI cannot hide an install step."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _pip_installs(text: str) -> list[str]:
    return [re.sub(r"\s+-q\b", "", m).split("#")[0].strip() for m in re.findall(r"^\s*(pip install[^\n]*)", text, re.M)]


def test_ci_installs_what_the_readme_says():
    readme = (REPO / "README.md").read_text()
    install = readme[readme.index("## Install and test"):readme.index("## Architecture")]
    assert _pip_installs((REPO / ".ci" / "run").read_text()) == _pip_installs(install)
