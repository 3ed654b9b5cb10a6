"""The grid: every algorithm under every trainer that accepts it, on three observation kinds.

Observation kinds: a float vector (CartPole, Pendulum for SAC's Box actions), an image (``ImageEnv``: 10x10x3
uint8 HWC frames, small enough that ``model.encoder=auto`` picks the MinAtar CNN) and a Dict (``DictEnv``:
an image, a float vector, a Discrete and a MultiBinary key). SAC runs the Box-action variant of the fake envs
(``continuous=true``). Each case must exit cleanly with status ``completed`` and write a final checkpoint.

``trainer=sequential`` runs in-process (``rltrain.cli.build.run``); the multi-process trainers run through
the CLI in a subprocess, one Hydra multirun per (trainer, observation kind) so the interpreter starts once.
Budgets are tiny (256 env steps, 16-wide networks): this checks plumbing, not learning. The multi-process
part of the grid is marked ``slow`` (every trainer start imports torch in fresh processes); the fast tier
keeps every sequential case and one Dict case per multi-process trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rltrain.cli.build import run
from rltrain.errors import ConfigError
from rltrain.run.checkpoint import load_checkpoint
from rltrain.run.metrics import WALL_CLOCK_PREFIX, read_metrics
from tests.conftest import REPO, compose_cfg, run_cli

torch.set_num_threads(1)

ALGOS = ("ppo", "a2c", "impala", "dqn", "sac", "td3", "ddpg", "rainbow", "pqn")
BOX = ("sac", "td3", "ddpg")  # the algorithms that need Box actions
ON_POLICY = ("ppo", "a2c", "impala", "pqn")
HELPERS = "tests.helpers.obs_envs"
TINY = ["total_env_steps=256", "env.num_envs=2", "eval.every_env_steps=0", "eval.episodes=1",
        "log.every_env_steps=128", "checkpoint.every_env_steps=0", "logger=quiet", "logger.progress=off",
        "model.hidden_sizes=[16]", "model.cnn_features=16"]
PER_ALGO = {
    "ppo": ["algo.rollout_len=16", "algo.num_minibatches=2", "algo.update_epochs=1"],
    "a2c": ["algo.rollout_len=16"],
    "impala": ["algo.rollout_len=16"],
    "dqn": ["algo.rollout_len=8", "algo.learning_starts=64", "algo.buffer_size=1000", "algo.batch_size=16",
            "algo.train_frequency=32", "algo.target_network_frequency=64"],
    "rainbow": ["algo.rollout_len=8", "algo.learning_starts=64", "algo.buffer_size=1000", "algo.batch_size=16",
                "algo.train_frequency=32", "algo.target_network_frequency=64"],
    "pqn": ["algo.rollout_len=16", "algo.num_minibatches=2", "algo.update_epochs=1"],
    "sac": ["algo.rollout_len=8", "algo.learning_starts=64", "algo.buffer_size=1000", "algo.batch_size=16",
            "algo.train_frequency=32", "model.hidden_sizes=[16]"],
    "td3": ["algo.rollout_len=8", "algo.learning_starts=64", "algo.buffer_size=1000", "algo.batch_size=16",
            "algo.train_frequency=32"],
    "ddpg": ["algo.rollout_len=8", "algo.learning_starts=64", "algo.buffer_size=1000", "algo.batch_size=16",
             "algo.train_frequency=32"],
}
OBS_KINDS = ("vector", "image", "dict")


def slow_grid_algos(algos: tuple[str, ...], obs: str) -> tuple[str, ...]:
    """The algos a slow grid case runs: PPO on Dict observations is left to
    ``test_every_multiprocess_trainer_on_dict_observations``, which runs that very job (same trainer keys)."""
    return tuple(a for a in algos if not (obs == "dict" and a == "ppo"))


def env_overrides(obs: str, *, box: bool) -> list[str]:
    """The env of an observation kind, with Box actions for SAC, TD3 and DDPG."""
    if obs == "vector":
        return ["env=pendulum"] if box else ["env=cartpole"]
    cont = f"+env.kwargs.continuous={str(box).lower()}"
    if obs == "image":
        return [f"env.id={HELPERS}:ImageEnv", "+env.kwargs.shape=[10,10,3]", cont]
    return [f"env.id={HELPERS}:DictEnv", "+env.kwargs.image_shape=[10,10,3]", cont]


def overrides(algo: str, obs: str) -> list[str]:
    return [f"algo={algo}", *TINY, *PER_ALGO[algo], *env_overrides(obs, box=algo in BOX)]


def assert_completed(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    # trainer=parallel: each agent's run dir holds its checkpoints
    assert (run_dir / "checkpoints" / "final.pt").is_file() or list(run_dir.glob("agent_*/checkpoints/final.pt"))


@pytest.mark.parametrize("obs", OBS_KINDS)
@pytest.mark.parametrize("algo", ALGOS)
def test_sequential(tmp_path, algo, obs):
    summary = run(compose_cfg(overrides(algo, obs)), tmp_path)
    assert summary["status"] == "completed" and summary["total_env_steps"] >= 256
    assert_completed(tmp_path)


def write_grid_configs(root: Path, obs: str) -> Path:
    """A ``grid`` config group (one file per algo: the algo, its tiny keys and its env) in ``root``, so
    that one Hydra multirun ``+grid=ppo,a2c,...`` covers algos whose keys and envs differ."""
    group = root / "grid_conf" / "grid"
    group.mkdir(parents=True, exist_ok=True)
    for algo in ALGOS:
        env = env_overrides(obs, box=algo in BOX)
        lines = ["# @package _global_", "defaults:", f"  - override /algo: {algo}"]
        lines += [f"  - override /env: {e.split('=')[1]}" for e in env if e.startswith("env=")]
        for key_group in ("algo", "model"):  # the tiny keys, each under its group
            keys = [o.split("=") for o in PER_ALGO[algo] if o.startswith(f"{key_group}.")]
            lines += [f"{key_group}:"] + [f"  {k[len(key_group) + 1:]}: {v}" for k, v in keys] if keys else []
        others = [e for e in env if not e.startswith("env=")]
        if others:
            kwargs = [e.split("=") for e in others if e.startswith("+env.kwargs.")]
            lines += ["env:", f"  id: {others[0].split('=')[1]}", "  kwargs:"]
            lines += [f"    {k[len('+env.kwargs.'):]}: {v}" for k, v in kwargs]
        (group / f"{algo}.yaml").write_text("\n".join(lines) + "\n")
    return root / "grid_conf"


def multirun(tmp_path: Path, trainer: list[str], algos: tuple[str, ...], obs: str) -> None:
    """One CLI process: a Hydra multirun over ``algos`` under ``trainer``; every job must complete."""
    conf = write_grid_configs(tmp_path, obs)
    args = ["-m", f"+grid={','.join(algos)}", *trainer, *TINY, f"hydra.searchpath=[file://{conf}]",
            "hydra.sweep.dir=sweep", "hydra.sweep.subdir=${hydra.job.num}"]
    out = run_cli(args, cwd=tmp_path, timeout=600, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    for job in range(len(algos)):
        assert_completed(tmp_path / "sweep" / str(job))


@pytest.mark.slow
@pytest.mark.parametrize("obs", OBS_KINDS)
def test_subprocess_actors(tmp_path, obs, orphan_watch):
    multirun(tmp_path, ["trainer=subprocess_actors", "trainer.num_actors=1"], slow_grid_algos(ALGOS, obs), obs)


@pytest.mark.slow
@pytest.mark.parametrize("obs", OBS_KINDS)
def test_parallel(tmp_path, obs, orphan_watch):
    multirun(tmp_path, ["trainer=parallel", "trainer.num_agents=1"], slow_grid_algos(ALGOS, obs), obs)


@pytest.mark.slow
@pytest.mark.parametrize("obs", OBS_KINDS)
def test_distributed_simulator(tmp_path, obs, orphan_watch):
    multirun(tmp_path, ["trainer=distributed_simulator", "trainer.timeout_s=60"], slow_grid_algos(ON_POLICY, obs), obs)


@pytest.mark.parametrize("trainer", ["subprocess_actors", "parallel",
                                     pytest.param("distributed_simulator", marks=pytest.mark.slow)])
def test_every_multiprocess_trainer_on_dict_observations(tmp_path, trainer, orphan_watch):
    """The fast tier: PPO on Dict observations through the actors' pipes and an agent process (two ranks
    take over 20 s here, so that case is slow; with the slow grid above, which leaves these jobs to this test,
    every combination is covered)."""
    extra = {"subprocess_actors": ["trainer.num_actors=1"], "parallel": ["trainer.num_agents=1"],
             "distributed_simulator": ["trainer.timeout_s=60"]}[trainer]
    multirun(tmp_path, [f"trainer={trainer}", *extra], ("ppo",), "dict")


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3"])
def test_distributed_simulator_refuses_off_policy_algos_in_one_line(tmp_path, algo):
    with pytest.raises(ConfigError) as err:
        run(compose_cfg([*overrides(algo, "dict"), "trainer=distributed_simulator"]), tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"trainer=distributed_simulator: algo={algo} is off-policy and its replay updates are not "
                       "all-reduced; use trainer=sequential, parallel or subprocess_actors")


def test_cnn_checkpoint_round_trip_and_bitwise_resume(tmp_path):
    """Sequential PPO on 10x10x3 uint8 frames (MinAtar CNN): 2N steps at once == N steps + resume + N, in
    every metrics.csv row (wall clock aside) and in every final parameter; the checkpoint loads weights-only."""
    base = [*overrides("ppo", "image"), "algo.anneal_lr=false", "log.every_env_steps=64",
            "checkpoint.every_env_steps=128"]
    run(compose_cfg([*base, "total_env_steps=512"]), tmp_path / "once")
    run(compose_cfg([*base, "total_env_steps=256"]), tmp_path / "twice")
    summary = run(compose_cfg([*base, "total_env_steps=512", "resume=auto"]), tmp_path / "twice")
    assert summary["resumed_from_env_steps"] == 256
    # the N run's final evaluation lands in its last row (256): the only cells allowed to differ
    rows = [[{k: v for k, v in r.items() if not k.startswith((WALL_CLOCK_PREFIX, "eval/"))}
             for r in read_metrics(tmp_path / name / "metrics.csv")] for name in ("once", "twice")]
    assert len(rows[0]) == 8 and rows[0] == rows[1]
    once = torch.load(tmp_path / "once" / "checkpoints" / "final.pt", weights_only=True)
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    p1, p2 = once["algo"]["policy"], twice["algo"]["policy"]
    assert any(k.startswith("torso.actor_encoder.convs.") for k in p1)  # the CNN, not an MLP on pixels
    assert p1.keys() == p2.keys() and all(torch.equal(p1[k], p2[k]) for k in p1)
