"""Envs for scripts/bench_defaults.py, bench_sac_pixels.py, bench_offpolicy.py and bench_algorithms.py that
Gymnasium does not register: a Dict image + vector task, a memory task, MiniGrid with only its image, a point mass
steered from pixels, a goal-conditioned reaching task with a Dict of three small vectors and the bit-flipping goal
task (rltrain, as ``env.id=bench_envs:<name>``, its tests, SB3 and RLlib build them from here)."""

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


class CueRecall(gym.Env):
    """A memory task: the first observation shows a cue (one of two, one-hot), the next ``delay`` observations are
    blank, then a query flag asks for the cue: the action taken at the query is rewarded +1 if it names the cue, -1
    if not, and ends the episode (actions before it do nothing). A memoryless policy sees the same query whatever
    the cue, so its best expected return is 0; a policy that remembers gets 1. The cue is drawn anew each episode.

    Observation [cue 0, cue 1, query] float32; 2 actions; ``delay + 2`` steps an episode."""

    def __init__(self, delay: int = 5):
        self.delay = delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        elif self.t == self.delay + 1:
            obs[2] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(0, 2)), 0
        return self._obs(), {}

    def step(self, action):
        if self.t == self.delay + 1:  # the query: the answer ends the episode
            return self._obs(), 1.0 if int(action) == self.cue else -1.0, True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}


def minigrid_image(name: str = "MiniGrid-Empty-8x8-v0", **kwargs) -> gym.Env:
    """A MiniGrid task observed through its 7x7x3 grid of (object, colour, state) indices only (ImgObsWrapper:
    what SB3's and rl-zoo's MiniGrid runs feed an MLP policy)."""
    import minigrid  # noqa: F401  (registers the MiniGrid ids)
    from minigrid.wrappers import ImgObsWrapper

    return ImgObsWrapper(gym.make(name, **kwargs))


class PointMassPixels(gym.Env):
    """Continuous control from pixels: a point mass in the unit square steered by a 2-D velocity command in
    [-1, 1]^2 towards a goal that moves every episode, seen only as an 84x84 RGB uint8 frame (the agent a red
    square, the goal a green one: the frame size of Atari and of the DeepMind Control Suite runs in SAC-AE and
    DrQ). Reward: minus the distance to the goal each step; reaching it (within 0.1) ends the episode; 50 steps
    at most. For SAC from pixels, which needs Box actions (scripts/bench_sac_pixels.py)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, size: int = 84, max_steps: int = 50, speed: float = 0.1):
        self.size, self.max_steps, self.speed = size, max_steps, speed
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.render_mode = "rgb_array"

    def _square(self, img: np.ndarray, where: np.ndarray, channel: int) -> None:
        r, c = (where * (self.size - 1)).round().astype(int)
        half = max(1, self.size // 28)
        img[max(r - half, 0):r + half + 1, max(c - half, 0):c + half + 1, channel] = 255

    def render(self) -> np.ndarray:
        img = np.zeros(self.observation_space.shape, np.uint8)
        self._square(img, self.goal, 1)
        self._square(img, self.pos, 0)
        return img

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos, self.goal = self.np_random.uniform(0.0, 1.0, (2, 2))
        self.t = 0
        return self.render(), {}

    def step(self, action):
        move = np.clip(np.asarray(action, np.float64).reshape(2), -1.0, 1.0) * self.speed
        self.pos = np.clip(self.pos + move, 0.0, 1.0)
        self.t += 1
        dist = float(np.linalg.norm(self.pos - self.goal))
        done = dist < 0.1
        return self.render(), -dist, done, self.t >= self.max_steps and not done, {}


class PointReach(gym.Env):
    """A goal-conditioned reaching task shaped like Gymnasium-Robotics' FetchReach, without a simulator: a point in
    3-D moved by a velocity command in [-1, 1]^3 (0.05 per unit per step, as Fetch's end-effector action) inside
    the box [-0.3, 0.3]^3, starting within 0.02 of the origin, toward a goal drawn uniformly within 0.15 of it
    on each axis (Fetch's target range). The observation is the robotics Dict of three small float vectors:
    ``observation`` (position and last velocity, 6), ``achieved_goal`` (the position, 3) and ``desired_goal`` (3).
    The reward is sparse, ``compute_reward``: 0 within 0.05 of the goal, else -1 (Fetch's threshold); episodes
    never terminate and are truncated at 50 steps; ``info["is_success"]`` says whether the point is at the goal."""

    threshold, step_size, bound = 0.05, 0.05, 0.3

    def __init__(self, max_steps: int = 50):
        self.max_steps = max_steps
        vec = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)  # noqa: E731
        self.observation_space = gym.spaces.Dict({"observation": vec(6), "achieved_goal": vec(3),
                                                  "desired_goal": vec(3)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        """Vectorised over leading axes, as Gymnasium-Robotics' GoalEnv (hindsight relabelling calls it)."""
        dist = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(dist > self.threshold).astype(np.float32)

    def _obs(self) -> dict:
        return {"observation": np.concatenate([self.pos, self.vel]).astype(np.float32),
                "achieved_goal": self.pos.astype(np.float32), "desired_goal": self.goal.astype(np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.02, 0.02, 3)
        self.vel = np.zeros(3)
        self.goal = self.np_random.uniform(-0.15, 0.15, 3)
        self.t = 0
        return self._obs(), {"is_success": False}

    def step(self, action):
        before = self.pos
        move = np.clip(np.asarray(action, np.float64).reshape(3), -1.0, 1.0) * self.step_size
        self.pos = np.clip(self.pos + move, -self.bound, self.bound)
        self.vel = self.pos - before
        self.t += 1
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], None))
        return obs, reward, False, self.t >= self.max_steps, {"is_success": reward == 0.0}


class BitFlip(gym.Env):
    """The bit-flipping task of Andrychowicz et al. 2017 (sec. 3.1), the hindsight replay paper's motivating
    example: n bits start random, the goal is another random n-bit string, action i flips bit i, the reward is
    0 when every bit matches and -1 otherwise, for n steps (truncated; never terminated). Discrete actions, in
    the robotics Dict: ``observation`` and ``achieved_goal`` are the bits, ``desired_goal`` the target (float32).
    Without relabelling a learner almost never sees a 0 beyond n of about 10 (2^-n chance per random string)."""

    def __init__(self, n: int = 8):
        self.n = n
        bits = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = gym.spaces.Discrete(n)

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        """Vectorised over leading axes, as Gymnasium-Robotics' GoalEnv."""
        return -(np.asarray(achieved_goal) != np.asarray(desired_goal)).any(-1).astype(np.float32)

    def _obs(self) -> dict:
        return {"observation": self.bits.copy(), "achieved_goal": self.bits.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.bits = self.np_random.integers(0, 2, self.n).astype(np.float32)
        self.goal = self.np_random.integers(0, 2, self.n).astype(np.float32)
        self.t = 0
        return self._obs(), {"is_success": bool((self.bits == self.goal).all())}

    def step(self, action):
        self.bits[int(action)] = 1.0 - self.bits[int(action)]
        self.t += 1
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], None))
        return obs, reward, False, self.t >= self.n, {"is_success": reward == 0.0}
