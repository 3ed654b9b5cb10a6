"""A stand-in policy for tests that drive ``trainers/episodes.evaluate`` directly: enough of the ``Policy``
interface to step envs, with no network."""

from __future__ import annotations

from types import SimpleNamespace

import torch


class StubPolicy:
    """Acts uniformly at random over ``n`` discrete actions from the evaluation's generator (enough to play games
    to their end), or 0 on every env where ``n`` is None."""

    training = False

    def __init__(self, n: int | None = None):
        self.n = n

    def initial_state(self, n):
        return None

    def eval(self):
        pass

    def train(self, mode):
        pass

    def act(self, obs, deterministic=True, generator=None):
        rows = next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]
        if self.n is None:
            return SimpleNamespace(action=torch.zeros(rows, dtype=torch.int64))
        return SimpleNamespace(action=torch.randint(self.n, (rows,), generator=generator))
