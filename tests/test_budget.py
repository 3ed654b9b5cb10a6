"""``total_env_steps`` means one thing under every trainer: the env steps of all envs and all workers together
(ranks, actors, agents); ``rltrain-check`` and the summary say so."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from tests.conftest import run_cli

TINY = ["debug=smoke", "logger=quiet", "eval.episodes=1", "eval.every_env_steps=0", "checkpoint.every_env_steps=0",
        "env.num_envs=2", "algo.rollout_len=32", "total_env_steps=1024", "hydra.run.dir=run"]
# each row: the trainer, and the env steps one update of it consumes (a run ends within one update of its budget)
TRAINERS = [
    (["trainer=sequential"], 64),
    (["trainer=distributed_simulator", "trainer.world_size=2"], 128),
    (["trainer=subprocess_actors", "trainer.num_actors=2"], 128),
    (["trainer=parallel", "trainer.num_agents=2"], 64),
]


@pytest.mark.parametrize(("trainer", "update"), TRAINERS, ids=[t[0].split("=")[1] for t, _ in TRAINERS])
def test_total_env_steps_is_the_budget_of_all_workers_together(tmp_path, trainer, update, no_leaks):
    res = run_cli([*TINY, *trainer], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 1024 <= summary["total_env_steps"] < 1024 + update, summary["total_env_steps"]
    if "trainer=parallel" in trainer:  # two agents, an equal share each
        assert [a["total_env_steps"] for a in summary["agents"]] == [512, 512]
        assert summary["budget_env_steps"] == 1024


def test_rltrain_check_says_how_the_budget_is_shared(tmp_path):
    def check(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "debug=smoke", *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", **_env()})
        assert res.returncode == 0, res.stdout + res.stderr
        return " ".join(res.stdout.replace("\u2502", " ").split())  # the table's cell borders out

    assert "total_env_steps 2048, all envs and workers together" in check("trainer=distributed_simulator")
    out = check("trainer=parallel", "trainer.num_agents=3")
    assert "total_env_steps 2048, all 3 agents together: 683 / 683 / 682 env steps each" in out, out


def test_a_budget_that_whole_updates_pass_by_more_than_1_percent_is_said(tmp_path):
    """A run ends after whole updates: where that passes total_env_steps by more than 1%, the run's start says where
    it ends, and rltrain-check's updates row always does."""
    res = run_cli(["debug=smoke", "logger.progress=plain", "eval.episodes=1", "env.num_envs=3",
                   "algo.rollout_len=500", "total_env_steps=2000", "hydra.run.dir=run"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[rltrain] budget: total_env_steps=2000 runs to 3000 env steps (2 whole updates of algo.rollout_len " \
           "(500) x env.num_envs (3) = 1500; 50% over)" in res.stdout, res.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_env_steps"] == 3000
    res = run_cli(["debug=smoke", "logger.progress=plain", "eval.episodes=1", "total_env_steps=2048",
                   "hydra.run.dir=run2"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0 and "budget:" not in res.stdout, res.stdout  # whole updates land on it
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "debug=smoke", "env.num_envs=3",
                          "algo.rollout_len=500", "total_env_steps=2000"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"COLUMNS": "200", **_env()})
    out = " ".join(res.stdout.replace("\u2502", " ").split())
    assert "2000 total_env_steps / 1500 = 2, whole: the run ends at 3000 env steps" in out, out


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "COLUMNS"}


def test_box_bounds_far_from_a_gaussian_policys_scale_are_said_at_start(capsys, tmp_path, monkeypatch):
    """PPO's Gaussian starts at mean 0, std 1, clipped to the Box: on actions in [10, 20] every early action is 10.
    The start says so once, with the wrapper that rescales them; not for Pendulum's [-2, 2], not for SAC (it
    squashes into the bounds), and not once the wrapper is there."""
    from rich.console import Console

    from rltrain.cli import check
    from rltrain.cli.preflight import action_scale_line
    from rltrain.data.structs import EnvSpec

    monkeypatch.chdir(tmp_path)
    shifted = "env.wrappers=[{gymnasium.wrappers.RescaleAction: {min_action: 10, max_action: 20}}]"
    fixed = "env.wrappers=[{gymnasium.wrappers.RescaleAction: {min_action: 10, max_action: 20}}, " \
            "{gymnasium.wrappers.RescaleAction: {min_action: -1, max_action: 1}}]"
    said = {}
    for name, extra in {"ppo": ["algo=ppo", shifted], "pendulum": ["algo=ppo"], "sac": ["algo=sac", shifted],
                        "fixed": ["algo=ppo", fixed]}.items():
        assert check.check(["env=pendulum", "total_env_steps=4096", *extra], Console(file=io.StringIO())) == 0
        said[name] = [line for line in capsys.readouterr().out.splitlines() if "Gaussian policy" in line]
    assert len(said["ppo"]) == 1 and said["ppo"][0].startswith("[rltrain] note: Box actions in [10, 20]:"), said
    assert "env.wrappers=[{gymnasium.wrappers.RescaleAction: {min_action: -1, max_action: 1}}]" in said["ppo"][0]
    assert not said["pendulum"] and not said["sac"] and not said["fixed"], said
    spec = EnvSpec("X", (3,), "box", (2,), action_low=(-0.01, -1.0), action_high=(0.01, 1.0))
    assert "[-1, 1]" in action_scale_line(spec)  # a half-width of 0.01: a sliver is all it explores
    assert action_scale_line(EnvSpec("X", (3,), "box", (1,), action_low=(-float("inf"),),
                                     action_high=(float("inf"),))) is None
    # a dimension with low == high holds one action: it neither asks for rescaling nor names the range
    assert action_scale_line(EnvSpec("X", (3,), "box", (2,), action_low=(0.0, -5.0), action_high=(0.0, 5.0))) is None
    assert "[10, 20]" in action_scale_line(EnvSpec("X", (3,), "box", (2,), action_low=(3.0, 10.0),
                                                   action_high=(3.0, 20.0)))
