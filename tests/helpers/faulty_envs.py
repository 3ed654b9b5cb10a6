"""Envs for tests: importable by path (env.id=tests.helpers.faulty_envs:...)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


class CountingEnv(gym.Env):
    """A tiny Box-observation env with a custom constructor argument (tests env.kwargs pass-through)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 10):
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.full(3, self.t / self.length, np.float32)
        return obs, float(action), self.t >= self.length, False, {}


class SeededLengthEnv(CountingEnv):
    """Every episode of one env lasts (and returns) 11 + seed % 16 steps, the seed of its first reset: each env of
    each rank has its own, known from seeds.json (pooling tests: a row or summary that reads one rank's episodes
    shows it)."""

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.length = 11 + seed % 16
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 1.0, terminated, truncated, info


def make_counting(length: int = 10) -> gym.Env:
    return gym.wrappers.TimeLimit(CountingEnv(length), max_episode_steps=length * 2)


class RaisingEnv(CountingEnv):
    """Raises inside step() after ``fail_after`` steps (worker-failure tests)."""

    def __init__(self, fail_after: int = 50, length: int = 10):
        super().__init__(length)
        self.fail_after, self.total = fail_after, 0

    def step(self, action):
        self.total += 1
        if self.total > self.fail_after:
            raise RuntimeError(f"RaisingEnv: deliberate failure after {self.fail_after} steps")
        return super().step(action)


class SlowEnv(CountingEnv):
    """Sleeps in every step (signal tests: gives time to send a signal mid-run).

    ``marker_dir``: on its first ``step()`` the env creates ``<marker_dir>/<pid>``: that process's training loop
    is under way (a run resets but never steps an env before its first rollout), past the phases where a stop is
    raised at once and named after them (start-up, env construction, checkpoint loading)."""

    def __init__(self, sleep_s: float = 0.002, length: int = 50, marker_dir: str = ""):
        super().__init__(length)
        self.sleep_s, self.marker_dir = sleep_s, marker_dir

    def step(self, action):
        import time

        if self.marker_dir:
            Path(self.marker_dir, str(os.getpid())).touch()
            self.marker_dir = ""  # once
        time.sleep(self.sleep_s)
        return super().step(action)


class _FailAfter(gym.Wrapper):
    """Fails after ``after`` steps of this env: ``how="raise"`` raises, ``how="kill"`` SIGKILLs the process."""

    def __init__(self, env: gym.Env, after: int, how: str, wait_for: str | None = None):
        super().__init__(env)
        self.after, self.how, self.steps, self.wait_for = after, how, 0, wait_for

    def step(self, action):
        import os
        import signal

        self.steps += 1
        if self.steps > self.after:
            if self.wait_for:  # an order, not a time: fail only once another process has written a row there
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline and not _has_rows(self.wait_for):
                    time.sleep(0.05)
            if self.how == "raise":
                raise RuntimeError(f"faulty env: failing on purpose after {self.after} steps")
            os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer: no traceback, no goodbye
        return self.env.step(action)


def raising_cartpole(after: int = 100) -> gym.Env:
    """CartPole whose step raises RuntimeError after ``after`` steps (parallel-agent failure tests)."""
    return _FailAfter(gym.make("CartPole-v1"), after, "raise")


def raising_cartpole_after_agent_0(after: int = 100) -> gym.Env:
    """``raising_cartpole`` that raises only once agent 0 of the trainer=parallel run in ``run/`` (relative to the
    launch dir) has logged a row of its own: a test of what a failure does to the other agents must not race their
    start on a loaded machine."""
    return _FailAfter(gym.make("CartPole-v1"), after, "raise", wait_for="run/agent_0/metrics.csv")


def _has_rows(path: str) -> bool:
    try:
        with open(path) as f:
            return sum(1 for _ in f) >= 2  # the header and one row
    except OSError:
        return False


def sigkill_cartpole(after: int = 100) -> gym.Env:
    """CartPole that SIGKILLs its own process after ``after`` steps (killed-agent tests)."""
    return _FailAfter(gym.make("CartPole-v1"), after, "kill")


# -- a CartPole that raises after N steps (sweep / SLURM tests) ---------------------------------------
class CrashingCartPole(gym.Wrapper):
    def __init__(self, crash_after: int = -1):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.crash_after, self.steps = crash_after, 0

    def step(self, action):
        self.steps += 1
        if 0 <= self.crash_after < self.steps:
            raise RuntimeError(f"CrashingCartPole: deliberate failure after {self.crash_after} steps")
        return self.env.step(action)


def crashing_cartpole(crash_after: int = -1) -> gym.Env:
    return CrashingCartPole(crash_after)


class SlowUntilGateCartPole(gym.Wrapper):
    """CartPole that, from its step ``hold_at`` on, sleeps ``slow_s`` in each step until the file named by
    ``$RLTRAIN_TEST_GATE`` exists: a run cannot reach its end (or its last update) before the test opens the gate,
    however fast the machine, yet no env call lasts long (a stop signal abandons one still running 0.5 s after it,
    rltrain/envs/deadline.py). A test signals the run, then opens the gate to let it go on at full speed."""

    def __init__(self, hold_at: int = 32, slow_s: float = 0.01):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))
        self.hold_at, self.slow_s, self.steps = hold_at, slow_s, 0
        self.gate = os.environ.get("RLTRAIN_TEST_GATE")

    def step(self, action):
        self.steps += 1
        if self.gate and self.steps >= self.hold_at:
            if os.path.exists(self.gate):
                self.gate = None  # open for good
            else:
                time.sleep(self.slow_s)
        return self.env.step(action)


# -- a CartPole that fails on one distributed rank (raise or SIGKILL) ---------------------------------
class FaultyCartPole(gym.Wrapper):
    def __init__(self, *, fault_rank: int = 1, mode: str = "raise", after_steps: int = 200, stamp: str = ""):
        super().__init__(CartPoleEnv())
        self.armed = int(os.environ.get("RANK", "0")) == fault_rank
        self.mode, self.after_steps, self.steps, self.stamp = mode, after_steps, 0, stamp

    def step(self, action):
        self.steps += 1
        if self.armed and self.steps >= self.after_steps:
            if self.stamp:  # when the fault happened, so the test can time the job's reaction
                with open(self.stamp, "w") as f:
                    f.write(repr(time.time()))
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault on rank {os.environ.get('RANK')}")
        return self.env.step(action)


def faulty_cartpole(**kwargs) -> gym.Env:
    return FaultyCartPole(**kwargs)
