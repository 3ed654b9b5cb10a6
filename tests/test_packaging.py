"""A non-editable ``pip install .`` finds its configs (they ship inside the wheel)."""

from __future__ import annotations

import site
import subprocess
import sys

import pytest

from tests.conftest import REPO


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
