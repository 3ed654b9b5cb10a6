"""Envs whose Box action space has another number of axes than one, addressed as ``tests.helpers.shaped_envs:Name``
(env.id import paths). rltrain's policies act on such a Box's flat vector of values; the env must get the action
in its own shape, dtype and bounds, which each env here checks as a strict env does (``step`` raises otherwise).

- ``MatrixEnv``: a (3, 2) Box observation (the target, as a matrix) and a (2, 2) Box action (float32, or the
  ``dtype`` given) whose entries have disjoint ranges, [k, k + 0.5] for entry k in C order, so an action laid out
  in any other order than the env's lies outside the space; reward: minus the distance to the target's entries
  mapped into those ranges.
- ``matrix_agents``: a PettingZoo env (``tests/helpers/agent_envs.py``'s ``Picky``) whose ``mover`` acts in such a
  (2, 2) float64 Box.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from tests.helpers.space_envs import StrictDtypeEnv

LOW = np.arange(4.0).reshape(2, 2)  # entry k of the action in [k, k + 0.5]


class MatrixEnv(StrictDtypeEnv):
    """``StrictDtypeEnv``'s strict ``step`` over a (3, 2) observation and a (2, 2) action."""

    def __init__(self, dtype: str = "float32", length: int = 8):
        low = LOW.astype(dtype)
        self.action_space = spaces.Box(low, low + 0.5, dtype=low.dtype)
        self.observation_space = spaces.Box(-1.0, 1.0, (3, 2), np.float32)
        self.length, self.t = length, 0

    def _observe(self) -> np.ndarray:
        self.target = self.np_random.uniform(-1.0, 1.0, (3, 2)).astype(np.float32)
        return self.target.copy()

    def _reward(self, action: np.ndarray) -> float:
        return -float(np.abs(action - (LOW + (self.target[:2] + 1) / 4)).sum())


def matrix_agents(length: int = 6):
    from tests.helpers.agent_envs import Picky

    env = Picky(length)
    env._act["mover"] = spaces.Box(LOW - 0.1, LOW + 0.3, dtype=np.float64)  # Picky steps check dtype and space
    return env
