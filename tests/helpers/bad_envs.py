"""Envs that break the learner's input or fail to start, for the fault tests (env.id=tests.helpers.bad_envs:...).

Each is CartPole until its ``after``-th step (counted per env instance), then turns bad, so the run writes
finite checkpoints first and the test can check that the last of them survives the failure intact.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


class _LateCartPole(CartPoleEnv):
    """CartPole that counts its steps over episodes; ``bad`` says whether this step misbehaves."""

    def __init__(self, after: int = 600, value: float = float("nan")):
        super().__init__()
        self.after, self.value, self.count = after, value, 0

    def bad(self) -> bool:
        self.count += 1
        return self.count > self.after


class NaNObservation(_LateCartPole):
    """Observation element 2 becomes ``value`` (NaN by default) after ``after`` steps."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.bad():
            obs = obs.copy()
            obs[2] = self.value
        return obs, reward, terminated, truncated, info


class NaNReward(_LateCartPole):
    """The reward becomes ``value`` (NaN by default) after ``after`` steps."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, self.value if self.bad() else reward, terminated, truncated, info


class RaisingReset(gym.Env):
    """``reset`` raises: the error must reach the user as one line naming the env."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("simulator license server unreachable")

    def step(self, action):
        raise AssertionError("step() before reset()")


def needs_simulator(**kwargs) -> gym.Env:
    """A user factory whose simulator is missing, as Gymnasium's own envs report it."""
    raise gym.error.DependencyNotInstalled('fancysim is not installed, run `pip install "fancysim>=2"`')
