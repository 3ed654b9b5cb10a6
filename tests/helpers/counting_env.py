"""``tests.helpers.counting_env:make``: CartPole from a factory that appends one line per call to ``log`` (the
calling process's pid), so a test counts how often a run builds its env, and in which processes."""

from __future__ import annotations

import os

import gymnasium as gym


def make(log: str) -> gym.Env:
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return gym.make("CartPole-v1")
