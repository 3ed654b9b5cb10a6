"""Environment factory: Gymnasium ids or user import paths -> a lean vector env with same-step autoreset.

``VecEnv.step`` returns, for every env, the *true* next observation (``final_obs``, the terminal one
when an episode ended) and the observation to act on next (already reset). So every step the collector
records is a real transition: Gymnasium 1.x's default NEXT_STEP autoreset would instead hand back one
fake transition per episode boundary that has to be masked.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym

from rltrain.data.structs import EnvSpec, ObsSpace
from rltrain.envs.vector import AsyncVecEnv, VecEnv
from rltrain.errors import ConfigError, close_matches

_EXTRAS = {"Box2D": "box2d", "box2d": "box2d", "mujoco": "mujoco", "pygame": "box2d"}


def make_env(env_id: str, kwargs: dict[str, Any] | None = None, *, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gym.Env:
    """Build one env from a registered id or an import path ``package.module:ClassOrFactory``."""
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if ":" in env_id and env_id.split(":", 1)[0] and "/" not in env_id.split(":", 1)[0]:
        env = _make_from_import_path(env_id, kwargs)
        if max_episode_steps:
            env = gym.wrappers.TimeLimit(env, max_episode_steps)
        return env
    if env_id not in gym.registry:
        raise ConfigError(f"env.id: unknown Gymnasium env {env_id!r}{close_matches(env_id, gym.registry.keys())}"
                          " (or give an import path 'package.module:ClassOrFactory')")
    try:
        extra = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
        return gym.make(env_id, disable_env_checker=True, **extra, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        hint = next((f"pip install 'rltrain[{v}]'" for k, v in _EXTRAS.items() if k in str(err)), str(err))
        raise ConfigError(f"env.id={env_id} needs an extra that is not installed: {hint}") from None
    except TypeError as err:
        raise ConfigError(f"env.kwargs for {env_id}: {err}") from None


def _make_from_import_path(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    module_name, _, attr = env_id.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"env.id: cannot import {env_id!r}: {err}") from None
    try:
        env = factory(**kwargs)
    except TypeError as err:
        raise ConfigError(f"env.kwargs for {env_id}: {err}") from None
    if not isinstance(env, gym.Env):
        raise ConfigError(f"env.id: {env_id!r} returned {type(env).__name__}, not a gymnasium.Env")
    return env


def _describe_obs(space: gym.Space) -> ObsSpace:
    """A picklable description of an observation space; spaces no model reads are kept as ``unsupported``
    so the model factory can name the key (or the user can drop it with ``model.ignore_keys``)."""
    if isinstance(space, gym.spaces.Box):
        return ObsSpace("box", tuple(space.shape), space.dtype.name, name=str(space))
    if isinstance(space, gym.spaces.Discrete):
        return ObsSpace("discrete", (), space.dtype.name, n=int(space.n), start=int(space.start),
                        name=str(space))
    if isinstance(space, gym.spaces.MultiBinary):
        return ObsSpace("multi_binary", tuple(space.shape), space.dtype.name, name=str(space))
    if isinstance(space, gym.spaces.Dict):
        parts = tuple((str(k), _describe_obs(sub)) for k, sub in space.spaces.items())
        return ObsSpace("dict", (), "", parts=parts, name=str(space))
    return ObsSpace("unsupported", (), "", name=type(space).__name__)  # Text's repr spells out its charset


def env_spec(env: gym.Env, env_id: str) -> EnvSpec:
    obs_space, act_space = env.observation_space, env.action_space
    obs = _describe_obs(obs_space)
    if obs.kind == "unsupported":
        raise ConfigError(f"env.id={env_id}: observation space {obs.name} is not supported "
                          "(Box, Discrete, MultiBinary or a Dict of them); wrap the env to return one of those")
    common = {"obs_dtype": obs.dtype, "obs_space": obs}
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(env_id, obs.shape, "discrete", (), n_actions=int(act_space.n), **common)
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(env_id, obs.shape, "box", tuple(act_space.shape),
                       action_low=tuple(float(x) for x in act_space.low.ravel()),
                       action_high=tuple(float(x) for x in act_space.high.ravel()), **common)
    raise ConfigError(f"env.id={env_id}: action space {act_space} is not supported (Discrete or Box)")


def make_vector_env(env_id: str, num_envs: int, seeds: list[int] | tuple[int, ...], *,
                    kwargs: dict[str, Any] | None = None, max_episode_steps: int | None = None,
                    vectorization: str = "sync") -> VecEnv | AsyncVecEnv:
    """Build ``num_envs`` envs seeded with ``seeds``; ``vectorization`` is ``sync`` or ``async``."""
    if len(seeds) != num_envs:
        raise ValueError(f"need {num_envs} seeds, got {len(seeds)}")
    fn = functools.partial(make_env, env_id, kwargs, max_episode_steps=max_episode_steps)
    fn()  # fail fast, in this process, with a clear error
    if vectorization == "sync":
        return VecEnv([fn] * num_envs, list(seeds))
    if vectorization == "async":
        return AsyncVecEnv([fn] * num_envs, list(seeds))
    raise ConfigError(f"env.vectorization={vectorization!r} is not one of: sync, async")


@dataclass(frozen=True, kw_only=True)
class EnvFactory:
    """How this run builds its environments (the ``env`` config group, typed). Picklable: it travels to
    parallel agents, distributed ranks and actor processes, each of which builds its own envs from it."""

    id: str
    num_envs: int = 4
    vectorization: str = "sync"  # sync (one process, a plain list) | async (one subprocess per env)
    max_episode_steps: int | None = None  # None keeps the env's registered time limit
    kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make / the user's factory
    solved_return: float | None = None  # the conventional "solved" score, for reference only

    def make(self, *, render_mode: str | None = None) -> gym.Env:
        """One env (evaluation, video, spec discovery)."""
        return make_env(self.id, self.kwargs, max_episode_steps=self.max_episode_steps, render_mode=render_mode)

    def spec(self) -> EnvSpec:
        env = self.make()
        try:
            return env_spec(env, self.id)
        finally:
            env.close()

    def vector(self, seeds: list[int] | tuple[int, ...], *, num_envs: int | None = None) -> VecEnv | AsyncVecEnv:
        """``num_envs`` (default ``self.num_envs``) envs seeded with ``seeds``."""
        return make_vector_env(self.id, num_envs or self.num_envs, seeds, kwargs=self.kwargs,
                               max_episode_steps=self.max_episode_steps, vectorization=self.vectorization)

    def record(self) -> dict:
        """The plain dict this factory was built from (config.yaml, checkpoints)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
