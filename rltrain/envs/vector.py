"""Vector envs with same-step autoreset: ``VecEnv`` (a plain list, one process) and ``AsyncVecEnv``.

``step`` returns, for every env, the *true* next observation (the terminal one when an episode ended) and
the observation to act on next (already reset). So every step the collector records is a real
transition: Gymnasium 1.x's default NEXT_STEP autoreset would instead hand back one fake transition per
episode boundary that has to be masked.

Observations keep the env's dtype (uint8 frames, bool MinAtar planes, float vectors); the model converts
and scales them. Envs built with an ``env.wrappers`` list report real game scores (see
``rltrain.envs.wrappers``): ``pop_real_episodes`` hands them over, in (step, env) order.

Faults in the envs end in one line that names the env and its step (``EnvFault``; the deadline and the faults
are envs/deadline.py's): ``step`` keeps the deadline timer running across a rollout's steps and ``idle`` clears it.
Async env workers die with their parent (``die_with_parent``) and leave stopping to it (SIGINT ignored).
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rltrain.data.structs import obs_map, obs_put
from rltrain.envs.bounds import IntegerBounds, ObsOutOfSpace, checked_env, put_checked
from rltrain.envs.deadline import ENV_CALLS, CallWatch, EnvCallAbandoned, EnvFault, env_fault, timeout_fault
from rltrain.envs.lifetime import die_with_parent
from rltrain.envs.reports import EpisodeReports


class _Counted(gym.Wrapper):
    """Counts its steps as env calls (envs/deadline.py's ``ENV_CALLS``): evaluation is progress for a worker's
    heartbeat."""

    def step(self, action):
        ENV_CALLS[0] += 1
        return self.env.step(action)


def counted(make: Callable[..., gym.Env]) -> Callable[..., gym.Env]:
    """``make`` whose envs count their steps as progress (see ``_Counted``)."""
    return lambda **kwargs: _Counted(make(**kwargs))


class VecEnv(EpisodeReports):
    """N envs stepped in one process, in a plain list (cheaper than SyncVectorEnv), autoreset same-step."""

    def __init__(self, fns: list[Callable[[], gym.Env]], seeds: list[int], *, real_scores: bool = False,
                 step_timeout_s: float | None = None):
        self.envs = [fn() for fn in fns]
        self.watch = CallWatch(step_timeout_s)
        self.steps = 0  # vector steps so far (each env's own step count, for the fault lines)
        self.seeds = list(seeds)
        self.num_envs = len(self.envs)
        space = self.envs[0].observation_space
        self._space = space
        self._dict = isinstance(space, gym.spaces.Dict)  # a dict of per-key batches instead of one array
        # integer Box parts narrower than their dtype, checked per batch; None (no call per step) when there are none
        self._bounds = IntegerBounds(space) or None
        self._obs = _batch_of(space, self.num_envs)
        self._final = _batch_of(space, self.num_envs)
        self._shape = None if self._dict else self._obs.shape[1:]  # one observation's shape (None: a Dict)
        self._dtype = None if self._dict else self._obs.dtype
        self._rew = np.zeros(self.num_envs, np.float32)
        self._term = np.zeros(self.num_envs, bool)
        self._trunc = np.zeros(self.num_envs, bool)
        self._discrete = isinstance(self.envs[0].action_space, gym.spaces.Discrete)
        self._real, self._successes = ([] if real_scores else None), []  # EpisodeReports

    def reset(self) -> np.ndarray:
        watch = self.watch
        watch.begin(self.steps)
        try:
            for i, env in enumerate(self.envs):
                watch.env = i
                try:
                    env.action_space.seed(self.seeds[i])
                    o, _ = env.reset(seed=self.seeds[i])
                    put_checked(self._obs, i, o, self._space)
                except (EnvFault, EnvCallAbandoned):
                    raise
                except Exception as err:  # the user's env: one line naming it (the traceback is chained)
                    raise env_fault(err, i, self.steps, "reset()") from err
        finally:
            watch.end()
        self._check_bounds(self._obs, "reset()")
        return obs_map(np.copy, self._obs)

    def _check_bounds(self, batch, call: str) -> None:
        """One vectorised look at the batch for integer observations outside their declared bounds."""
        if self._bounds:
            bad = self._bounds.first_outside(batch)
            if bad is not None:
                raise env_fault(ObsOutOfSpace(bad[1]), bad[0], self.steps, call)

    def step(self, actions: np.ndarray, *, copy: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                       np.ndarray, np.ndarray]:
        """actions [N, ...] -> (obs to act on [N,...], reward [N], terminated [N], truncated [N],
        true next obs [N,...]). ``copy=False``: the vector env's own arrays, valid until the next step (for a
        caller that copies them into its buffers at once: the collector)."""
        obs, final, rew, term, trunc = self._obs, self._final, self._rew, self._term, self._trunc
        acts = actions.tolist() if self._discrete else actions
        real, space, shape, dtype = self._real, self._space, self._shape, self._dtype
        watch = self.watch
        self.steps += 1
        watch.begin(self.steps)
        stepped, resets = False, []
        try:
            for i, env in enumerate(self.envs):
                watch.env = i
                call = "step()"
                try:
                    o, r, te, tr, info = env.step(acts[i])
                    if real is not None and "real_score" in info:
                        real.append((i, info["real_score"], info["real_length"]))
                    if o.__class__ is np.ndarray and o.dtype is dtype and o.shape == shape:
                        final[i] = o  # the common case, checked inline (a builtin dtype is one object)
                    else:
                        put_checked(final, i, o, space)
                    try:
                        rew[i] = r
                    except (TypeError, ValueError):
                        if np.ndim(r) == 0:  # not a number at all: numpy's own words say which value
                            raise
                        # numpy's "setting an array element with a sequence" does not say it is the reward
                        raise ValueError(f"reward {r!r} of shape {np.shape(r)}: step() must return one number "
                                         "(e.g. float(reward))") from None
                    term[i] = te
                    trunc[i] = tr
                    if te or tr:
                        if "is_success" in info:
                            self._successes.append(bool(info["is_success"]))
                        call = "reset() (its episode had ended)"
                        o, _ = env.reset()
                        if not (o.__class__ is np.ndarray and o.dtype is dtype and o.shape == shape):
                            put_checked(obs, i, o, space)  # checked where a fault names the reset; put again below
                        resets.append((i, o))
                except (EnvFault, EnvCallAbandoned):
                    raise
                except Exception as err:  # raised, or returned what does not fit the spaces: one line
                    raise env_fault(err, i, self.steps, call) from err
            stepped = True
        finally:
            watch.end(keep=stepped)  # a fault clears the timer: the caller may go on without this env
        # the envs that went on act on from their true next observation (one copy, not one row each), the
        # others from their reset's
        if self._dict:
            obs_map(np.copyto, obs, final)
        else:
            obs[...] = final
        for i, o in resets:
            if o.__class__ is np.ndarray and o.dtype is dtype and o.shape == shape:
                obs[i] = o
            else:
                put_checked(obs, i, o, space)
        if self._bounds is not None:
            self._check_bounds(final, "step()")
            self._check_bounds(obs, "reset()")
        if not copy:
            return obs, rew, term, trunc, final
        if self._dict:
            return obs_map(np.copy, obs), rew.copy(), term.copy(), trunc.copy(), obs_map(np.copy, final)
        return obs.copy(), rew.copy(), term.copy(), trunc.copy(), final.copy()

    def idle(self) -> None:
        """The caller's loop of steps is done: clear the deadline timer its steps left running."""
        self.watch.disarm()

    def get_state(self) -> bytes | None:
        """Pickled envs (mid-episode state + RNGs) so a resume continues the same trajectories."""
        try:
            return pickle.dumps(self.envs)
        except Exception:  # an env with unpicklable handles (a simulator, a socket): resume resets it
            return None

    def set_state(self, blob: bytes) -> None:
        for env in self.envs:
            env.close()
        self.envs = pickle.loads(blob)

    def close(self) -> None:
        """Close the envs and drop them: a closed vector env holds none. What still references it (the loop's
        components reference one another, a cycle that main() freezes at exit) would otherwise keep every
        env alive to the end, and a simulator freed by no one (ale-py's ALEInterface) prints nanobind's
        "leaked instances" report at exit. Closing twice is harmless."""
        self.watch.close()
        envs, self.envs = self.envs, []
        for env in envs:
            env.close()


