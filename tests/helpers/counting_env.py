"""``tests.helpers.counting_env:make``: CartPole from a factory that appends one line per call to ``log`` (the
calling process's pid), so a test counts how often a run builds its env, and in which processes."""

from __future__ import annotations

import os

import gymnasium as gym


def make(log: str) -> gym.Env:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return gym.make("CartPole-v1")


class SeedLogging(gym.Wrapper):
    """CartPole that appends each seed its ``reset`` is given to ``log`` (one line each): which seeds a run's
    envs start from, session by session."""

    def __init__(self, log: str):
        super().__init__(gym.make("CartPole-v1"))
        self.log = log

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            with open(self.log, "a") as f:
                f.write(f"{seed}\n")
        return self.env.reset(seed=seed, options=options)
