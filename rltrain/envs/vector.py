"""Vector envs with same-step autoreset: ``VecEnv`` (a plain list, one process) and ``AsyncVecEnv``.

``step`` returns, for every env, the *true* next observation (the terminal one when an episode ended) and
the observation to act on next (already reset). So every step the collector records is a real
transition: Gymnasium 1.x's default NEXT_STEP autoreset would instead hand back one fake transition per
episode boundary that has to be masked.

Observations keep the env's dtype (uint8 frames, bool MinAtar planes, float vectors); the model converts
and scales them. Envs built with an ``env.wrappers`` list report real game scores (see
``rltrain.envs.wrappers``): ``pop_real_episodes`` hands them over, in (step, env) order.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rltrain.data.structs import obs_map, obs_put


class VecEnv:
    """N envs stepped in one process, in a plain list (cheaper than SyncVectorEnv), autoreset same-step."""

    def __init__(self, fns: list[Callable[[], gym.Env]], seeds: list[int], *, real_scores: bool = False):
        self.envs = [fn() for fn in fns]
        self.seeds = list(seeds)
        self.num_envs = len(self.envs)
        space = self.envs[0].observation_space
        self._dict = isinstance(space, gym.spaces.Dict)  # a dict of per-key batches instead of one array
        self._obs = _batch_of(space, self.num_envs)
        self._final = _batch_of(space, self.num_envs)
        self._rew = np.zeros(self.num_envs, np.float32)
        self._term = np.zeros(self.num_envs, bool)
        self._trunc = np.zeros(self.num_envs, bool)
        self._discrete = isinstance(self.envs[0].action_space, gym.spaces.Discrete)
        self._real: list[tuple[int, float, int]] | None = [] if real_scores else None

    def reset(self) -> np.ndarray:
        for i, env in enumerate(self.envs):
            env.action_space.seed(self.seeds[i])
            o, _ = env.reset(seed=self.seeds[i])
            obs_put(self._obs, i, o)
        return obs_map(np.copy, self._obs)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """actions [N, ...] -> (obs to act on [N,...], reward [N], terminated [N], truncated [N], true next obs [N,...])."""
        obs, final, rew, term, trunc = self._obs, self._final, self._rew, self._term, self._trunc
        acts = actions.tolist() if self._discrete else actions
        real, put = self._real, obs_put if self._dict else None
        for i, env in enumerate(self.envs):
            o, r, te, tr, info = env.step(acts[i])
            if real is not None and "real_score" in info:
                real.append((i, info["real_score"], info["real_length"]))
            if put is None:
                final[i] = o
            else:
                put(final, i, o)
            rew[i] = r
            term[i] = te
            trunc[i] = tr
            if te or tr:
                o, _ = env.reset()
            if put is None:
                obs[i] = o
            else:
                put(obs, i, o)
        if put is not None:
            return obs_map(np.copy, obs), rew.copy(), term.copy(), trunc.copy(), obs_map(np.copy, final)
        return obs.copy(), rew.copy(), term.copy(), trunc.copy(), final.copy()

    def pop_real_episodes(self) -> list[tuple[int, float, int]] | None:
        """(env index, real game score, length in steps) of the games that ended since the last call, or
        None when the envs do not report real scores (no ``env.wrappers``: the rewards are the score)."""
        if self._real is None:
            return None
        done, self._real = self._real, []
        return done

    def get_state(self) -> bytes | None:
        """Pickled envs (mid-episode state + RNGs) so a resume continues the same trajectories."""
        try:
            return pickle.dumps(self.envs)
        except Exception:  # an env with unpicklable handles (a simulator, a socket): resume resets it
            return None

    def set_state(self, blob: bytes) -> None:
        self.close()
        self.envs = pickle.loads(blob)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _batch_of(space: gym.Space, n: int):
    """Zeros for n observations of ``space``: an array, or for a Dict a dict of per-key batches (an object
    array for a key without a fixed shape and dtype, e.g. Text, which the collector does not store)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _batch_of(sub, n) for k, sub in space.spaces.items()}
    if space.shape is None or space.dtype is None or space.dtype == object:
        return np.empty(n, object)
    return np.zeros((n, *space.shape), space.dtype)


class AsyncVecEnv:
    """Gymnasium's AsyncVectorEnv (one subprocess per env) adapted to the ``VecEnv`` interface."""

    def __init__(self, fns: list[Callable[[], gym.Env]], seeds: list[int], context: str | None = None, *,
                 real_scores: bool = False):
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode

        self.venv = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, context=context)
        self.seeds = list(seeds)
        self.num_envs = len(seeds)
        self._real: list[tuple[int, float, int]] | None = [] if real_scores else None

    def reset(self) -> np.ndarray:
        self.venv.action_space.seed(self.seeds[0])
        obs, _ = self.venv.reset(seed=self.seeds)
        return obs

    def step(self, actions: np.ndarray):
        obs, rew, term, trunc, info = self.venv.step(actions)
        final = obs_map(np.array, obs)  # a copy; Dict spaces come as a dict of per-key batches
        done = term | trunc
        if done.any():
            for i in np.flatnonzero(done):
                obs_put(final, i, info["final_obs"][i])
        if self._real is not None:
            self._gather_real(info, done)
        return obs, rew.astype(np.float32), term, trunc, final

    def _gather_real(self, info: dict, done: np.ndarray) -> None:
        """Same-step autoreset puts a finished episode's step info under ``final_info`` (the top level then
        holds the reset's info); a score reported on a later step sits at the top level."""
        for i in range(self.num_envs):
            src = info.get("final_info", {}) if done[i] else info
            if "real_score" in src and src["_real_score"][i]:
                self._real.append((i, float(src["real_score"][i]), int(src["real_length"][i])))

    def pop_real_episodes(self) -> list[tuple[int, float, int]] | None:
        if self._real is None:
            return None
        done, self._real = self._real, []
        return done

    def get_state(self) -> bytes | None:
        return None

    def set_state(self, blob: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.venv.close()
