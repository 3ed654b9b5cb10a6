"""CI installs and tests exactly as the README says: the same install command (into its own fresh venv), the
same test commands, and it builds the documentation site strictly. A green CI cannot hide an install step."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()
INSTALL = (REPO / "scripts" / "install.sh").read_text()


def commands(text: str) -> list[str]:
    """Each non-comment command line, its trailing comment dropped."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def test_the_readme_sets_up_with_one_command_and_ci_runs_that_command():
    readme_install = [c for c in commands(README) if "scripts/install.sh" in c]
    assert readme_install and readme_install[0].startswith("bash scripts/install.sh")
    ci_install = [c for c in commands(CI) if "scripts/install.sh" in c]
    assert ci_install == ["bash scripts/install.sh .ci-venv"]  # the README's command, into CI's fresh venv


def test_ci_runs_the_readme_test_commands():
    main_suite = 'python -m pytest -q -n 2 -m "not slurm and not gpu and not ray"'
    ray_step = 'python -m pytest -q -m "ray and not slurm"'
    assert main_suite in README and ray_step in README
    ci = commands(CI)
    assert any(c.startswith(main_suite) for c in ci)
    assert any(c.startswith(ray_step) for c in ci)


def test_ci_builds_the_docs_strictly_and_checks_style():
    assert "mkdocs build --strict" in commands(CI)
    assert "ruff check ." in commands(CI)


def test_the_install_script_pins_the_cpu_torch_first_then_every_extra():
    pips = [c for c in commands(INSTALL) if "pip install" in c]
    assert len(pips) == 2
    assert pips[0].endswith("pip install -q torch==2.13.0")
    assert pips[1].endswith('pip install -q -e ".[all,dev,docs]"')
