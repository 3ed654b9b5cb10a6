"""Envs that fail on purpose, for the failure tests (``env.id=tests.faulty_envs:<name>``)."""

from __future__ import annotations

import os
import signal

import gymnasium as gym


class _FailAfter(gym.Wrapper):
    def __init__(self, env: gym.Env, after: int, how: str):
        super().__init__(env)
        self.after, self.how, self.steps = after, how, 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.after:
            if self.how == "raise":
                raise RuntimeError(f"faulty env: failing on purpose after {self.after} steps")
            os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer: no traceback, no goodbye
        return self.env.step(action)


def raising_cartpole(after: int = 100) -> gym.Env:
    """CartPole whose step raises RuntimeError after ``after`` steps (per env)."""
    return _FailAfter(gym.make("CartPole-v1"), after, "raise")


def sigkill_cartpole(after: int = 100) -> gym.Env:
    """CartPole that SIGKILLs its own process after ``after`` steps (per env)."""
    return _FailAfter(gym.make("CartPole-v1"), after, "kill")
