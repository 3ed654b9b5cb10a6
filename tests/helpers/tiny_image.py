"""A tiny fake image env for the replay tests: random frames of any dtype, random episode ends.

Each step shows a fresh random frame [H, W] (uint8, bool or float32), so a stack rebuilt from the wrong
frames is caught. Episodes terminate with probability ``p_terminate`` per step and are truncated after
``max_steps`` (both kinds of ends occur in a few dozen steps). Wrap it in gymnasium's
``FrameStackObservation`` for [K, H, W] stacks.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class TinyImageEnv(gym.Env):
    metadata: dict = {"render_modes": []}

    def __init__(self, shape: tuple[int, ...] = (3, 4), dtype: str = "uint8", p_terminate: float = 0.15,
                 max_steps: int = 7):
        self.dtype = np.dtype(dtype)
        if self.dtype == np.uint8:
            self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        elif self.dtype == np.bool_:
            self.observation_space = gym.spaces.Box(0, 1, shape, np.bool_)
        else:
            self.observation_space = gym.spaces.Box(-1.0, 1.0, shape, self.dtype)
        self.action_space = gym.spaces.Discrete(3)
        self.shape, self.p_terminate, self.max_steps = tuple(shape), p_terminate, max_steps
        self.t = 0

    def _frame(self) -> np.ndarray:
        if self.dtype == np.uint8:
            return self.np_random.integers(0, 256, self.shape, dtype=np.uint8)
        if self.dtype == np.bool_:
            return self.np_random.random(self.shape) < 0.5
        return self.np_random.uniform(-1.0, 1.0, self.shape).astype(self.dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < self.p_terminate)
        truncated = not terminated and self.t >= self.max_steps
        return self._frame(), float(action) - 1.0, terminated, truncated, {}
