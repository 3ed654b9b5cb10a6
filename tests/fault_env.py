"""A CartPole that fails on purpose on one rank: the faults of the distributed tests are real faults of a
real rank (an exception in its env, or its process SIGKILLed), injected without test hooks in rltrain."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


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
