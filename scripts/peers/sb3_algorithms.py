"""Stable-Baselines3's TD3 and SAC + hindsight replay, for same-moment comparisons (``scripts/bench_algorithms.py``).

Runs under a Python that has ``stable-baselines3`` installed (it is not an rltrain dependency):

    python scripts/peers/sb3_algorithms.py td3-pendulum SEED STEPS [LEARNING_STARTS]   # rl-zoo3's TD3, Pendulum
    python scripts/peers/sb3_algorithms.py td3-mujoco SEED STEPS [LEARNING_STARTS]     # rl-zoo3's TD3, Hopper-v5
    python scripts/peers/sb3_algorithms.py her-sac SEED STEPS [LEARNING_STARTS]  # SAC + HER, bench_envs:PointReach

Each builds one env, trains for STEPS env steps and prints JSON: the mean return and success rate of the last
100 training episodes (SB3's ``ep_info_buffer`` / ``ep_success_buffer``), those of a final evaluation of
``EVAL_EPISODES`` deterministic episodes on a fresh env (seeded apart from training), and the loop's seconds.
The caller times the whole process. Settings are spelled out so that the rltrain side can name the same values.
``bench_envs`` must be importable (``scripts/peers`` on PYTHONPATH, as the caller sets it).
"""

from __future__ import annotations

import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env

EVAL_EPISODES = 10


def td3_pendulum(seed: int, learning_starts: str = "10000"):
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    # rl-baselines3-zoo hyperparams/td3.yml, Pendulum-v1
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    noise = NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1))
    model = TD3("MlpPolicy", env, gamma=0.98, buffer_size=200_000, learning_starts=int(learning_starts),
                action_noise=noise, gradient_steps=1, train_freq=1, learning_rate=1e-3,
                policy_kwargs={"net_arch": [400, 300]}, seed=seed, device="cpu")
    return model, gym.make("Pendulum-v1")


def td3_mujoco(seed: int, learning_starts: str = "10000"):
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    # rl-baselines3-zoo hyperparams/td3.yml, the MuJoCo tasks (HalfCheetah, Ant, Hopper, Walker2d): 10k random
    # steps and Gaussian noise 0.1; everything else is SB3's TD3 default (lr 1e-3, batch 256, 400x300, gamma 0.99)
    env = make_vec_env("Hopper-v5", n_envs=1, seed=seed)
    dim = env.action_space.shape[0]
    noise = NormalActionNoise(mean=np.zeros(dim), sigma=0.1 * np.ones(dim))
    model = TD3("MlpPolicy", env, learning_starts=int(learning_starts), action_noise=noise, seed=seed, device="cpu")
    return model, gym.make("Hopper-v5")


def her_sac(seed: int, learning_starts: str = "100"):
    from bench_envs import PointReach
    from stable_baselines3 import SAC, HerReplayBuffer

    # SAC's defaults with HER's: n_sampled_goal 4, the "future" strategy
    env = make_vec_env(PointReach, n_envs=1, seed=seed)
    model = SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer,
                replay_buffer_kwargs={"n_sampled_goal": 4, "goal_selection_strategy": "future"},
                learning_starts=int(learning_starts), seed=seed, device="cpu")
    return model, PointReach()


CASES = {"td3-pendulum": td3_pendulum, "td3-mujoco": td3_mujoco, "her-sac": her_sac}


def evaluate(model, env, seed: int) -> tuple[float, float | None]:
    """Mean return and success rate of ``EVAL_EPISODES`` deterministic episodes on ``env`` (a fresh one)."""
    returns, successes = [], []
    for episode in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=10_000 + 100 * seed + episode)
        total, done, info = 0.0, False, {}
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        if "is_success" in info:
            successes.append(float(info["is_success"]))
    return float(np.mean(returns)), float(np.mean(successes)) if successes else None


def learn(model, eval_env, steps: int, seed: int) -> dict:
    t0 = time.perf_counter()
    model.learn(steps)
    loop_s = time.perf_counter() - t0
    returns = [e["r"] for e in model.ep_info_buffer]
    successes = list(model.ep_success_buffer)
    eval_return, eval_success = evaluate(model, eval_env, seed)
    return {"train_return_last100": float(np.mean(returns)) if returns else None,
            "train_success_rate_last100": float(np.mean(successes)) if successes else None,
            "final_eval_return": eval_return, "final_eval_success_rate": eval_success, "loop_s": loop_s}


if __name__ == "__main__":
    torch.set_num_threads(1)  # as rltrain's torch_threads=1
    case, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model, eval_env = CASES[case](seed, *sys.argv[4:])
    print(json.dumps(learn(model, eval_env, steps, seed)))
