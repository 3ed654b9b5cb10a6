"""The ``env.wrappers`` list and rltrain's own Atari wrappers.

``env.wrappers`` is an ordered list applied inside every env (first entry innermost), so the sync and
async vector backends, evaluation envs and actor processes all see the same env. Each entry is a name or
``{name: {kwargs}}``; a name is one of ours (``FireReset``, ``EpisodicLife``, ``SignReward``,
``VelocityMask``), a class of ``gymnasium.wrappers`` (``AtariPreprocessing``, ``FrameStackObservation``,
``ClipReward``, ...) or an import path ``package.module:Wrapper``.

The real game score. Learning wrappers change what the agent sees as an episode and a reward:
``EpisodicLife`` ends an episode at every life loss and ``SignReward`` clips rewards to {-1, 0, 1}
(Mnih et al. 2015, "Human-level control through deep RL", Methods). The score that rltrain logs,
evaluates and stops on must still be the game's: unclipped and summed over all lives, as CleanRL and SB3
report it. So whenever a wrapper list is given, ``make_env`` puts a ``ScoreRecorder`` directly around the
raw env (below every wrapper: it sees raw rewards and only real game ends) and a ``ScoreReport``
outermost, which puts ``info["real_score"]`` (float) and ``info["real_length"]`` (agent steps) into the
step at which a real game ended. ``VecEnv.pop_real_episodes`` gathers them for the collector.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rltrain.errors import ConfigError, close_matches


class ScoreRecorder(gym.Wrapper):
    """Innermost: sums the raw reward of each real game (all lives) and queues it when the game ends."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score = 0.0
        self.finished: deque[float] = deque()  # scores of games that ended and were not reported yet

    def reset(self, **kwargs):
        self.score = 0.0  # only a real reset reaches this wrapper: EpisodicLife steps instead
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        if terminated or truncated:
            self.finished.append(self.score)
            self.score = 0.0
        return obs, reward, terminated, truncated, info


class ScoreReport(gym.Wrapper):
    """Outermost: reports the recorder's finished games in ``info`` and counts their length in agent steps.

    A game can end inside an outer wrapper's reset (a no-op step of ``EpisodicLife``); reset infos are
    not read by the vector envs, so such a score is reported at the next step instead (one per step).
    """

    def __init__(self, env: gym.Env, recorder: ScoreRecorder):
        super().__init__(env)
        self.recorder = recorder
        self.length = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if kwargs.get("seed") is not None:  # a reseed starts a fresh game: drop any unreported score
            self.recorder.finished.clear()
            self.length = 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.length += 1
        if self.recorder.finished:
            info = {**info, "real_score": self.recorder.finished.popleft(), "real_length": self.length}
            self.length = 0
        return obs, reward, terminated, truncated, info


class SignReward(gym.RewardWrapper):
    """Reward -> sign(reward) in {-1, 0, 1}: one learning rate for every game (Mnih et al. 2015, Methods)."""

    def reward(self, reward):
        return float(np.sign(reward))


def _ale(env: gym.Env, wrapper: str):
    ale = getattr(env.unwrapped, "ale", None)
    if ale is None:
        raise ConfigError(f"env.wrappers: {wrapper} needs an ALE (Atari) env, got "
                          f"{type(env.unwrapped).__name__}; remove it from env.wrappers")
    return ale


class FireReset(gym.Wrapper):
    """Presses FIRE after every reset in games that need it to start (Breakout launches the ball on FIRE).

    Without it a policy can idle for the whole episode without seeing play (baselines' FireResetEnv).
    A game whose action set has no FIRE passes through unchanged.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        _ale(env, "FireReset")
        meanings = env.unwrapped.get_action_meanings()
        self.fire = meanings.index("FIRE") if "FIRE" in meanings else None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if self.fire is None:
            return obs, info
        obs, _, terminated, truncated, info = self.env.step(self.fire)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class EpisodicLife(gym.Wrapper):
    """Ends the learning episode at each life loss; the game itself resets only at game over.

    A lost life then costs the value of the remaining game, which speeds up learning (Mnih et al. 2015,
    Methods). Resets between lives step a no-op instead of resetting, so the game (and its score, see
    ``ScoreRecorder``) carries on.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.ale = _ale(env, "EpisodicLife")
        self.lives = 0
        self.real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.real_done = terminated or truncated
        lives = self.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.real_done or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)  # action 0 is NOOP in every ALE game
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.real_done = False
        self.lives = self.ale.lives()
        return obs, info


