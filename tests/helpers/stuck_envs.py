"""Envs for the stop and range fault tests (env.id=tests.helpers.stuck_envs:...).

``NeverEnds``: no episode ever ends and it registers no time limit (some of Gymnasium's own envs register
none); it writes its pid to ``marker`` when an episode is reset with ``marker_seed`` (the run's eval seed:
the final evaluation has begun). ``BuildHangs``: its constructor never returns once the run is live
(``summary.json`` in ``run_dir`` says running: the trainer's own env construction, not the pre-flight look),
or ``always``; it writes its pid to ``marker`` first.
``OutOfBox``: an integer Box env whose observation leaves the declared range (or its dtype) after ``after``
steps.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np


class NeverEnds(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, marker: str = "", marker_seed: int = -1):
        self.marker, self.marker_seed, self.t = marker, marker_seed, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.marker and seed is not None and seed == self.marker_seed:
            Path(self.marker).write_text(str(os.getpid()))
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(3, (self.t % 10) / 10, np.float32), 1.0, False, False, {}


class BuildHangs(NeverEnds):
    def __init__(self, run_dir: str = "", marker: str = "", always: bool = False):
        super().__init__()
        try:
            live = json.loads(Path(run_dir, "summary.json").read_text()).get("status") == "running"
        except (OSError, ValueError):
            live = False
        if live or always:
            if marker:
                Path(marker).write_text(str(os.getpid()))
            while True:
                time.sleep(3600)


class OutOfBox(gym.Env):
    """A ``Box(0, high, (3,), dtype)`` observation; after ``after`` steps element 1 becomes ``bad``, returned
    as an ``int64`` array (so it does not fit a uint8 space) or, with ``same_dtype``, in the space's dtype."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, after: int = 300, bad: int = 300, high: int = 255, dtype: str = "uint8",
                 same_dtype: bool = False):
        self.observation_space = gym.spaces.Box(0, high, (3,), np.dtype(dtype))
        self.after, self.bad, self.same_dtype, self.count, self.t = after, bad, same_dtype, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, self.observation_space.dtype), {}

    def step(self, action):
        self.count += 1
        self.t += 1
        obs = np.array([self.t % 5, 1, 2], np.int64)
        if self.count > self.after:
            obs[1] = self.bad
        if self.same_dtype or self.count <= self.after:
            obs = obs.astype(self.observation_space.dtype)
        return obs, float(action), self.t >= 10, False, {}


class BareAssert(NeverEnds):
    """Its constructor fails a bare ``assert`` (an exception without a message)."""

    def __init__(self, size: int = 0):
        super().__init__()
        assert size > 0


class ResetFails(NeverEnds):
    """Episodes of ``length`` steps; its ``reset()`` raises once it has reset ``after`` times (per instance)."""

    def __init__(self, after: int = 3, length: int = 10):
        super().__init__()
        self.after, self.length, self.resets = after, length, 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.resets > self.after:
            raise RuntimeError("ResetFails: the level file is gone")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, self.t >= self.length, truncated, info
