"""sb3-contrib's QR-DQN, for same-moment comparisons (``scripts/bench_algorithms.py``).

Runs under a Python that has ``sb3-contrib`` installed (not an rltrain dependency):

    python scripts/peers/sb3_qrdqn.py qrdqn-cartpole SEED STEPS   # rl-baselines3-zoo's QR-DQN CartPole-v1 settings
    python scripts/peers/sb3_qrdqn.py qrdqn-minatar SEED STEPS    # MinAtar/Breakout-v1, MLP on the flattened planes

Each trains one env for STEPS env steps and prints JSON: the mean of the last 100 training episodes. The
settings are spelled out here and in ``bench_algorithms.py`` (the rltrain side names the same values).
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import torch
from sb3_contrib import QRDQN
from stable_baselines3.common.env_util import make_vec_env

# rl-baselines3-zoo hyperparams/qrdqn.yml, CartPole-v1
CARTPOLE = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256], "n_quantiles": 10})
# MinAtar (Young & Tian 2019's DQN schedule at one gradient step per 4 env steps, as rltrain's dqn_minatar)
MINATAR = dict(learning_rate=2.5e-4, batch_size=32, buffer_size=100_000, learning_starts=5000, gamma=0.99,
               target_update_interval=1000, train_freq=4, gradient_steps=1, exploration_fraction=0.1,
               exploration_final_eps=0.1, policy_kwargs={"net_arch": [120, 84], "n_quantiles": 200})


def main() -> None:
    case, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    if case == "qrdqn-cartpole":
        env, kwargs = make_vec_env("CartPole-v1", n_envs=1, seed=seed), CARTPOLE
    else:
        import minatar.gym

        minatar.gym.register_envs()  # MinAtar/* are registered on request

        env = make_vec_env(lambda: gym.wrappers.FlattenObservation(
            gym.wrappers.TransformObservation(gym.make("MinAtar/Breakout-v1"), lambda o: o.astype("float32"),
                                              gym.spaces.Box(0, 1, (10, 10, 4), "float32"))), n_envs=1, seed=seed)
        kwargs = MINATAR
    model = QRDQN("MlpPolicy", env, seed=seed, device="cpu", **kwargs)
    model.learn(steps)
    buf = model.ep_info_buffer
    print(json.dumps({"train_return_last100": sum(e["r"] for e in buf) / len(buf) if buf else None}))


if __name__ == "__main__":
    main()
