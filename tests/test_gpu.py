"""The CUDA paths: every algorithm family trains on a GPU, and one checkpoint format crosses CPU <-> CUDA.

A CPU run takes the numpy update (PPO) and CPU tensors; a CUDA run takes autograd on the device. Both write the
same checkpoint format (docs/architecture.md, "One maths per algorithm"), so a checkpoint trained on one
resumes and evaluates on the other. Skipped without a CUDA device (marked ``gpu``: CI has none).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli

PEERS = str(Path(__file__).resolve().parents[1] / "scripts" / "peers")  # bench_envs: the goal tasks

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SMALL = ["total_env_steps=2048", "env.num_envs=2", "eval.every_env_steps=1024", "eval.episodes=2",
         "checkpoint.every_env_steps=1024", "log.every_env_steps=512", "logger.progress=off"]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _train(tmp_path: Path, *overrides: str, name: str = "run", env: dict | None = None) -> dict:
    r = run_cli([*SMALL, *overrides, f"hydra.run.dir={name}"], cwd=tmp_path, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return _summary(tmp_path / name)


@pytest.mark.parametrize("overrides", [
    ["algo=ppo", "algo.rollout_len=64"],
    ["algo=ppo", "algo.rollout_len=64", "env=cartpole_novel", "model.core=lstm", "model.core_size=16"],
    ["algo=a2c"],
    ["algo=impala", "algo.rollout_len=32"],
    ["algo=dqn", "algo.learning_starts=256", "algo.buffer_size=4096"],
    ["algo=sac", "env=pendulum", "algo.learning_starts=256", "algo.buffer_size=4096", "total_env_steps=1024",
     "eval.every_env_steps=512", "checkpoint.every_env_steps=512"],
    ["algo=rainbow", "algo.learning_starts=256", "algo.buffer_size=4096", "algo.v_min=0", "algo.v_max=50"],
    ["algo=dqn", "algo.learning_starts=256", "algo.buffer_size=4096", "algo.distributional=qr", "algo.n_step=3",
     "algo.prioritized=true", "algo.dueling=true"],
    ["algo=pqn", "algo.rollout_len=64"],
    ["algo=td3", "env=pendulum", "algo.learning_starts=256", "algo.buffer_size=4096", "total_env_steps=1024",
     "eval.every_env_steps=512", "checkpoint.every_env_steps=512"],
    ["algo=ddpg", "env.id=tests.helpers.obs_envs:ImageEnv", "+env.kwargs.continuous=true",
     "+env.kwargs.shape=[40,40,3]", "algo.learning_starts=256", "algo.buffer_size=4096", "total_env_steps=1024",
     "eval.every_env_steps=512"],
    ["algo=sac", "env.id=bench_envs:PointReach", f"env.search_path={PEERS}", "algo.her=true",
     "algo.learning_starts=256", "algo.buffer_size=4096", "total_env_steps=1024", "eval.every_env_steps=512"],
    # multi-agent: three agents with spaces of their own (Box / Discrete / Dict + MultiDiscrete), per-agent
    # policies for IPPO, one centralised critic for MAPPO
    ["env.id=tests.helpers.agent_envs:uneven", "algo=ippo", "algo.rollout_len=16"],
    ["env.id=tests.helpers.agent_envs:uneven", "algo=mappo", "algo.rollout_len=16"],
], ids=["ppo", "ppo-lstm", "a2c", "impala", "dqn", "sac", "rainbow", "qrdqn-nstep-per", "pqn", "td3",
        "ddpg-image", "sac-her", "ippo", "mappo"])
def test_each_algorithm_family_trains_in_process_on_cuda(tmp_path, overrides):
    """In-process (``rltrain.train``, sequential trainer), so the device memory this process allocated shows
    the networks and the update really ran on the GPU."""
    import rltrain

    torch.cuda.reset_peak_memory_stats()
    result = rltrain.train([*SMALL, *overrides, "device=cuda", "experiment=none"], run_dir=tmp_path / "run")
    assert result.summary["status"] == "completed", result.summary
    assert torch.cuda.max_memory_allocated() > 0
    assert result.policy is not None


def test_cuda_checkpoint_evaluates_and_resumes_on_a_machine_without_gpu(tmp_path):
    first = _train(tmp_path, "device=cuda", "algo.rollout_len=64")
    assert first["status"] == "completed"
    # the same run dir on a machine with no GPU visible: eval and resume on the CPU (the numpy update path)
    r = run_cli([str(tmp_path / "run"), "--episodes", "2", "--device", "cpu"], cwd=tmp_path,
                module="rltrain.cli.evaluate", env=NO_GPU, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = _train(tmp_path, "device=cpu", "algo.rollout_len=64", "resume=auto", "total_env_steps=4096",
                     env=NO_GPU)
    assert resumed["status"] == "completed" and resumed["resumed_from_env_steps"] == 2048


def test_cpu_checkpoint_resumes_on_cuda(tmp_path):
    _train(tmp_path, "device=cpu", "algo.rollout_len=64", env=NO_GPU)
    resumed = _train(tmp_path, "device=cuda", "algo.rollout_len=64", "resume=auto", "total_env_steps=4096")
    assert resumed["status"] == "completed" and resumed["resumed_from_env_steps"] == 2048


def test_subprocess_actors_with_the_learner_on_cuda(tmp_path, no_leaks):
    s = _train(tmp_path, "trainer=subprocess_actors", "trainer.num_actors=2", "trainer.learner_device=cuda",
               "trainer.actor_device=cpu", "algo=impala", "algo.rollout_len=32")
    assert s["status"] == "completed"


def test_the_loaded_policy_acts_on_cuda(tmp_path):
    import numpy as np

    import rltrain

    _train(tmp_path, "device=cpu", "algo.rollout_len=64", env=NO_GPU)
    policy = rltrain.load_policy(tmp_path / "run", device="cuda")
    action, _ = policy.act(np.zeros(4, np.float32))
    assert int(action) in (0, 1)
