"""One rank of the equivalence test (``python -m tests.helpers.dist_equiv RANK PORT OUT``): PPO with an
all-reducing Sync learns once from its half of a hand-made rollout and saves its weights and metrics."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import torch

T, N_PER_RANK = 16, 3
PPO_KW = dict(rollout_len=T, update_epochs=1, num_minibatches=1, norm_adv=False, anneal_lr=False,
              norm_obs=True, norm_reward=True)


def make_rollout(n_envs: int):
    from rltrain.data.structs import Rollout

    rng = np.random.default_rng(7)
    return Rollout(obs=rng.normal(size=(T, n_envs, 4)).astype(np.float32),
                   actions=rng.integers(0, 2, size=(T, n_envs)).astype(np.int64),
                   log_probs=np.full((T, n_envs), np.log(0.5), np.float32),
                   rewards=rng.normal(1.0, 0.5, size=(T, n_envs)).astype(np.float32),
                   terminated=rng.random((T, n_envs)) < 0.1, truncated=np.zeros((T, n_envs), bool),
                   next_obs=rng.normal(size=(T, n_envs, 4)).astype(np.float32),
                   policy_version=np.zeros(T, np.int64))


def make_ppo(num_envs: int, sync=None):
    from rltrain.algos.ppo import PPO, PPOSettings
    from rltrain.envs.make import env_spec, make_env
    from rltrain.models.settings import ModelSettings

    torch.manual_seed(0)  # same initial weights everywhere (the trainer broadcasts; here the seed does it)
    return PPO(env_spec(make_env("CartPole-v1"), "CartPole-v1"), PPOSettings(**PPO_KW), num_envs=num_envs,
               device=torch.device("cpu"), sync=sync, model=ModelSettings(hidden_sizes=(16, 16)))


def rank_slice(ro, r: int):
    s = slice(r * N_PER_RANK, (r + 1) * N_PER_RANK)
    return replace(ro, obs=ro.obs[:, s], actions=ro.actions[:, s], log_probs=ro.log_probs[:, s],
                   rewards=ro.rewards[:, s], terminated=ro.terminated[:, s], truncated=ro.truncated[:, s],
                   next_obs=ro.next_obs[:, s])


def main(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from rltrain.trainers.distributed import init_distributed
    from rltrain.trainers.rendezvous import LaunchInfo

    torch.set_num_threads(1)
    # started by the test, not by a spawning parent that serves the store: rank 0 serves it on PORT, as under torchrun
    sync = init_distributed(LaunchInfo(rank, 2, rank, "127.0.0.1", port, "torchrun"), backend="gloo",
                            device=torch.device("cpu"), timeout_s=30)
    algo = make_ppo(N_PER_RANK, sync)
    metrics = algo.learn(rank_slice(make_rollout(2 * N_PER_RANK), rank), progress=0.0)
    torch.save({"policy": algo.policy.state_dict(), "metrics": metrics}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
