"""Fake envs for tests/test_envs.py.

Importing this module registers ``RltrainTest/Lives-v0`` (so ``tests.helpers.lives_env:RltrainTest/Lives-v0``
exercises Gymnasium's ``module:EnvId`` form). ``LivesEnv`` looks like an ALE game to our Atari wrappers:
``unwrapped.ale.lives()`` and ``unwrapped.get_action_meanings()``; its rewards are large and signed, so
clipped and raw returns differ, and it records every raw reward per game.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "RltrainTest/Lives-v0"


class _Ale:
    def __init__(self) -> None:
        self.remaining = 0

    def lives(self) -> int:
        return self.remaining


class LivesEnv(gym.Env):
    """A game of ``lives`` lives; each life lasts ``life_steps`` steps; rewards in {-3, 0, 5} at random.

    ``games`` holds the raw rewards of every game so far (a new list per real reset); ``fires`` counts
    the FIRE presses that came right after a reset.
    """

    metadata = {"render_modes": []}

    def __init__(self, lives: int = 3, life_steps: int = 7, with_fire: bool = True):
        self.observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.ale = _Ale()
        self.n_lives, self.life_steps, self.with_fire = lives, life_steps, with_fire
        self.games: list[list[float]] = []
        self.fires = 0
        self._t = 0
        self._just_reset = False

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT"] if self.with_fire else ["NOOP", "UP", "RIGHT"]

    def _obs(self) -> np.ndarray:
        return np.array([self.ale.remaining, self._t % 256], np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ale.remaining, self._t, self._just_reset = self.n_lives, 0, True
        self.games.append([])
        return self._obs(), {}

    def step(self, action):
        if self._just_reset and self.with_fire and int(action) == 1:
            self.fires += 1
        self._just_reset = False
        self._t += 1
        reward = float(self.np_random.choice([-3.0, 0.0, 5.0]))
        self.games[-1].append(reward)
        if self._t % self.life_steps == 0:
            self.ale.remaining -= 1
        return self._obs(), reward, self.ale.remaining == 0, False, {"lives": self.ale.remaining}


def make_lives_env(lives: int = 3, life_steps: int = 7) -> LivesEnv:
    """A factory for the ``package.module:Factory`` form of ``env.id``."""
    return LivesEnv(lives=lives, life_steps=life_steps)


def needs_mujoco() -> gym.Env:
    """A factory whose simulator is missing, as Gymnasium reports it."""
    raise gym.error.DependencyNotInstalled('MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`')


class RewardLog(gym.Wrapper):
    """Records every reward that passes through (put it first in ``env.wrappers`` to see raw rewards); ``label``:
    a keyword argument, for the tests that hand one to a wrapper named by its import path."""

    def __init__(self, env: gym.Env, label: str = ""):
        super().__init__(env)
        self.rewards: list[float] = []
        self.label = label

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.rewards.append(float(reward))
        return obs, reward, terminated, truncated, info


gym.register(id=ENV_ID, entry_point=LivesEnv)


class RenderedLives(LivesEnv):
    """``LivesEnv`` that renders (a grey frame): for the evaluation videos of a game of several lives."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.render_mode = render_mode

    def render(self):
        return np.full((64, 64, 3), 128, np.uint8)
