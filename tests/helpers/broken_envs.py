"""Envs that misbehave mid-run, for the fault tests (env.id=tests.helpers.broken_envs:...).

Each is a small counting env that behaves for ``after`` steps (per instance), then hangs, raises, or returns
what its spaces forbid; and two legitimate corner cases: a return that never varies, and a NaN that only
evaluation meets (the episode reset with the eval seed); and an env that raises in evaluation only.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np


class _Counting(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, after: int = 300, length: int = 10, marker: str = ""):
        self.after, self.length, self.marker = after, length, marker
        self.t, self.count = 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def bad(self) -> bool:
        self.count += 1
        return self.count > self.after

    def good_step(self, action):
        self.t += 1
        return np.full(3, self.t / self.length, np.float32), float(action), self.t >= self.length, False, {}


class Hanging(_Counting):
    """``step`` never returns after ``after`` steps (sleeps; writes its pid to ``marker`` first)."""

    def step(self, action):
        if self.bad():
            if self.marker:
                with open(self.marker, "w") as f:
                    f.write(str(os.getpid()))
            while True:
                time.sleep(3600)
        return self.good_step(action)


class Raising(_Counting):
    def step(self, action):
        if self.bad():
            raise RuntimeError("Raising: the simulator lost its connection")
        return self.good_step(action)


class BadShape(_Counting):
    """Returns a 4-element observation from a 3-element Box space."""

    def step(self, action):
        obs, *rest = self.good_step(action)
        return (np.zeros(4, np.float32) if self.bad() else obs), *rest


class BadDtype(_Counting):
    """Returns an observation of strings."""

    def step(self, action):
        obs, *rest = self.good_step(action)
        return (np.array(["a", "b", "c"]) if self.bad() else obs), *rest


class TextReward(_Counting):
    """Returns a reward that is not a number."""

    def step(self, action):
        obs, reward, *rest = self.good_step(action)
        return obs, ("lots" if self.bad() else reward), *rest


class ArrayReward(_Counting):
    """Returns its reward as a one-element array (a common slip in one's own env)."""

    def step(self, action):
        obs, reward, *rest = self.good_step(action)
        return obs, (np.array([reward]) if self.bad() else reward), *rest


class ZeroReward(_Counting):
    """A legitimate env whose return never varies (0): explained variance is NaN by definition, not a fault."""

    def step(self, action):
        obs, _, *rest = self.good_step(action)
        return obs, 0.0, *rest


class EvalNaN(_Counting):
    """NaN rewards only in episodes reset with seed ``nan_seed`` (the run's eval seed): training never sees one."""

    def __init__(self, nan_seed: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.nan_seed, self.poisoned = nan_seed, False

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.poisoned = seed == self.nan_seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, *rest = self.good_step(action)
        return obs, (float("nan") if self.poisoned else reward), *rest


class EvalRaising(_Counting):
    """Raises in ``step`` only in episodes reset with one of ``seeds`` (runs' eval seeds): training never does, so
    the run's first failure is its evaluation env's."""

    def __init__(self, seeds: tuple[int, ...] = (), **kwargs):
        super().__init__(**kwargs)
        self.seeds, self.poisoned = {int(s) for s in seeds}, False

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.poisoned = seed in self.seeds
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.poisoned:
            raise RuntimeError("EvalRaising: the evaluation level is missing")
        return self.good_step(action)
