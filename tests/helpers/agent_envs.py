"""Small PettingZoo envs for the multi-agent tests: heterogeneous agents, agents that finish at different times,
turns, and spaces or games that rltrain must refuse. Each is a real ``ParallelEnv`` / ``AECEnv`` (PettingZoo's
own base classes and API), used as ``env.id=tests.helpers.agent_envs:<factory>``.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import AECEnv, ParallelEnv


class Uneven(ParallelEnv):
    """Three agents with spaces of their own, done at different steps of an episode of ``length`` steps:

    - ``scout``: Box(3) observation, Discrete(3) action, terminated after ``length // 3`` steps;
    - ``pilot``: Box(4) observation, Box(2) action in [-1, 1], terminated after ``2 * length // 3`` steps;
    - ``clerk``: Dict(pos: Box(2), tag: MultiBinary(3)) observation, MultiDiscrete([2, 3]) action, truncated
      with the episode at ``length``.

    Rewards teach something simple: scout +1 for action ``step % 3``; pilot minus the distance of its action
    from (0.5, -0.5); clerk +1 per component equal to the tag's first bits. ``state()`` is every number
    joined. ``log`` records (agent, step) of every action taken, to check the adapter's bookkeeping."""

    metadata = {"name": "uneven_v0", "is_parallelizable": True}

    def __init__(self, length: int = 9, with_state: bool = True):
        self.length, self.with_state = length, with_state
        self.possible_agents = ["scout", "pilot", "clerk"]
        self.ends = {"scout": length // 3, "pilot": 2 * length // 3, "clerk": length}
        self._obs = {"scout": spaces.Box(-1, 1, (3,), np.float32), "pilot": spaces.Box(-1, 1, (4,), np.float32),
                     "clerk": spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "tag": spaces.MultiBinary(3)})}
        self._act = {"scout": spaces.Discrete(3), "pilot": spaces.Box(-1, 1, (2,), np.float32),
                     "clerk": spaces.MultiDiscrete([2, 3])}
        self.state_space = spaces.Box(-1, 1, (12,), np.float32)
        self.log: list[tuple[str, int]] = []

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def _observe(self, agent):
        t = self.t / self.length
        if agent == "scout":
            return np.array([t, np.sin(self.t), (self.t % 3) / 2], np.float32)
        if agent == "pilot":
            return np.array([t, 0.5, -0.5, self.rng.uniform(-1, 1)], np.float32)
        return {"pos": np.array([t, -t], np.float32), "tag": self.tag.copy()}

    def state(self):
        if not self.with_state:
            raise NotImplementedError
        clerk = self._observe("clerk")
        return np.concatenate([self._observe("scout"), self._observe("pilot"), clerk["pos"],
                               clerk["tag"].astype(np.float32)])

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.tag = self.rng.integers(0, 2, 3).astype(np.int8)
        self.agents = list(self.possible_agents)
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.log += [(a, self.t) for a in actions]
        rewards = {}
        for agent, action in actions.items():
            if agent == "scout":
                rewards[agent] = float(int(action) == self.t % 3)
            elif agent == "pilot":
                rewards[agent] = -float(np.abs(np.asarray(action) - [0.5, -0.5]).sum())
            else:
                rewards[agent] = float((np.asarray(action) == self.tag[:2]).sum())
        self.t += 1
        terms = {a: self.t >= self.ends[a] and a != "clerk" for a in self.agents}
        truncs = {a: self.t >= self.length and a == "clerk" for a in self.agents}
        obs = {a: self._observe(a) for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def uneven(length: int = 9, with_state: bool = True) -> Uneven:
    return Uneven(length, with_state)


class Turns(AECEnv):
    """An AEC game of ``players`` agents taking turns on a counter: each adds 1 or 2 (Discrete(2) + 1), an
    ``action_mask`` forbidding 2 when it would pass ``target``. The agent that reaches ``target`` gets +1, every
    other -1 (``zero_sum=False``: everyone gets +1, a cooperative game). Agent ``p1`` of three is eliminated
    (terminated, reward 0) once the counter passes ``target // 2``: an agent that finishes early."""

    metadata = {"name": "turns_v0", "is_parallelizable": False}

    def __init__(self, players: int = 2, target: int = 7, zero_sum: bool = True):
        super().__init__()
        self.players, self.target, self.zero_sum = players, target, zero_sum
        self.possible_agents = [f"p{i}" for i in range(players)]
        self._space = spaces.Dict({"observation": spaces.Box(0, 1, (target + 1,), np.float32),
                                   "action_mask": spaces.Box(0, 1, (2,), np.int8)})
        self._action = spaces.Discrete(2)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._action

    def observe(self, agent):
        obs = np.zeros(self.target + 1, np.float32)
        obs[min(self.count, self.target)] = 1.0
        mask = np.array([1, int(self.count + 2 <= self.target)], np.int8)
        return {"observation": obs, "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.count = 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def _next(self, agent):
        """The next agent after ``agent`` in seat order that is still playing (or ``agent``)."""
        order = self.possible_agents
        i = order.index(agent)
        later = [order[(i + k) % len(order)] for k in range(1, len(order) + 1)]
        return next((a for a in later if a in self.agents and not self.terminations[a]), agent)

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.count += int(action) + 1
        if self.count >= self.target:
            for a in self.agents:
                self.rewards[a] = 1.0 if (a == agent or not self.zero_sum) else -1.0
                self.terminations[a] = True
        elif self.players > 2 and "p1" in self.agents and self.count > self.target // 2:
            self.terminations["p1"] = True
        self._accumulate_rewards()
        self.agent_selection = self._next(agent)
        self._deads_step_first()  # PettingZoo's convention: a done agent takes its dead step next


def turns(players: int = 2, target: int = 7, zero_sum: bool = True) -> Turns:
    return Turns(players, target, zero_sum)


class Picky(ParallelEnv):
    """Two agents whose action spaces rltrain translates at the env boundary, each checking what it gets as a
    strict env does: ``chooser`` acts in Discrete(3, start=-1) (-1, 0, 1; +1 for the value its one-hot
    observation points to, and an ``action_mask`` key when ``masked``: value 1 illegal), ``mover`` in
    Box(-0.1, 0.3, (2,), float64) (minus its distance to the observed target). ``step`` raises on an action
    outside its agent's space or of another dtype. Observations are float64; episodes last ``length`` steps."""

    metadata = {"name": "picky_v0", "is_parallelizable": True}

    def __init__(self, length: int = 6, masked: bool = False):
        self.length, self.masked = length, masked
        self.possible_agents = ["chooser", "mover"]
        choice = spaces.Box(0, 1, (3,), np.float64)
        self._obs = {"chooser": spaces.Dict({"observation": choice, "action_mask": spaces.MultiBinary(3)})
                     if masked else choice, "mover": spaces.Box(-1, 1, (2,), np.float64)}
        self._act = {"chooser": spaces.Discrete(3, start=-1), "mover": spaces.Box(-0.1, 0.3, (2,), np.float64)}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def _observe(self) -> dict:
        self.pick = int(self.rng.integers(2 if self.masked else 3))  # the index of the value to choose
        self.target = self.rng.uniform(-1, 1, 2)
        choice = np.eye(3)[self.pick]
        return {"chooser": {"observation": choice, "action_mask": np.array([1, 1, 0], np.int8)} if self.masked
                else choice, "mover": self.target.copy()}

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        chosen, moved = actions["chooser"], actions["mover"]
        if not self._act["chooser"].contains(chosen) or (self.masked and int(chosen) == 1):
            raise ValueError(f"chooser's action {chosen!r} is not in {self._act['chooser']} (or is masked)")
        space = self._act["mover"]
        if not (isinstance(moved, np.ndarray) and moved.dtype == space.dtype and space.contains(moved)):
            raise ValueError(f"mover's action {moved!r} ({getattr(moved, 'dtype', type(moved))}) is not in {space}")
        rewards = {"chooser": float(int(chosen) == self.pick - 1),
                   "mover": -float(np.abs(moved - np.clip(self.target, space.low, space.high)).sum())}
        self.t += 1
        done = self.t >= self.length
        truncs = dict.fromkeys(self.agents, done)
        out = self._observe(), rewards, dict.fromkeys(self.agents, False), truncs, {a: {} for a in self.agents}
        if done:
            self.agents = []
        return out


def picky(length: int = 6, masked: bool = False) -> Picky:
    return Picky(length, masked)


class Odd(ParallelEnv):
    """Two agents whose observations rltrain cannot take as they are: ``text`` observes a Text space (no
    encoder); ``tagged`` a Dict with a Text part beside a Box, and no ``state()`` (no global state can be joined:
    Text has no numbers); ``index`` Discrete indices with no ``state()`` (joined one-hot)."""

    metadata = {"name": "odd_v0"}

    def __init__(self, kind: str = "text"):
        self.kind = kind
        self.possible_agents = ["a", "b"]
        self._obs = {"text": spaces.Text(8), "index": spaces.Discrete(4),
                     "tagged": spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "note": spaces.Text(8)})}[kind]
        self._action = spaces.Discrete(2)

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._action

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: self._obs.sample() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        done = self.t >= 5
        obs = {a: self._obs.sample() for a in self.agents}
        out = (obs, dict.fromkeys(self.agents, 1.0), dict.fromkeys(self.agents, done),
               dict.fromkeys(self.agents, False), {a: {} for a in self.agents})
        if done:
            self.agents = []
        return out


def odd(kind: str = "text") -> Odd:
    return Odd(kind)


class Stowaway(ParallelEnv):
    """Two agents listed in ``possible_agents``; at step 2 a third ('c') that it does not list joins, which
    rltrain refuses in one line naming it."""

    metadata = {"name": "stowaway_v0"}

    def __init__(self):
        self.possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["a", "b"]
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        if self.t == 2:
            self.agents = [*self.agents, "c"]
        flags = dict.fromkeys(self.agents, False)
        return ({a: np.full(2, 0.5, np.float32) for a in self.agents}, dict.fromkeys(self.agents, 0.0), flags,
                dict(flags), {a: {} for a in self.agents})


def stowaway() -> Stowaway:
    return Stowaway()
