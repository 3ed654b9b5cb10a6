"""Envs for the subprocess_actors tests, addressed as ``tests.helpers.actor_envs:Name`` (env.id import paths).

They misbehave only inside actor processes (``workers.py`` names them ``rltrain-actor-<index>``), so the
learner can still build the env spec and evaluate.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import gymnasium as gym


def _actor_index() -> int | None:
    name = mp.current_process().name
    return int(name.rsplit("-", 1)[1]) if name.startswith("rltrain-actor-") else None


class RaisingCartPole(gym.Wrapper):
    """CartPole whose actors raise ``RuntimeError`` after ``fail_after`` steps."""

    def __init__(self, fail_after: int = 100):
        super().__init__(gym.make("CartPole-v1"))
        self.fail_after, self.steps = fail_after, 0

    def step(self, action):
        self.steps += 1
        if _actor_index() is not None and self.steps > self.fail_after:
            raise RuntimeError(f"boom from the env after {self.fail_after} steps")
        return self.env.step(action)


class SlowActorCartPole(gym.Wrapper):
    """CartPole that sleeps ``delay_s`` per step in the actor with index ``slow_actor`` only."""

    def __init__(self, slow_actor: int = 1, delay_s: float = 0.01):
        super().__init__(gym.make("CartPole-v1"))
        self.slow = _actor_index() == slow_actor
        self.delay_s = delay_s

    def step(self, action):
        if self.slow:
            time.sleep(self.delay_s)
        return self.env.step(action)


class GatedCartPole(gym.Wrapper):
    """CartPole whose actors hold at step ``hold_at`` until the file named by ``$RLTRAIN_TEST_GATE`` exists.

    A test can then act on a run that cannot end meanwhile (the learner waits for rollouts), however fast the
    machine or however loaded, and open the gate to let it finish.
    """

    def __init__(self, hold_at: int = 200):
        super().__init__(gym.make("CartPole-v1"))
        self.hold_at, self.steps = hold_at, 0
        self.gate = os.environ.get("RLTRAIN_TEST_GATE")

    def step(self, action):
        self.steps += 1
        if self.gate and _actor_index() is not None and self.steps == self.hold_at:
            while not os.path.exists(self.gate):
                time.sleep(0.02)
        return self.env.step(action)


def _in_ray_actor() -> bool:
    import sys

    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class BarrierCartPole(gym.Wrapper):
    """CartPole whose actors (local or Ray) hold at their first step until ``parties`` actor processes have
    reached it: each leaves a file named by its pid in the folder ``$RLTRAIN_TEST_BARRIER``. A short run then
    cannot end on one actor's rollouts before the other was even placed. Waits ``timeout_s`` at most (then
    goes on, and the test's own assertion says what is missing).
    """

    def __init__(self, parties: int = 2, timeout_s: float = 120.0):
        super().__init__(gym.make("CartPole-v1"))
        self.parties, self.timeout_s = parties, timeout_s
        self.folder = os.environ.get("RLTRAIN_TEST_BARRIER")
        self.waited = False

    def step(self, action):
        if self.folder and not self.waited and (_actor_index() is not None or _in_ray_actor()):
            self.waited = True
            os.makedirs(self.folder, exist_ok=True)
            open(os.path.join(self.folder, str(os.getpid())), "w").close()
            deadline = time.monotonic() + self.timeout_s
            while len(os.listdir(self.folder)) < self.parties and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.env.step(action)
