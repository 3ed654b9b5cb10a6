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


# -- a policy whose env module is gone: it loads, shows and exports; only stepping the env imports ---------------
@pytest.fixture(scope="module")
def gone_run(tmp_path_factory) -> Path:
    """A policy trained on ``my_env:MyEnv`` beside the user (an LSTM core, so its state shape is recorded too),
    whose module is then deleted: nothing that loads the policy afterwards can import it."""
    home = tmp_path_factory.mktemp("gone") / "project"
    home.mkdir()
    (home / "my_env.py").write_text(MY_ENV)
    res = _python("-m", "rltrain", "env.id=my_env:MyEnv", *TINY, "model.core=lstm", "model.core_size=8",
                  "hydra.run.dir=out", cwd=home)
    assert _finished(res, home / "out")["status"] == "completed"
    (home / "my_env.py").unlink()
    return home / "out"


def _crafted(run_dir: Path, dest: Path, edit) -> Path:
    import torch

    state = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=True)
    edit(state["meta"])
    torch.save(state, dest)
    return dest


def test_a_policy_whose_env_module_is_gone_loads_acts_and_exports(gone_run, tmp_path):
    import numpy as np
    import torch

    import rltrain

    policy = rltrain.load_policy(gone_run)
    assert "my_env" not in sys.modules and policy.spec.env_id == "my_env:MyEnv" and policy.recurrent
    action, state = policy.act(np.zeros(4, np.float32))
    recorded = torch.load(gone_run / "checkpoints" / "final.pt", weights_only=True)["meta"]["spaces"]["core_state"]
    assert action in (0, 1) and [list(t.shape) for t in state] == recorded and recorded[0] == [1, 1, 8]
    res = _python("-m", "rltrain.cli.export", str(gone_run), "--out", str(tmp_path / "policy.pt2"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((tmp_path / "policy.json").read_text())["state"]["names"] == ["h", "c"]


def test_rltrain_eval_shows_the_policy_and_steps_its_env_only_when_allowed(gone_run, tmp_path):
    shown = _python("-m", "rltrain.cli.evaluate", str(gone_run), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "env.id=my_env:MyEnv" in shown.stdout and "episodes: none run" in shown.stdout
    assert "--allow-import" in shown.stdout
    asked = _python("-m", "rltrain.cli.evaluate", str(gone_run), "--episodes", "2", cwd=tmp_path)
    assert asked.returncode == 2 and len(asked.stderr.strip().splitlines()) == 1, asked.stderr
    assert "env.id=my_env:MyEnv inside it names a module to import to step the env" in asked.stderr
    assert "pass --allow-import" in asked.stderr
    allowed = _python("-m", "rltrain.cli.evaluate", str(gone_run), "--episodes", "2", "--allow-import", cwd=tmp_path)
    assert allowed.returncode == 2 and "cannot import 'my_env'" in allowed.stderr, allowed.stderr  # only now


def test_the_opt_in_is_named_as_the_caller_spells_it(gone_run, tmp_path):
    """A module the network needs (``model.imports``), or the env of a checkpoint older than its recorded
    spaces: Python callers read ``allow_import=True``, command-line users ``--allow-import``."""
    import rltrain
    from rltrain.errors import ConfigError

    imports = _crafted(gone_run, tmp_path / "imports.pt",
                       lambda meta: meta["config"]["model"].update(imports=["my_encoders"]))
    with pytest.raises(ConfigError, match="model.imports entry my_encoders") as err:
        rltrain.load_policy(imports)
    assert "pass allow_import=True" in str(err.value) and "--allow-import" not in str(err.value)
    res = _python("-m", "rltrain.cli.export", str(imports), "--out", str(tmp_path / "p.pt2"), cwd=tmp_path)
    assert res.returncode == 2 and "pass --allow-import" in res.stderr, res.stderr

    older = _crafted(gone_run, tmp_path / "older.pt", lambda meta: meta.pop("spaces"))
    with pytest.raises(ConfigError, match="written before checkpoints recorded their spaces") as err:
        rltrain.load_policy(older)
    assert "env.id=my_env:MyEnv" in str(err.value) and "pass allow_import=True" in str(err.value)
    newer = _crafted(gone_run, tmp_path / "newer.pt", lambda meta: meta["spaces"].update(format=99))
    with pytest.raises(ConfigError, match=r"recorded in format 99 by rltrain \S+; rltrain \S+ reads formats 1, 2"):
        rltrain.load_policy(newer)


SCRIPT_ENV = '''
import gymnasium as gym
import numpy as np
import rltrain


class Seek(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action), False, self.t >= 10, {}


if __name__ == "__main__":
    result = rltrain.train(["algo=ppo", "env.id=__main__:Seek", "total_env_steps=512", "algo.rollout_len=64",
                            "eval.episodes=2", "logger=quiet"], run_dir="runs/seek")
    print("evaluated", rltrain.evaluate("runs/seek", episodes=2, allow_import=True).mean)
'''


def test_an_env_defined_in_the_training_script_is_said_to_need_that_script(tmp_path):
    """env.id=__main__:Seek trains and evaluates in the script that defines Seek; the start line says only such a
    script can evaluate or resume the run, and rltrain-eval (another program) names why it cannot build it."""
    (tmp_path / "train_it.py").write_text(SCRIPT_ENV)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "train_it.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "evaluated " in res.stdout  # rltrain.evaluate in the script that defines Seek builds it
    assert ("[rltrain] env.id=__main__:Seek is defined in the running script: only a script that defines it can "
            "evaluate or resume this run (rltrain.evaluate(..., allow_import=True) there") in res.stdout, res.stdout
    other = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", "runs/seek", "--allow-import"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "__main__ is the running program" in other.stderr and "env.id=my_envs:Seek" in other.stderr
