"""The README is followable: every repo path it cites exists, and every rltrain command it names answers --help."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (3.10 has no TOML reader built in)

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("rltrain/", "scripts/", "tests/", "docs/", ".ci/", "hydra_plugins/")
# a path relative to the package's own folder (`conf/logger/...`) is a path a reader cannot open from the clone
PACKAGE_RELATIVE = ("conf/", "cli/", "run/", "trainers/", "algos/", "envs/", "models/")


def code_spans(text: str) -> list[str]:
    """The text of every fenced code block and every inline `code` span."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return blocks + re.findall(r"`([^`\n]+)`", rest)


def cited_paths(text: str) -> set[str]:
    """Repo paths named in code (``rltrain/x.py:42`` -> ``rltrain/x.py``); templates (``<name>``, ``*``) skipped."""
    found = set()
    for span in code_spans(text):
        for token in re.split(r"[\s()\[\],;'\"=]+", span):
            path = token.split(":", 1)[0].rstrip("/.")
            if path.startswith(ROOTS + PACKAGE_RELATIVE) and not re.search(r"[<>*{}|$]", path):
                found.add(path)
    return found


def named_commands(text: str) -> set[str]:
    """``rltrain`` and ``rltrain-<name>`` as commands in code (not ``.rltrain-key``, not ``rltrain/`` paths)."""
    found = set()
    for span in code_spans(text):
        found |= set(re.findall(r"(?<![\w./\[-])(rltrain(?:-[a-z]+)?)(?![\w./\]\[-])", span))
    return found


def test_every_path_the_readme_cites_exists():
    cited = cited_paths((REPO / "README.md").read_text())
    assert len(cited) > 10  # the README does cite code; an empty set would mean the pattern broke
    missing = sorted(p for p in cited if not (REPO / p).exists())
    assert missing == []


def test_the_path_finder_sees_a_missing_path():
    text = ("see `rltrain/nowhere.py` and `rltrain/conf/algo/<name>.yaml`; keys in `conf/logger/wandb.yaml`\n"
            "```bash\npython scripts/absent.py --help\n```\n")
    assert cited_paths(text) == {"rltrain/nowhere.py", "conf/logger/wandb.yaml", "scripts/absent.py"}


def test_the_command_finder_skips_paths_and_files():
    text = "`rltrain-eval RUN`, `<run dir>/.rltrain-key`, `rltrain/cli/x.py`, `pip install 'rltrain[wandb]'`"
    assert named_commands(text) == {"rltrain-eval"}


SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_command_the_readme_names_is_installed():
    named = named_commands((REPO / "README.md").read_text())
    assert {"rltrain", "rltrain-eval", "rltrain-report"} <= named
    assert sorted(named - set(SCRIPTS)) == []


@pytest.mark.parametrize("command", sorted(named_commands((REPO / "README.md").read_text())))
def test_every_command_the_readme_names_answers_help(command, tmp_path):
    module, _, func = SCRIPTS[command].partition(":")
    code = f"import sys; sys.argv[0] = {command!r}; from {module} import {func}; {func}()"
    res = subprocess.run([sys.executable, "-c", code, "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert command in res.stdout or "== Config ==" in res.stdout, res.stdout  # its own help, not a crash
    assert "Traceback" not in res.stderr
