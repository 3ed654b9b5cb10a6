"""Envs with the observation spaces the model family must read (images in either layout and any pixel
dtype, Dicts with Discrete / MultiBinary / Text keys, a bare Text space), addressed as
``tests.helpers.obs_envs:Name`` (env.id import paths). Observations are random draws from the space."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _RandomObsEnv(gym.Env):
    """Episodes of ``length`` steps whose observations are ``observation_space.sample()``; reward 1 per step."""

    def __init__(self, observation_space: gym.Space, *, continuous: bool = False, n_actions: int = 3,
                 length: int = 8):
        self.observation_space = observation_space
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32) if continuous else spaces.Discrete(n_actions)
        self.length, self.t = length, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, False, self.t >= self.length, {}


class ImageEnv(_RandomObsEnv):
    """Image observations of any ``shape`` (HWC or CHW) and ``dtype`` (uint8, bool, float32)."""

    def __init__(self, shape: tuple[int, ...] = (84, 84, 4), dtype: str = "uint8", continuous: bool = False):
        dt = np.dtype(dtype)
        high = 255 if dt == np.uint8 else 1
        super().__init__(spaces.Box(0, high, tuple(shape), dt), continuous=continuous)


class ScalarEnv(_RandomObsEnv):
    """A Box observation of shape (): one number, batched as [B] (no feature axis to flatten)."""

    def __init__(self, continuous: bool = False):
        super().__init__(spaces.Box(-1.0, 1.0, (), np.float32), continuous=continuous)


class UnboundedActions(_RandomObsEnv):
    """Float vector observations and a Box action space with infinite bounds."""

    def __init__(self):
        super().__init__(spaces.Box(-1.0, 1.0, (3,), np.float32))
        self.action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)


class DictEnv(_RandomObsEnv):
    """Dict observation: an HWC uint8 image, a float vector, a Discrete (values -1, 0, 1) and a MultiBinary
    key; ``text=True`` adds a Text key ``mission`` (which no encoder reads); ``nested=True`` adds a Dict key
    ``arm`` holding a float vector ``joints`` and a Discrete ``gripper``."""

    def __init__(self, text: bool = False, continuous: bool = False, image_shape: tuple[int, ...] = (12, 12, 3),
                 nested: bool = False):
        parts: dict[str, gym.Space] = {
            "pixels": spaces.Box(0, 255, tuple(image_shape), np.uint8),
            "state": spaces.Box(-1.0, 1.0, (5,), np.float32),
            "mode": spaces.Discrete(3, start=-1),
            "flags": spaces.MultiBinary(4),
        }
        if text:
            parts["mission"] = spaces.Text(12)
        if nested:
            parts["arm"] = spaces.Dict({"joints": spaces.Box(-2.0, 2.0, (3,), np.float32),
                                        "gripper": spaces.Discrete(2)})
        super().__init__(spaces.Dict(parts), continuous=continuous)


class VectorDictEnv(_RandomObsEnv):
    """A goal-conditioned Dict with no image: ``observation``, ``achieved_goal`` and ``desired_goal`` float vectors
    (Gymnasium-Robotics' layout) and a Discrete ``phase``."""

    def __init__(self, continuous: bool = True):
        super().__init__(spaces.Dict({"observation": spaces.Box(-1.0, 1.0, (6,), np.float32),
                                      "achieved_goal": spaces.Box(-1.0, 1.0, (3,), np.float32),
                                      "desired_goal": spaces.Box(-1.0, 1.0, (3,), np.float32),
                                      "phase": spaces.Discrete(2)}), continuous=continuous)


class TextEnv(_RandomObsEnv):
    """A bare Text observation space: no model reads it."""

    def __init__(self):
        super().__init__(spaces.Text(8))


class PixelSign(gym.Env):
    """A one-step task solved only by reading pixels: a bool frame ``side x side x 1`` lit on its left or right
    half (drawn at random); the action in [-1, 1] scores ``+a`` for left and ``-a`` for right. Random acting
    averages 0, the best policy 1 (SAC from pixels learns it in a few hundred updates)."""

    def __init__(self, side: int = 6):
        self.side = side
        self.observation_space = spaces.Box(0, 1, (side, side, 1), np.bool_)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _draw(self):
        self.sign = 1.0 if self.np_random.random() < 0.5 else -1.0
        frame = np.zeros(self.observation_space.shape, np.bool_)
        half = self.side // 2
        frame[:, :half] = self.sign > 0
        frame[:, half:] = self.sign < 0
        return frame

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        reward = self.sign * float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
        return self._draw(), reward, True, False, {}
