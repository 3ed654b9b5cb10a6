"""Envs for tests: importable by path (env.id=tests.faulty_envs:...)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """A tiny Box-observation env with a custom constructor argument (tests env.kwargs pass-through)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 10):
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.full(3, self.t / self.length, np.float32)
        return obs, float(action), self.t >= self.length, False, {}


def make_counting(length: int = 10) -> gym.Env:
    return gym.wrappers.TimeLimit(CountingEnv(length), max_episode_steps=length * 2)


class RaisingEnv(CountingEnv):
    """Raises inside step() after ``fail_after`` steps (worker-failure tests)."""

    def __init__(self, fail_after: int = 50, length: int = 10):
        super().__init__(length)
        self.fail_after, self.total = fail_after, 0

    def step(self, action):
        self.total += 1
        if self.total > self.fail_after:
            raise RuntimeError(f"RaisingEnv: deliberate failure after {self.fail_after} steps")
        return super().step(action)


class SlowEnv(CountingEnv):
    """Sleeps in every step (signal tests: gives time to send a signal mid-run)."""

    def __init__(self, sleep_s: float = 0.002, length: int = 50):
        super().__init__(length)
        self.sleep_s = sleep_s

    def step(self, action):
        import time

        time.sleep(self.sleep_s)
        return super().step(action)
