"""An env module beside the user: ``env.id=my_env:MyEnv`` (a class) and ``my_env:make`` (a function) with
``my_env.py`` in the directory ``rltrain`` is launched from, no PYTHONPATH, whatever the working directory
becomes (``hydra.job.chdir=true``) and in processes that start elsewhere (spawned actors; ``rltrain-eval``
run from another directory reads the launch directory recorded in the run's config).

``rltrain`` runs as a real subprocess under ``python -P`` so that, as with the console script, the launch
directory is not on ``sys.path`` by itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

MY_ENV = '''
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class MyEnv(CartPoleEnv):
    """CartPole under the user's own name."""


def make(length: int = 40):
    return gym.wrappers.TimeLimit(MyEnv(), length)
'''

TINY = ["debug=smoke", "logger=quiet", "total_env_steps=256", "env.num_envs=2", "algo.rollout_len=32",
        "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]


def _python(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    # rltrain itself comes from this checkout; the user's directory must come from env.search_path alone
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-P", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    home = tmp_path / "project"
    home.mkdir()
    (home / "my_env.py").write_text(MY_ENV)
    return home


def _finished(res: subprocess.CompletedProcess, run_dir: Path) -> dict:
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads((run_dir / "summary.json").read_text())


def test_a_class_beside_the_user_trains_after_hydra_changes_directory(user_dir):
    res = _python("-m", "rltrain", "env.id=my_env:MyEnv", *TINY, "hydra.run.dir=out", "hydra.job.chdir=true",
                  cwd=user_dir)
    run_dir = user_dir / "out"
    assert _finished(res, run_dir)["status"] == "completed"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["env"]["search_path"] == str(user_dir)

    # another process in another directory finds the module through the recorded launch directory
    elsewhere = user_dir.parent / "elsewhere"
    elsewhere.mkdir()
    res = _python("-m", "rltrain.cli.evaluate", str(run_dir), "--episodes", "1", "--allow-import", cwd=elsewhere)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_function_beside_the_user_trains_under_spawned_actors(user_dir):
    res = _python("-m", "rltrain", "env.id=my_env:make", "+env.kwargs.length=30", "algo=impala", *TINY,
                  "trainer=subprocess_actors", "trainer.num_actors=1", "trainer.start_method=spawn",
                  f"hydra.run.dir={user_dir / 'out'}", cwd=user_dir, timeout=600)
    summary = _finished(res, user_dir / "out")
    assert summary["status"] == "completed" and summary["total_env_steps"] >= 256


def test_a_missing_module_names_where_it_was_looked_for(user_dir):
    res = _python("-m", "rltrain", "env.id=my_envv:MyEnv", *TINY, "hydra.run.dir=out", cwd=user_dir)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert f"no my_envv.py or my_envv/ in the launch directory {user_dir}" in lines[0]
    assert "installed packages" in lines[0] and "install it" not in lines[0] and "pip install" not in lines[0]


def test_a_module_that_fails_inside_names_its_own_error(user_dir):
    (user_dir / "broken_env.py").write_text("import no_such_simulator_pkg\n")
    res = _python("-m", "rltrain", "env.id=broken_env:Env", *TINY, "hydra.run.dir=out", cwd=user_dir)
    assert res.returncode == 2
    assert "cannot import 'broken_env': it imports 'no_such_simulator_pkg', which is not installed" in res.stderr


def test_rltrain_check_finds_the_module_beside_the_user(user_dir):
    res = _python("-m", "rltrain.cli.check", "env.id=my_env:MyEnv", *TINY, cwd=user_dir)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "error" not in res.stdout.lower()
