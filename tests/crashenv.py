"""A CartPole that raises after ``crash_after`` steps (< 0: never): a real mid-training failure for sweep tests."""

from __future__ import annotations

import gymnasium as gym


class CrashingCartPole(gym.Wrapper):
    def __init__(self, crash_after: int = -1):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.crash_after, self.steps = crash_after, 0

    def step(self, action):
        self.steps += 1
        if 0 <= self.crash_after < self.steps:
            raise RuntimeError(f"CrashingCartPole: deliberate failure after {self.crash_after} steps")
        return self.env.step(action)


def cartpole(crash_after: int = -1) -> gym.Env:
    return CrashingCartPole(crash_after)
