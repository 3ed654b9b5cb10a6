"""Envs for scripts/bench_defaults.py that Gymnasium does not register: a Dict image + vector task, and MiniGrid
with only its image (both rltrain, as ``env.id=bench_envs:<name>``, and SB3 build them from here)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

MOVES = ((0, 1), (0, -1), (1, 0), (-1, 0))


class GoalDict(gym.Env):
    """A 5x5 world drawn as a 40x40 uint8 image (8 pixels a cell) holding only the goal, which moves every
    episode, plus the agent's cell as a float vector in [0, 1]; 4 moves; reward 1 on reaching the goal, which
    ends the episode; 20 steps at most. Solving it needs the image (where the goal is) and the vector (where
    the agent is)."""

    def __init__(self, cells: int = 5, cell_px: int = 8, max_steps: int = 20):
        self.cells, self.cell_px, self.max_steps = cells, cell_px, max_steps
        side = cells * cell_px
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (side, side, 1), np.uint8),
            "position": gym.spaces.Box(0.0, 1.0, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(4)

    def _obs(self) -> dict:
        img = np.zeros(self.observation_space["image"].shape, np.uint8)
        r, c = self.goal * self.cell_px
        img[r:r + self.cell_px, c:c + self.cell_px] = 255
        return {"image": img, "position": (self.pos / (self.cells - 1)).astype(np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.goal = self.np_random.integers(0, self.cells, 2)
        self.pos = self.goal
        while (self.pos == self.goal).all():
            self.pos = self.np_random.integers(0, self.cells, 2)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + MOVES[int(action)], 0, self.cells - 1)
        self.t += 1
        done = bool((self.pos == self.goal).all())
        return self._obs(), float(done), done, self.t >= self.max_steps and not done, {}


def minigrid_image(name: str = "MiniGrid-Empty-8x8-v0", **kwargs) -> gym.Env:
    """A MiniGrid task observed through its 7x7x3 grid of (object, colour, state) indices only (ImgObsWrapper:
    what SB3's and rl-zoo's MiniGrid runs feed an MLP policy)."""
    import minigrid  # noqa: F401  (registers the MiniGrid ids)
    from minigrid.wrappers import ImgObsWrapper

    return ImgObsWrapper(gym.make(name, **kwargs))