def _batch_of(space: gym.Space, n: int):
    """Zeros for n observations of ``space``: an array, or for a Dict a dict of per-key batches (an object
    array for a key without a fixed shape and dtype, e.g. Text, which the collector does not store)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _batch_of(sub, n) for k, sub in space.spaces.items()}
    if space.shape is None or space.dtype is None or space.dtype == object:
        return np.empty(n, object)
    return np.zeros((n, *space.shape), space.dtype)


class AsyncVecEnv(EpisodeReports):
    """Gymnasium's AsyncVectorEnv (one subprocess per env) adapted to the ``VecEnv`` interface.

    Each worker dies with this process (``die_with_parent``) and ignores SIGINT (this process decides how to
    stop); a SIGTERM sent to a worker itself ends it. A worker's error, or a step past ``step_timeout_s``,
    becomes an ``EnvFault`` naming the worker's env; the workers are then terminated, not waited for.
    """

    def __init__(self, fns: list[Callable[[], gym.Env]], seeds: list[int], context: str | None = None, *,
                 real_scores: bool = False, step_timeout_s: float | None = None):
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode

        parent = os.getpid()
        fns = [_WorkerEnv(fn, parent) for fn in fns]
        self.venv = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, context=context)
        self.seeds = list(seeds)
        self.num_envs = len(seeds)
        self._real, self._successes = ([] if real_scores else None), []  # EpisodeReports
        self.watch = CallWatch(step_timeout_s)
        self.steps = 0
        self._broken = False
        self._bounds = IntegerBounds(self.venv.single_observation_space)

    def _call(self, fn, call: str):
        """``fn()`` (a reset or step of all workers) with the deadline, and its faults as one ``EnvFault``."""
        watch = self.watch
        watch.begin(self.steps)
        quiet, gym.logger.min_level = gym.logger.min_level, 50  # a worker's error is reported once, by us
        try:
            return fn()
        except EnvFault:
            self._broken = True
            raise timeout_fault(self._stuck_env(), self.steps, watch.timeout_s) from None
        except EnvCallAbandoned as err:
            self._broken = True
            raise EnvCallAbandoned(self._stuck_env(), self.steps, err.stuck_s) from None
        except Exception as err:
            self._broken = True
            failed = next((i for i, p in enumerate(self.venv.parent_pipes) if p is None), 0)
            raise env_fault(err, failed, self.steps, call) from err
        finally:
            gym.logger.min_level = quiet
            watch.end()

    def _stuck_env(self) -> int:
        """The first worker that has not answered (its pipe holds no reply)."""
        for i, pipe in enumerate(self.venv.parent_pipes):
            try:
                if pipe is not None and not pipe.poll(0):
                    return i
            except OSError:
                return i
        return 0

    def reset(self) -> np.ndarray:
        self.venv.action_space.seed(self.seeds[0])
        obs, _ = self._call(lambda: self.venv.reset(seed=self.seeds), "reset()")
        self._check_bounds(obs, "reset()")
        return obs

    def _check_bounds(self, batch, call: str) -> None:
        if self._bounds:
            bad = self._bounds.first_outside(batch)
            if bad is not None:
                self._broken = True
                raise env_fault(ObsOutOfSpace(bad[1]), bad[0], self.steps, call)

    def step(self, actions: np.ndarray, *, copy: bool = True):
        """``VecEnv.step``; its arrays are new every step, whatever ``copy`` says."""
        self.steps += 1
        obs, rew, term, trunc, info = self._call(lambda: self.venv.step(actions), "step()")
        final = obs_map(np.array, obs)  # a copy; Dict spaces come as a dict of per-key batches
        done = term | trunc
        if done.any():
            for i in np.flatnonzero(done):
                obs_put(final, i, info["final_obs"][i])
        if self._real is not None:
            self._gather_real(info, done)
        last = info.get("final_info", {})  # same-step autoreset: the ended episodes' last infos
        if done.any() and "is_success" in last:
            self._successes.extend(bool(last["is_success"][i]) for i in np.flatnonzero(done & last["_is_success"]))
        self._check_bounds(final, "step()")
        return obs, rew.astype(np.float32), term, trunc, final

    def _gather_real(self, info: dict, done: np.ndarray) -> None:
        """Same-step autoreset puts a finished episode's step info under ``final_info`` (the top level then
        holds the reset's info); a score reported on a later step sits at the top level."""
        for i in range(self.num_envs):
            src = info.get("final_info", {}) if done[i] else info
            if "real_score" in src and src["_real_score"][i]:
                self._real.append((i, float(src["real_score"][i]), int(src["real_length"][i])))

    def idle(self) -> None:
        """``VecEnv.idle``; every call here clears its own timer, so this only makes sure."""
        self.watch.disarm()

    def get_state(self) -> bytes | None:
        return None

    def set_state(self, blob: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.watch.close()
        if self.venv.closed:
            return
        quiet, gym.logger.min_level = gym.logger.min_level, 50 if self._broken else gym.logger.min_level
        try:
            self.venv.close(terminate=self._broken)  # a worker stuck in a call would never answer close
        finally:
            gym.logger.min_level = quiet


class _WorkerEnv:
    """An async worker's env function: first ties the worker's life to its parent's, then builds the env."""

    def __init__(self, fn: Callable[[], gym.Env], parent_pid: int):
        self.fn, self.parent_pid = fn, parent_pid

    def __call__(self) -> gym.Env:
        if os.getpid() == self.parent_pid:  # AsyncVectorEnv builds one env in the parent to read the spaces
            return self.fn()
        die_with_parent(self.parent_pid, direct=False)  # the default start method may put a fork server between
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)  # not the handler a forked worker inherited
        # checked here, one by one: Gymnasium's shared-memory write would cast what does not fit the dtype
        return checked_env(self.fn())
