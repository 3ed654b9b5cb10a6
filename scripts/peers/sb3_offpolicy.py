"""Stable-Baselines3 DQN and SAC, for same-moment comparisons (``scripts/bench_offpolicy.py``).

Runs under a Python that has ``stable-baselines3`` installed (it is not an rltrain dependency):

    python scripts/peers/sb3_offpolicy.py dqn SEED STEPS         # DQN on CartPole-v1 at SB3's DQN settings
    python scripts/peers/sb3_offpolicy.py sac SEED STEPS WIDTH   # SAC on Pendulum-v1 at SB3's SAC settings
    python scripts/peers/sb3_offpolicy.py sac-goal SEED STEPS    # SAC's defaults on bench_envs:PointReach

Each builds one env, trains for STEPS env steps and prints JSON (the mean of the last 100 training episodes and
the loop's seconds). The caller times the whole process (its rusage), as it does for ``rltrain``; the
settings are spelled out here rather than left to SB3's defaults so that the rltrain side can name the same
values (``bench_offpolicy.py`` holds both lists). ``sac-goal`` is the exception: each library with nothing set
(SB3's ``MultiInputPolicy`` concatenates the Dict's vectors into its MLPs). ``bench_envs`` must be importable
(``scripts/peers`` on PYTHONPATH, as the caller sets it).
"""

from __future__ import annotations

import json
import sys
import time

import torch
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.env_util import make_vec_env


def dqn(seed: int, steps: int) -> dict:
    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model = DQN("MlpPolicy", env, learning_rate=1e-4, buffer_size=100_000, learning_starts=1000, batch_size=32,
                tau=1.0, gamma=0.99, train_freq=4, gradient_steps=1, target_update_interval=10_000,
                exploration_fraction=0.1, exploration_initial_eps=1.0, exploration_final_eps=0.05,
                max_grad_norm=10.0, policy_kwargs={"net_arch": [64, 64]}, seed=seed, device="cpu")
    return _learn(model, steps)


def sac(seed: int, steps: int, width: int) -> dict:
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    # SB3's defaults, written out; ent_coef "auto" starts alpha at 1.0 and tunes it toward -dim(A)
    model = SAC("MlpPolicy", env, learning_rate=1e-3, buffer_size=1_000_000, learning_starts=100, batch_size=256,
                tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
                policy_kwargs={"net_arch": [width, width]}, seed=seed, device="cpu")
    return _learn(model, steps)


def sac_goal(seed: int, steps: int) -> dict:
    from bench_envs import PointReach

    env = make_vec_env(PointReach, n_envs=1, seed=seed)
    return _learn(SAC("MultiInputPolicy", env, seed=seed, device="cpu"), steps)


def _learn(model, steps: int) -> dict:
    t0 = time.perf_counter()
    model.learn(steps)
    buf = model.ep_info_buffer
    last100 = sum(e["r"] for e in buf) / len(buf) if buf else None
    return {"train_return_last100": last100, "loop_s": time.perf_counter() - t0}


if __name__ == "__main__":
    torch.set_num_threads(1)  # as rltrain's torch_threads=1
    case, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if case == "dqn":
        out = dqn(seed, steps)
    elif case == "sac":
        out = sac(seed, steps, int(sys.argv[4]))
    else:
        out = sac_goal(seed, steps)
    print(json.dumps(out))
