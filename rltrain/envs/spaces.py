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
``env_spec`` describes an env's spaces for the model factory (an ``EnvSpec``); the multi-agent adapter
(envs/multiagent.py) describes each agent's with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rltrain.data.structs import MASK_KEY, EnvSpec, ObsSpace
from rltrain.envs.wrappers import box_shape, discrete_start
from rltrain.errors import ConfigError

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


def tuples_as_dicts(obs: Any, target: Any) -> Any:
    """``obs`` with each Tuple observation in it, at any depth, as the dict ``TupleAsDict`` makes of it: keyed
    "0", "1", ... by the element's index. ``target`` is what the observation becomes: the ``Dict`` space
    ``TupleAsDict`` declares, or a loaded policy's dict of arrays (api.py, which acts on the env's own
    observations); a tuple (or list) where ``target`` has a dict is a Tuple observation, a dict keeps the keys
    ``target`` has, and the rest is left as it is. One conversion for both, so a policy reads what it was
    trained on."""
    parts = target.spaces if isinstance(target, gym.spaces.Dict) else target
    if not isinstance(parts, dict):
        return obs
    if isinstance(obs, (tuple, list)):
        if len(obs) != len(parts):
            raise ValueError(f"a tuple of {len(obs)} elements where the space has {len(parts)}")
        obs = {str(i): o for i, o in enumerate(obs)}
    if not isinstance(obs, Mapping):
        return obs  # not a Dict / Tuple observation: the caller names what it expected
    return {k: tuples_as_dicts(obs[k], sub) for k, sub in parts.items()}


class TupleAsDict(gym.ObservationWrapper):
    """Tuple observations (at any depth) as Dicts keyed by the element's index ("0", "1", ...)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = _as_dict_space(env.observation_space)

    def observation(self, observation):
        return tuples_as_dicts(observation, self.observation_space)


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


def _describe_obs(space: gym.Space) -> ObsSpace:
    """A picklable description of an observation space; spaces no model reads are kept as ``unsupported``
    so the model factory can name the key (or the user can drop it with ``model.ignore_keys``)."""
    if isinstance(space, gym.spaces.Box):
        high = int(np.max(space.high)) if np.issubdtype(space.dtype, np.integer) and space.shape else None
        return ObsSpace("box", tuple(space.shape), space.dtype.name, name=str(space), high=high)
    if isinstance(space, gym.spaces.Discrete):
        return ObsSpace("discrete", (), space.dtype.name, n=int(space.n), start=int(space.start),
                        name=str(space))
    if isinstance(space, gym.spaces.MultiBinary):
        return ObsSpace("multi_binary", tuple(space.shape), space.dtype.name, name=str(space))
    if isinstance(space, gym.spaces.MultiDiscrete):
        if int(np.min(space.start)) != 0:
            return ObsSpace("unsupported", (), "", name=f"{space} with start={space.start.tolist()}")
        return ObsSpace("multi_discrete", tuple(space.shape), space.dtype.name, name=str(space),
                        nvec=tuple(int(n) for n in space.nvec.ravel()))
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):  # a Tuple keyed "0", "1", ... (TupleAsDict)
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        parts = tuple((str(k), _describe_obs(sub)) for k, sub in items)
        return ObsSpace("dict", (), "", parts=parts, name=str(space))
    return ObsSpace("unsupported", (), "", name=type(space).__name__)  # Text's repr spells out its charset


def stacked_frames(env: gym.Env, obs: ObsSpace) -> int | None:
    """K when the observation is a K-frame stack along its first axis: a reset-padded ``FrameStackObservation``
    among the env's wrappers whose stack axis is still the first one (what the replay buffer rebuilds stacks
    from, storing each frame once: data/frames.py), else None."""
    while env is not None:
        if isinstance(env, gym.wrappers.FrameStackObservation):
            k = int(env.stack_size)
            fits = obs.kind == "box" and len(obs.shape) >= 2 and obs.shape[0] == k >= 2
            return k if fits and env.padding_type == "reset" else None
        env = getattr(env, "env", None)
    return None


def env_spec(env: gym.Env, env_id: str) -> EnvSpec:
    obs_space, act_space = env.observation_space, env.action_space
    obs = _describe_obs(obs_space)
    if obs.kind == "unsupported":
        raise ConfigError(f"env.id={env_id}: observation space {obs.name} is not supported (Box, Discrete, "
                          "MultiDiscrete, MultiBinary or a Dict / Tuple of them); wrap the env to return one of "
                          "those (e.g. env.wrappers=[FlattenObservation] for a space of fixed size)")
    common = {"obs_dtype": obs.dtype, "obs_space": obs, "frame_stack": stacked_frames(env, obs)}
    if isinstance(act_space, gym.spaces.Discrete):
        if int(act_space.start) != 0:  # make_env shows it as Discrete(n) (DiscreteStart); an env built elsewhere
            raise ConfigError(f"env.id={env_id}: action space {act_space} with start={int(act_space.start)} is not "
                              "supported here; wrap the env to take actions from 0 (rltrain.envs.wrappers."
                              "DiscreteStart)")
        start = discrete_start(env)  # what the env adds to each index: the raw env's action is index + start
        return EnvSpec(env_id, obs.shape, "discrete", (), n_actions=int(act_space.n),
                       action_start=(start,) if start else (), **common)
    # the env's own dtype where rltrain's policies output another (wrappers.ActionDtype steps the env with it)
    own = act_space.dtype.name if isinstance(act_space, (gym.spaces.Box, gym.spaces.MultiDiscrete)) else ""
    if isinstance(act_space, gym.spaces.MultiDiscrete):
        return EnvSpec(env_id, obs.shape, "multi_discrete", tuple(act_space.shape),
                       nvec=tuple(int(n) for n in act_space.nvec.ravel()),
                       action_start=tuple(int(x) for x in act_space.start.ravel()),
                       env_action_dtype="" if own == "int64" else own, **common)
    if isinstance(act_space, gym.spaces.MultiBinary):
        return EnvSpec(env_id, obs.shape, "multi_binary", tuple(act_space.shape), **common)
    if isinstance(act_space, gym.spaces.Box):
        if np.issubdtype(act_space.dtype, np.integer):
            raise ConfigError(f"env.id={env_id}: action space {act_space} has integer values, and rltrain's "
                              "continuous policies output floats; wrap the env to take a MultiDiscrete (one "
                              "component per entry, nvec=high-low+1, start=low) or a float Box")
        # the policy acts on the flat vector; the env's own shape is recorded where it is not that vector: handed
        # it by make_env's BoxShape, or (a PettingZoo agent's raw space) by AgentEnv's translation (env_action)
        shape = box_shape(env)
        shape = tuple(act_space.shape) if shape is None and len(act_space.shape) != 1 else shape
        return EnvSpec(env_id, obs.shape, "box", (int(np.prod(act_space.shape)),), env_action_shape=shape,
                       action_low=tuple(float(x) for x in act_space.low.ravel()),
                       action_high=tuple(float(x) for x in act_space.high.ravel()),
                       env_action_dtype="" if own == "float32" else own, **common)
    raise ConfigError(f"env.id={env_id}: action space {act_space} is not supported (Discrete, MultiDiscrete, "
                      "MultiBinary or Box); wrap the env to take one of those (e.g. a Tuple of Discretes as "
                      "one MultiDiscrete)")
