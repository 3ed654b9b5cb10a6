"""Goal-conditioned envs (Gymnasium-Robotics' convention): the env's ``compute_reward`` as a picklable callable.

Hindsight relabelling (data/hindsight.py) recomputes rewards for goals the agent reached, with the env's own
``compute_reward(achieved_goal, desired_goal, info)``. The learner may run where no env of the run lives (the
``subprocess_actors`` learner, a distributed rank), so the spec carries ``GoalReward``: the env factory, from
which the learner's process builds ONE env on the first call and keeps it (never pickled with it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from rltrain.data.hindsight import goal_keys_missing
from rltrain.data.structs import EnvSpec


class GoalReward:
    """``compute_reward`` of an env of ``factory`` (built on first use in this process)."""

    def __init__(self, factory: Any):
        self.factory = factory
        self._fn = None
        self._env: gym.Env | None = None

    def __call__(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: dict) -> np.ndarray:
        if self._fn is None:
            self._env = self.factory.make()
            self._fn = self._env.get_wrapper_attr("compute_reward")
        return self._fn(achieved_goal, desired_goal, info)

    def __getstate__(self) -> dict:
        return {"factory": self.factory}  # the env stays in the process that built it

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["factory"])


def with_goal_reward(spec: EnvSpec, env: gym.Env, factory: Any) -> EnvSpec:
    """``spec`` with ``goal_reward`` set when ``env`` is goal-conditioned (a Dict with ``achieved_goal`` and
    ``desired_goal`` and a ``compute_reward`` method, on it or a wrapper), else as it is."""
    if goal_keys_missing(spec.observation) is not None:
        return spec
    try:
        env.get_wrapper_attr("compute_reward")
    except AttributeError:
        return spec
    return dataclasses.replace(spec, goal_reward=GoalReward(factory))