class VelocityMask(gym.ObservationWrapper):
    """Zeroes the observation entries ``indices`` (the velocities), making the env partially observable:
    a feed-forward policy then has to act on positions alone, a recurrent one can infer the velocities from
    its memory. rl-baselines3-zoo's ``MaskVelocityWrapper`` (CartPoleNoVel-v1: entries 1 and 3,
    PendulumNoVel-v1: entry 2) multiplies by such a 0/1 mask; the observation space stays the same."""

    def __init__(self, env: gym.Env, indices: list[int] | tuple[int, ...]):
        super().__init__(env)
        shape = env.observation_space.shape
        if not isinstance(env.observation_space, gym.spaces.Box) or len(shape) != 1:
            raise ConfigError(f"env.wrappers: VelocityMask needs a flat Box observation, got {env.observation_space}; "
                              "remove it from env.wrappers")
        bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, int) or not -shape[0] <= i < shape[0]]
        if bad or not indices:
            raise ConfigError(f"env.wrappers: VelocityMask indices={list(indices)}: each must be an integer index "
                              f"into the observation of size {shape[0]}, e.g. {{VelocityMask: {{indices: [1, 3]}}}}")
        self.mask = np.ones(shape, env.observation_space.dtype)
        self.mask[list(indices)] = 0

    def observation(self, observation):
        return observation * self.mask


OURS: dict[str, type[gym.Wrapper]] = {"FireReset": FireReset, "EpisodicLife": EpisodicLife,
                                      "SignReward": SignReward, "VelocityMask": VelocityMask}


class IndexShift:
    """The policy's index 0..n-1 -> a ``Discrete(n, start=s)`` space's own value ``index + s``, in its dtype (what
    ``DiscreteStart`` does for a single-agent env, for a multi-agent env's agent). A plain class (no closures):
    envs are pickled."""

    def __init__(self, space: gym.spaces.Discrete):
        self.start, self.type = int(space.start), space.dtype.type

    def __call__(self, action):
        return self.type(int(action) + self.start)


# what rltrain's policies hand an env for each action space (``EnvSpec.action_dtype``); ActionCast casts the rest
_SENT = ((gym.spaces.Box, np.dtype(np.float32)), (gym.spaces.MultiDiscrete, np.dtype(np.int64)),
         (gym.spaces.MultiBinary, np.dtype(np.int8)))


def _sent_dtype(space: gym.Space) -> np.dtype | None:
    if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
        return None  # an integer Box: refused by env_spec, nothing to cast to
    return next((dtype for kind, dtype in _SENT if isinstance(space, kind)), None)


