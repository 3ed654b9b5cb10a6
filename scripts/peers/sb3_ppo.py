"""Stable-Baselines3 PPO on CartPole-v1, for same-moment comparisons (``bench_throughput.py --only sb3``).

Runs under a Python that has ``stable-baselines3`` installed (it is not an rltrain dependency):

    python scripts/peers/sb3_ppo.py solve SEED   # rl-baselines3-zoo's CartPole settings, stop at a rolling-20
                                                 # training return of 475; prints JSON (steps, loop seconds)
    python scripts/peers/sb3_ppo.py sps          # CleanRL's settings (4 envs x 128, 4 epochs x 4 minibatches):
                                                 # env steps per second after a warm-up; prints JSON
    python scripts/peers/sb3_ppo.py pixels ENV_ID WARMUP MEASURE
                                                 # CnnPolicy on Atari (make_atari_env's AtariWrapper + 4-frame
                                                 # stack), CleanRL's ppo_atari settings; env steps per second
    python scripts/peers/sb3_ppo.py recurrent-sps WARMUP MEASURE
    python scripts/peers/sb3_ppo.py recurrent-solve SEED
                                                 # sb3-contrib RecurrentPPO on CartPoleNoVel with
                                                 # rl-baselines3-zoo's ppo_lstm settings (needs sb3-contrib)

The caller times the whole process, as it does for ``rltrain target_return=475``.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env


def linear(start: float):
    """SB3 schedules take the remaining progress (1 -> 0)."""
    return lambda remaining: start * remaining


class StopAtReturn(BaseCallback):
    """Stops once the mean of the last 20 finished training episodes reaches ``target`` (as rltrain does)."""

    def __init__(self, target: float):
        super().__init__()
        self.target = target
        self.solved_at: int | None = None

    def _on_step(self) -> bool:
        buf = self.model.ep_info_buffer
        if len(buf) >= 20 and sum(e["r"] for e in buf) / len(buf) >= self.target:
            self.solved_at = self.num_timesteps
            return False
        return True


def solve(seed: int) -> dict:
    # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=linear(1e-3), clip_range=linear(0.2), stats_window_size=20, seed=seed, device="cpu")
    cb = StopAtReturn(475.0)
    t0 = time.perf_counter()
    model.learn(100_000, callback=cb)
    return {"solved_at_env_steps": cb.solved_at, "loop_s": time.perf_counter() - t0}


def sps() -> dict:
    # CleanRL ppo.py defaults: 4 envs x 128 steps, 4 epochs, 4 minibatches (of 128), lr 2.5e-4, 64x64 tanh
    env = make_vec_env("CartPole-v1", n_envs=4, seed=1)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4, learning_rate=2.5e-4, gamma=0.99,
                gae_lambda=0.95, ent_coef=0.01, seed=1, device="cpu")
    model.learn(10_240)
    t0 = time.perf_counter()
    model.learn(102_400, reset_num_timesteps=False)
    return {"sps": 102_400 / (time.perf_counter() - t0)}


def pixels(env_id: str, warmup: int, measure: int) -> dict:
    # CleanRL ppo_atari.py: 8 envs x 128 steps, 4 epochs x 4 minibatches (of 256), lr 2.5e-4, clip 0.1, ent 0.01;
    # SB3's CnnPolicy is the Nature CNN with the features extractor shared by actor and critic
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    env = VecFrameStack(make_atari_env(env_id, n_envs=8, seed=1), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1,
                ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, seed=1, device="cpu")
    model.learn(warmup)
    t0 = time.perf_counter()
    model.learn(measure, reset_num_timesteps=False)
    return {"sps": measure / (time.perf_counter() - t0)}


def _novel_env(n_envs: int, seed: int):
    """CartPoleNoVel as rl-baselines3-zoo defines it: CartPole-v1 with observation entries 1 and 3 times 0,
    normalised observations and rewards (the zoo's ``normalize: True``)."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import VecNormalize

    class NoVel(gym.ObservationWrapper):
        def observation(self, obs):
            return obs * np.array([1, 0, 1, 0], obs.dtype)

    return VecNormalize(make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed, wrapper_class=NoVel), gamma=0.98)


def _recurrent_model(seed: int):
    # rl-baselines3-zoo hyperparams/ppo_lstm.yml, CartPoleNoVel-v1
    from sb3_contrib import RecurrentPPO
    from torch import nn

    return RecurrentPPO("MlpLstmPolicy", _novel_env(8, seed), n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                        n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
                        policy_kwargs={"ortho_init": False, "activation_fn": nn.ReLU, "lstm_hidden_size": 64,
                                       "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]}},
                        stats_window_size=20, seed=seed, device="cpu")


def recurrent_sps(warmup: int, measure: int) -> dict:
    model = _recurrent_model(1)
    model.learn(warmup)
    t0 = time.perf_counter()
    model.learn(measure, reset_num_timesteps=False)
    return {"sps": measure / (time.perf_counter() - t0)}


def recurrent_solve(seed: int) -> dict:
    model = _recurrent_model(seed)
    cb = StopAtReturn(475.0)
    t0 = time.perf_counter()
    model.learn(200_000, callback=cb)
    return {"solved_at_env_steps": cb.solved_at, "loop_s": time.perf_counter() - t0}


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode = sys.argv[1]
    if mode == "pixels":
        import ale_py
        import gymnasium

        gymnasium.register_envs(ale_py)
        print(json.dumps(pixels(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    elif mode == "recurrent-sps":
        print(json.dumps(recurrent_sps(int(sys.argv[2]), int(sys.argv[3]))))
    elif mode == "recurrent-solve":
        print(json.dumps(recurrent_solve(int(sys.argv[2]))))
    else:
        print(json.dumps(solve(int(sys.argv[2])) if mode == "solve" else sps()))
