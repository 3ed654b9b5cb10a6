"""The observation plumbing rltrain adds inside every env, after ``env.wrappers``: Tuple observations as Dicts,
and an env's action mask as a Dict observation key.

- ``TupleAsDict``: a ``Tuple`` observation space (at any depth) becomes a ``Dict`` keyed "0", "1", ..., so
  Blackjack-v1's (Discrete(32), Discrete(11), Discrete(2)) is encoded like a Dict: one encoder per element,
  Discrete elements one-hot (``models/encoders.py``), and stored, shipped and replayed like one.
- ``ActionMaskObservation``: invalid-action masking (Huang & Ontanon 2022, "A Closer Look at Invalid Action
  Masking in Policy Gradient Algorithms"). An env offers a mask in one of three ways: ``info["action_mask"]``
  (Gymnasium's Taxi), a Dict observation key ``action_mask`` (PettingZoo-style), or an ``action_masks()``
  method (sb3-contrib's MaskablePPO convention). This wrapper turns each into the top-level observation key
  ``MASK_KEY`` (int8, 1 = legal; MultiDiscrete: each component's mask, concatenated), so the mask travels with
  the observation through rollouts, replay, actor pipes, lag and V-trace, and the policy reads it where it
  acts and learns. A mask that leaves some component without a legal action raises: the vector env reports
  it in one line naming the env index and its step.

``mask_source`` finds which way an env offers its mask (building on a throwaway env: ``info`` needs a reset).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rltrain.data.structs import MASK_KEY

MASK_SOURCES = ("key", "info", "method")


def has_tuple(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Tuple):
        return True
    if isinstance(space, gym.spaces.Dict):
        return any(has_tuple(s) for s in space.spaces.values())
    return False


def _as_dict_space(space: gym.Space) -> gym.Space:
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Dict({str(i): _as_dict_space(s) for i, s in enumerate(space.spaces)})
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: _as_dict_space(s) for k, s in space.spaces.items()})
    return space


def _as_dict(space: gym.Space, obs: Any) -> Any:
    if isinstance(space, gym.spaces.Tuple):
        return {str(i): _as_dict(s, o) for i, (s, o) in enumerate(zip(space.spaces, obs, strict=True))}
    if isinstance(space, gym.spaces.Dict):
        return {k: _as_dict(s, obs[k]) for k, s in space.spaces.items()}
    return obs


class TupleAsDict(gym.ObservationWrapper):
    """Tuple observations (at any depth) as Dicts keyed by the element's index ("0", "1", ...)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._inner = env.observation_space
        self.observation_space = _as_dict_space(env.observation_space)

    def observation(self, observation):
        return _as_dict(self._inner, observation)


def mask_size(action_space: gym.Space) -> int | None:
    """Entries of a mask for ``action_space``: n (Discrete), sum(nvec) (MultiDiscrete), None (no masks)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    return None


def mask_source(env: gym.Env, info: dict | None = None) -> str | None:
    """How ``env`` offers an action mask: "key", "method", "info" or None. ``info``: what the env's reset
    returned, when the caller has reset it already (else it is reset here)."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces:
        return "key"
    try:
        if callable(env.get_wrapper_attr("action_masks")):
            return "method"
    except AttributeError:
        pass
    if info is None:
        _, info = env.reset(seed=0)
    return "info" if isinstance(info, dict) and MASK_KEY in info else None


class ActionMaskObservation(gym.Wrapper):
    """Puts the env's action mask into the observation under ``MASK_KEY`` (see the module docstring).

    ``source``: "key" (already there: checked), "info", "method", or "drop" (``algo.action_mask=off`` on an env
    whose Dict observation has the key: removed, so nothing reads it). A non-Dict observation becomes
    ``{"obs": observation, "action_mask": mask}``."""

    def __init__(self, env: gym.Env, source: str):
        super().__init__(env)
        self.source = source
        inner = env.observation_space
        self._wrap = not isinstance(inner, gym.spaces.Dict)
        parts = {"obs": inner} if self._wrap else {k: s for k, s in inner.spaces.items() if k != MASK_KEY}
        self.size = mask_size(env.action_space)
        if source != "drop":
            if self.size is None:
                raise ValueError(f"action masks apply to Discrete and MultiDiscrete actions, not {env.action_space}")
            parts[MASK_KEY] = gym.spaces.MultiBinary(self.size)
        self.observation_space = gym.spaces.Dict(parts)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._observe(obs, info, ended=False), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(obs, info, ended=terminated or truncated), reward, terminated, truncated, info

    def _observe(self, obs, info: dict, *, ended: bool) -> dict:
        out = {"obs": obs} if self._wrap else {k: v for k, v in obs.items() if k != MASK_KEY}
        if self.source == "drop":
            return out
        if self.source == "key":
            raw = obs[MASK_KEY]
        elif self.source == "method":
            raw = self.env.get_wrapper_attr("action_masks")()
        else:
            raw = info.get(MASK_KEY)
            if raw is None:
                if not ended:  # a terminal observation is never acted on: its mask may be absent
                    raise ValueError(f"info has no {MASK_KEY!r} on this step, though the env gave one before")
                raw = np.ones(self.size, np.int8)
        out[MASK_KEY] = self._checked(raw)
        return out

    def _checked(self, raw) -> np.ndarray:
        parts = raw if isinstance(raw, (tuple, list)) and raw and np.ndim(raw[0]) == 1 else [raw]
        mask = np.concatenate([np.asarray(p).reshape(-1) for p in parts]).astype(np.int8)
        if mask.shape != (self.size,):
            raise ValueError(f"action mask of {mask.size} entries; the action space {self.env.action_space} "
                             f"needs {self.size}")
        space = self.env.action_space
        sizes = [int(n) for n in np.ravel(space.nvec)] if isinstance(space, gym.spaces.MultiDiscrete) \
            else [self.size]
        at = 0
        for i, n in enumerate(sizes):
            if not mask[at:at + n].any():
                where = f" for component {i}" if len(sizes) > 1 else ""
                raise ValueError(f"action mask has no legal action{where}")
            at += n
        return mask
