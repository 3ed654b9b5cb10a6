"""Small learnable envs with masked, MultiDiscrete and MultiBinary action spaces, addressed as
``tests.helpers.space_envs:Name`` (env.id import paths).

- ``MultiDiscreteEnv``: MultiDiscrete actions; each component is rewarded for naming its target.
- ``MultiBinaryEnv``: MultiBinary actions; each bit is rewarded for copying the observed bit.
- ``StartDiscreteEnv``: ``Discrete(3, start=-2)`` actions (-2, -1, 0); the action equal to the observed target
  is rewarded, and ``step`` raises on any action outside the space (an index handed on unshifted).
- ``StrictDtypeEnv``: a float Box action space of another dtype than float32 (float64 by default, bounds that
  float32 rounds outward) whose ``step`` raises unless the action has the space's own dtype and lies in it, as
  an env that checks dtypes strictly does (Gymnasium's ``contains`` takes float32 for a float64 space).
- ``MaskedEnv``: Discrete (or MultiDiscrete, ``multi=True``) actions of which a random subset is legal each
  step; a legal action earns 1, an illegal one ends the episode with a penalty of -10. The observation shows
  the legal set, so an unmasked policy can learn it too, only slower. The mask is offered as ``source`` says:
  ``info`` (``info["action_mask"]``), ``method`` (``action_masks()``) or ``key`` (a Dict observation key).
  ``empty_at``: the step whose mask has no legal action (a broken env).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ILLEGAL_PENALTY = -10.0


class MultiDiscreteEnv(gym.Env):
    """obs: the targets one-hot [sum(nvec)]; action MultiDiscrete(nvec); reward: components right / count."""

    def __init__(self, nvec: tuple[int, ...] = (3, 4), length: int = 8):
        self.nvec = np.asarray(nvec, np.int64)
        self.action_space = spaces.MultiDiscrete(self.nvec)
        self.observation_space = spaces.Box(0.0, 1.0, (int(self.nvec.sum()),), np.float32)
        self.length, self.t = length, 0

    def _observe(self) -> np.ndarray:
        self.target = np.array([self.np_random.integers(n) for n in self.nvec])
        obs = np.zeros(int(self.nvec.sum()), np.float32)
        obs[np.concatenate([[0], np.cumsum(self.nvec)[:-1]]) + self.target] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action)), action
        reward = float(np.mean(np.asarray(action) == self.target))
        self.t += 1
        return self._observe(), reward, False, self.t >= self.length, {}


class MultiBinaryEnv(gym.Env):
    """obs: n random bits; action MultiBinary(n); reward: the share of bits copied."""

    def __init__(self, n: int = 4, length: int = 8):
        self.action_space = spaces.MultiBinary(n)
        self.observation_space = spaces.Box(0.0, 1.0, (n,), np.float32)
        self.n, self.length, self.t = n, length, 0

    def _observe(self) -> np.ndarray:
        self.bits = self.np_random.integers(0, 2, self.n).astype(np.float32)
        return self.bits.copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.int8)), action
        reward = float(np.mean(np.asarray(action) == self.bits))
        self.t += 1
        return self._observe(), reward, False, self.t >= self.length, {}


class StartDiscreteEnv(gym.Env):
    """obs: the target one-hot [n]; action Discrete(n, start); reward 1 for the target's value (start + its
    index). ``step`` raises ValueError unless ``action_space.contains(action)``."""

    def __init__(self, n: int = 3, start: int = -2, length: int = 8):
        self.action_space = spaces.Discrete(n, start=start)
        self.observation_space = spaces.Box(0.0, 1.0, (n,), np.float32)
        self.n, self.start, self.length, self.t = n, start, length, 0

    def _observe(self) -> np.ndarray:
        self.target = int(self.np_random.integers(self.n))
        return np.eye(self.n, dtype=np.float32)[self.target]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        reward = float(int(action) == self.start + self.target)
        self.t += 1
        return self._observe(), reward, False, self.t >= self.length, {}


class StrictDtypeEnv(gym.Env):
    """obs: a target in [-1, 1]^2 (``obs_dtype``); action Box(-0.1, 0.3, (2,), ``dtype``); reward: minus the
    distance to the target clipped into the action range. See the module docstring for ``step``."""

    def __init__(self, dtype: str = "float64", obs_dtype: str = "float64", length: int = 8):
        self.action_space = spaces.Box(-0.1, 0.3, (2,), np.dtype(dtype))
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.dtype(obs_dtype))
        self.length, self.t = length, 0

    def _observe(self) -> np.ndarray:
        self.target = self.np_random.uniform(-1.0, 1.0, 2).astype(self.observation_space.dtype)
        return self.target.copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        space = self.action_space
        if not (isinstance(action, np.ndarray) and action.dtype == space.dtype and space.contains(action)):
            raise ValueError(f"action {action!r} ({getattr(action, 'dtype', type(action))}) is not in {space}")
        reward = self._reward(action)
        self.t += 1
        return self._observe(), reward, False, self.t >= self.length, {}

    def _reward(self, action: np.ndarray) -> float:
        space = self.action_space
        return -float(np.abs(action - np.clip(self.target, space.low, space.high)).sum())


class MaskedEnv(gym.Env):
    """See the module docstring. An episode's return is ``length`` exactly when no illegal action was taken
    (an illegal one ends it below 0), which tests read from any trainer's episode returns."""

    def __init__(self, n: int = 6, source: str = "info", multi: bool = False, length: int = 20,
                 empty_at: int | None = None):
        self.sizes = [n, n - 2] if multi else [n]
        self.action_space = spaces.MultiDiscrete(self.sizes) if multi else spaces.Discrete(n)
        vec = spaces.Box(0.0, 1.0, (sum(self.sizes),), np.float32)
        self.observation_space = spaces.Dict({"legal": vec, "action_mask": spaces.MultiBinary(sum(self.sizes))}) \
            if source == "key" else vec
        self.source, self.multi, self.length, self.empty_at = source, multi, length, empty_at
        self.t = 0
        if source == "method":  # only this source offers the method (an attribute lookup finds it)
            self.action_masks = lambda: self.legal.astype(bool)

    def _draw(self) -> None:
        parts = []
        for n in self.sizes:
            legal = self.np_random.random(n) < 0.4
            legal[self.np_random.integers(n)] = True  # at least one legal action per component
            parts.append(legal)
        self.legal = np.concatenate(parts).astype(np.int8)
        if self.empty_at is not None and self.t == self.empty_at:
            self.legal[:] = 0

    def _emit(self):
        vec = self.legal.astype(np.float32)
        obs = {"legal": vec, "action_mask": self.legal.copy()} if self.source == "key" else vec
        info = {"action_mask": self.legal.astype(bool)} if self.source == "info" else {}
        return obs, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._emit()

    def step(self, action):
        picks = np.atleast_1d(np.asarray(action))
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        legal = all(self.legal[o + int(a)] for o, a in zip(offsets, picks, strict=True))
        self.t += 1
        if not legal:
            self._draw()
            obs, info = self._emit()
            return obs, ILLEGAL_PENALTY, True, False, info
        self._draw()
        obs, info = self._emit()
        return obs, 1.0, False, self.t >= self.length, info