def is_shaped_box(space: gym.Space) -> bool:
    """A Box of another number of axes than one ((2, 2), a scalar's ()): rltrain's policies act on its flat vector
    of prod(shape) values (``flat_box``), as SB3's and CleanRL's do, and the env gets the action in its own shape."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) != 1


def flat_box(space: gym.spaces.Box) -> gym.spaces.Box:
    """``space`` as the flat Box of its values in C order (its bounds raveled), in its own dtype."""
    return gym.spaces.Box(space.low.reshape(-1), space.high.reshape(-1), dtype=space.dtype)


class ActionCast:
    """The policy's action (a float32 Box action, int64 MultiDiscrete values) -> the same values in the space's own
    dtype (float64, float16, int32...): an env that checks dtypes strictly gets what its space declares. A float
    Box whose bounds float32 rounds outward (float32(-0.1) < -0.1) is also clipped to its own bounds after the
    cast: rltrain clips at the float32 bound, which lies just outside such a space. Whether to clip is decided here,
    once, so a step pays for it only where the bounds need it. A Box of another number of axes than one gets the
    flat action in its own ``shape`` (``is_shaped_box``)."""

    shape: tuple[int, ...] | None = None  # the class's: a cast pickled before shapes were translated has none

    def __init__(self, space: gym.Space):
        self.dtype = space.dtype
        self.bounds = None
        if isinstance(space, gym.spaces.Box):
            low, high = space.low, space.high
            exact = all(np.array_equal(b.astype(np.float32).astype(b.dtype), b) for b in (low, high))
            self.bounds = None if exact else (low, high)
            self.shape = tuple(space.shape) if is_shaped_box(space) else None

    def __call__(self, action):
        action = np.asarray(action, self.dtype)
        if self.shape is not None:
            action = action.reshape(self.shape)
        return action if self.bounds is None else np.clip(action, *self.bounds)


def env_action(space: gym.Space) -> IndexShift | ActionCast | None:
    """How an action of rltrain's policy becomes one of ``space``'s own, or None where it already is one: the one
    translation at the env boundary, for a single-agent env (``DiscreteStart``, ``ActionDtype``, ``BoxShape``) and
    for each agent of a multi-agent env (envs/multiagent.py ``AgentEnv``)."""
    if isinstance(space, gym.spaces.Discrete):
        return IndexShift(space) if int(space.start) != 0 else None
    sent = _sent_dtype(space)
    return ActionCast(space) if sent is not None and (space.dtype != sent or is_shaped_box(space)) else None


class DiscreteStart(gym.ActionWrapper):
    """A ``Discrete(n, start=s)`` action space (s != 0) shown to rltrain as ``Discrete(n)``: the policy picks an
    index 0..n-1 and the env is stepped with ``index + s``. ``make_env`` puts it around every single-agent env
    whose action space needs it, so training and evaluation step the env the same way; ``env_spec`` records
    ``s`` (``EnvSpec.action_start``) for the tools that hand actions to the user's own env (``load_policy``,
    ``rltrain-export``). An action mask stays indexed 0..n-1 (Gymnasium's ``Discrete.sample(mask=...)``
    convention), so it passes through unchanged. A plain class (no closures): envs are pickled, and an env a
    checkpoint saved mid-episode comes back with the attributes it had (so ``action`` reads only ``start``)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        inner = env.action_space
        self.start = int(inner.start)
        self.action_space = gym.spaces.Discrete(int(inner.n))

    def action(self, action):  # IndexShift's translation, for one env
        return self.env.action_space.dtype.type(int(action) + self.start)


class ActionDtype(gym.ActionWrapper):
    """An action space whose dtype is not the one rltrain's policies output (a float64 or float16 Box, an int32
    MultiDiscrete): the env is stepped with the action cast to its space's dtype (``ActionCast``). ``make_env`` puts
    it around every single-agent env that needs it (and only those: a float32 env's step is untouched). The space
    is shown as it is: ``env_spec`` records its dtype (``EnvSpec.env_action_dtype``) and its exact bounds, and
    ``load_policy`` hands the user's own env actions in that dtype."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.cast = ActionCast(env.action_space)

    def action(self, action):
        return self.cast(action)


class BoxShape(gym.ActionWrapper):
    """A Box action space of another number of axes than one ((2, 2), a scalar's ()) shown to rltrain as the flat
    Box of its values (``flat_box``): every algorithm's networks, rollouts, replay and exploration noise stay
    [N, A], and the env is stepped with the action in its own shape (and dtype, inside its exact bounds:
    ``ActionCast``). ``make_env`` puts it around every single-agent env that needs it; ``env_spec`` records the
    shape (``EnvSpec.env_action_shape``) for the tools that hand actions to the user's own env (``load_policy``,
    ``rltrain-export``)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.shape = tuple(env.action_space.shape)
        self.cast = ActionCast(env.action_space)
        self.action_space = flat_box(env.action_space)

    def action(self, action):
        return self.cast(action)


def with_env_actions(env: gym.Env) -> gym.Env:
    """``env`` wrapped so that it receives actions in its own action space: ``DiscreteStart`` for a Discrete with a
    non-zero start, ``BoxShape`` for a Box of another number of axes than one, ``ActionDtype`` for a space of
    another dtype than the policy's; ``env`` itself otherwise."""
    translate = env_action(env.action_space)
    if translate is None:
        return env
    if isinstance(translate, IndexShift):
        return DiscreteStart(env)
    return BoxShape(env) if translate.shape is not None else ActionDtype(env)


