"""The console entry points answer fast and truthfully: versions, help without the heavy imports."""

from __future__ import annotations

import subprocess
import sys

import rltrain


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_version_is_rltrains(cli):
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rltrain {rltrain.__version__}", out.stdout + out.stderr


def test_installed_version_matches_the_package():
    from importlib.metadata import version

    assert version("rltrain") == rltrain.__version__


def test_eval_help_does_not_import_torch():
    code = ("import sys; sys.argv = ['rltrain-eval', '--help']\n"
            "from rltrain.cli.evaluate import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print('torch' in sys.modules, code)")
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert "usage: rltrain-eval" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "False 0"
