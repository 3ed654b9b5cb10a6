"""Observations that do not fit their space end the run; they are never stored changed.

Two ways an observation can be stored as something else than what the env returned: a value of another dtype
that the space's dtype cannot hold (a ``uint8`` Box handed ``300`` as an ``int64`` array would be stored as
``44``, a float ``2.5`` for an integer space as ``2``), and an integer value outside the Box's declared
``low`` / ``high`` (an index grid declared ``0..10`` handed ``300``: the model would read it as a valid index
of something else, or index past an embedding). Float observations outside their Box are left alone (many
envs declare loose float bounds, and a NaN or inf is the non-finite guard's).

Both checks keep the hot path's cost to a compare when nothing is wrong: the dtype check runs only when an
env hands back another dtype than its space's (``put_checked``, per env: the values must be cast anyway), the
range check once per vector step on the whole batch, and only for integer Box parts whose bounds are
narrower than their dtype's range (``IntegerBounds``: a ``uint8`` image declared ``0..255`` needs none).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ObsOutOfSpace(ValueError):
    """An observation that its space cannot hold as it is (the vector env turns it into an ``EnvFault``)."""


def put_checked(batch: Any, i: int, o: Any, space: gym.Space | None = None) -> None:
    """``batch[i] = o`` (a Dict space's per-key batches too) without numpy's broadcasting and without a lossy
    cast: another shape or a value the batch's dtype cannot hold raises ``ObsOutOfSpace`` / ``ValueError``."""
    if isinstance(batch, dict):
        for k, sub in batch.items():
            put_checked(sub, i, o[k], space[k] if isinstance(space, gym.spaces.Dict) else None)
        return
    if batch.dtype == object:  # a key no model reads (Text, Sequence): kept as it comes
        batch[i] = o
        return
    if getattr(o, "shape", None) != batch.shape[1:]:
        o = np.asarray(o)
        if o.shape != batch.shape[1:]:
            raise ValueError(f"observation of shape {o.shape}, but the observation space says {batch.shape[1:]}")
    if batch.dtype.kind in "iub" and getattr(o, "dtype", batch.dtype) != batch.dtype:
        _lossless(np.asarray(o), batch.dtype, space)
    batch[i] = o


def _lossless(o: np.ndarray, dtype: np.dtype, space: gym.Space | None) -> None:
    try:
        cast = o.astype(dtype)
        same = cast.astype(o.dtype) == o
    except (TypeError, ValueError):
        return  # not numbers at all: numpy's own error when stored names it
    if np.all(same):
        return
    where = tuple(int(x) for x in np.argwhere(~np.asarray(same))[0])
    value, stored = o[where].item(), cast[where].item()
    raise ObsOutOfSpace(f"observation value {value!r} ({o.dtype}) at index {where} does not fit the space's dtype "
                        f"{dtype} ({space if space is not None else 'its observation space'}): it would be stored as "
                        f"{stored!r}")


class IntegerBounds:
    """The integer Box parts of an observation space with bounds narrower than their dtype's range, checked on
    a whole batch at once. Falsy when there are none (nothing to check)."""

    def __init__(self, space: gym.Space):
        self.parts: list[tuple[tuple[str, ...], np.ndarray, np.ndarray, str]] = []
        self._collect(space, ())

    def _collect(self, space: gym.Space, path: tuple[str, ...]) -> None:
        if isinstance(space, gym.spaces.Dict):
            for k, sub in space.spaces.items():
                self._collect(sub, (*path, k))
        elif isinstance(space, gym.spaces.Box) and space.dtype.kind in "iu":
            info = np.iinfo(space.dtype)
            low, high = np.asarray(space.low), np.asarray(space.high)
            if low.min() > info.min or high.max() < info.max:
                self.parts.append((path, low, high, str(space)))

    def __bool__(self) -> bool:
        return bool(self.parts)

    def first_outside(self, batch: Any) -> tuple[int, str] | None:
        """(env index, what is wrong) for the first observation outside its declared bounds, else None."""
        for path, low, high, name in self.parts:
            values = batch
            for k in path:
                values = values[k]
            bad = (values < low) | (values > high)
            if bad.any():
                at = tuple(int(x) for x in np.argwhere(bad)[0])
                env, index = at[0], at[1:]
                key = f" key {'.'.join(path)!r}" if path else ""
                value = values[at].item()
                side = f"below its low {low[index]}" if value < low[index] else f"above its high {high[index]}"
                return env, (f"observation{key} value {value!r} at index {index} is {side} "
                             f"(the observation space: {name})")
        return None


def checked_env(env: gym.Env) -> gym.Env:
    """``env`` whose observations are checked against their space's dtype one by one (an async env worker:
    Gymnasium's shared-memory write would cast them as they come)."""
    return _FitsSpace(env) if _integer_parts(env.observation_space) else env


def _integer_parts(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Dict):
        return any(_integer_parts(s) for s in space.spaces.values())
    return isinstance(space, gym.spaces.Box) and space.dtype.kind in "iub"


class _FitsSpace(gym.Wrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._zeros = _zeros(env.observation_space)

    def _check(self, o: Any) -> Any:
        put_checked(self._zeros, 0, o, self.observation_space)
        return o

    def reset(self, **kwargs):
        o, info = self.env.reset(**kwargs)
        return self._check(o), info

    def step(self, action):
        o, *rest = self.env.step(action)
        return self._check(o), *rest


def _zeros(space: gym.Space) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _zeros(s) for k, s in space.spaces.items()}
    if space.shape is None or space.dtype is None or space.dtype == object:
        return np.empty(1, object)
    return np.zeros((1, *space.shape), space.dtype)