def _translating(env: gym.Env, kind: type) -> gym.Env | None:
    """The ``kind`` wrapper among ``env``'s wrappers, or None."""
    while env is not None and not isinstance(env, kind):
        env = getattr(env, "env", None)
    return env


def discrete_start(env: gym.Env) -> int:
    """The start that a ``DiscreteStart`` among ``env``'s wrappers adds to each action (0 when none)."""
    wrapper = _translating(env, DiscreteStart)
    return 0 if wrapper is None else wrapper.start


def box_shape(env: gym.Env) -> tuple[int, ...] | None:
    """The env's own Box action shape that a ``BoxShape`` among ``env``'s wrappers hands it (None when none)."""
    wrapper = _translating(env, BoxShape)
    return None if wrapper is None else wrapper.shape


def _gymnasium_wrappers() -> dict[str, type]:
    return {name: cls for name in dir(gym.wrappers) if name[:1].isupper()
            and isinstance(cls := getattr(gym.wrappers, name), type) and issubclass(cls, gym.Wrapper)}


def parse_entry(entry: Any) -> tuple[str, dict[str, Any]]:
    """``"Name"`` or ``{"Name": {kwargs}}`` -> (name, kwargs)."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping) and len(entry) == 1:
        name, kwargs = next(iter(entry.items()))
        if kwargs is None:
            return str(name), {}
        if isinstance(kwargs, Mapping):
            return str(name), {str(k): v for k, v in kwargs.items()}
    raise ConfigError(f"env.wrappers: entry {entry!r} is not a name or {{name: {{kwargs}}}}; "
                      "write e.g. [AtariPreprocessing, {FrameStackObservation: {stack_size: 4}}]")


def resolve_wrapper(name: str) -> type:
    """A wrapper class by our name, Gymnasium's class name or an import path: ``package.module:Wrapper`` or, as
    Hydra's ``_target_`` writes one, ``package.module.Wrapper``. The dotted form is the one a command line can give
    keyword arguments to: Hydra's override grammar reads a bare ``:`` inside ``{key: value}`` as the separator
    (``'env.wrappers=[{pkg.mod.Wrapper: {k: 1}}]'``; the colon form needs it escaped, ``pkg.mod\\:Wrapper``)."""
    if name in OURS:
        return OURS[name]
    known = _gymnasium_wrappers()
    if name in known:
        return known[name]
    if ":" not in name and "." not in name:
        raise ConfigError(f"env.wrappers: unknown wrapper {name!r}{close_matches(name, [*OURS, *known])} "
                          "(or give an import path 'package.module:Wrapper' or 'package.module.Wrapper')")
    module_name, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"env.wrappers: cannot import {name!r}: {err}") from None


def apply_wrappers(env: gym.Env, entries: list[Any] | tuple[Any, ...]) -> gym.Env:
    """Wrap ``env`` with ``entries`` in order (first innermost) between a score recorder and its report."""
    recorder = ScoreRecorder(env)
    env = recorder
    for entry in entries:
        name, kwargs = parse_entry(entry)
        cls = resolve_wrapper(name)
        try:
            env = cls(env, **kwargs)
        except TypeError as err:
            raise ConfigError(f"env.wrappers: {name} rejected its arguments {kwargs}: {err}") from None
        except gym.error.DependencyNotInstalled:
            raise  # make_env names the pip extra
        except (ValueError, AssertionError, gym.error.Error) as err:
            frame_skip = "frame-skip" in str(err)  # AtariPreprocessing on an env that skips frames itself
            fix = "set env.kwargs.frameskip=1" if frame_skip else "check env.kwargs and its arguments"
            target = env.spec.id if env.spec else type(env.unwrapped).__name__
            raise ConfigError(f"env.wrappers: {name}({kwargs}) cannot wrap {target}: "
                              f"{' '.join(str(err).split())}; {fix}") from None
    return ScoreReport(env, recorder)
