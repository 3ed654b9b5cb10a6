"""A non-editable ``pip install .`` finds its configs (they ship inside the wheel); the extras agree."""

from __future__ import annotations

import re
import site
import subprocess
import sys

import pytest

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (3.10 has no TOML reader built in)


@pytest.mark.slow
def test_wheel_install_finds_configs(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # dependencies come from this environment (no network, no second torch); rltrain itself is built and
    # installed as a regular wheel, not editable
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(f"{purelib}/_deps.pth", "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(REPO)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(py), "-c", "import rltrain, sys; print(rltrain.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True).stdout
    assert str(venv) in where, where  # the installed copy, not the source tree
    res = subprocess.run([str(venv / "bin" / "rltrain"), "debug=smoke", "total_env_steps=512", "logger=quiet"],
                         cwd=work, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert list(work.glob("outputs/runs/*/*/summary.json"))
    res = subprocess.run([str(venv / "bin" / "rltrain"), "--help"], cwd=work, capture_output=True, text=True)
    assert "env: acrobot, atari, cartpole" in res.stdout and "model: default" in res.stdout  # groups ship too


PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# distributions that install the same import name over each other's files: an install may name one of each set
SAME_MODULE = [{"pygame", "pygame-ce"}, {"opencv-python", "opencv-python-headless", "opencv-contrib-python"}]
# what our extras pull in through other packages' extras (gymnasium[box2d] and [classic-control] ask pygame-ce)
VIA_EXTRAS = {"gymnasium[box2d]": {"pygame-ce"}, "gymnasium[classic-control]": {"pygame-ce"}}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _distributions(requirements: list[str]) -> set[str]:
    names = set()
    for req in requirements:
        names.add(_name(req))
        for pattern, pulled in VIA_EXTRAS.items():
            if req.replace(" ", "").lower().startswith(pattern):
                names |= pulled
    return names


def test_every_extra_names_the_same_pygame_and_opencv():
    every = {n for reqs in EXTRAS.values() for n in _distributions(reqs)}
    for clash in SAME_MODULE:
        assert len(every & clash) <= 1, sorted(every & clash)
    assert "pygame-ce" in _distributions(EXTRAS["video"])  # eval videos render classic-control envs


def test_the_all_extra_covers_every_feature_extra():
    (line,) = EXTRAS["all"]
    assert _name(line) == "rltrain"
    named = set(re.search(r"\[(.*)\]", line).group(1).split(","))
    assert named == set(EXTRAS) - {"all", "dev", "docs"}  # the tools to test and to build the docs are not features


def test_the_docs_name_every_extra():
    page = (REPO / "docs" / "getting-started.md").read_text()  # its extras table
    missing = sorted(e for e in EXTRAS if f"`{e}`" not in page and f"rltrain[{e}]" not in page)
    assert missing == []
