"""``SlotRows``: one policy group's rollout being filled, a column per slot, each at its own pace.

A slot's column is its agent's own transitions in order. Acting opens the slot's next row (observation,
action, log-prob); the env's answer closes it (reward, done flags, next observation). A parallel env closes a
row in the step that opened it; an AEC env when the agent's turn comes back. ``rollout(T)`` hands over the
first T rows of every slot: a slot short of T (its agent was done, or its env stopped for another slot that
was full) is padded with invalid rows (``Rollout.valid``), its last real row cut as a truncation (it bootstraps
from its true next observation, as any rollout's last row does, and no return crosses into the padding); a row
still open is carried, with the core state it acted from, to the front of the next rollout.
"""

from __future__ import annotations

import numpy as np
import torch

from rltrain.data.agents import AGENT_ID_KEY, OBS_KEY, STATE_KEY, AgentGroup
from rltrain.data.structs import Rollout, obs_buffer, obs_map, obs_put
from rltrain.models.cores import CoreState


class SlotRows:
    """Rows of one group over ``slots`` slots; ``fill[s]``: closed rows of slot s, ``open[s]``: row ``fill[s]``
    holds an action awaiting its outcome."""

    def __init__(self, group: AgentGroup, slots: int):
        self.group, self.slots = group, slots
        self.fill = np.zeros(slots, np.int64)
        self.open = np.zeros(slots, bool)
        self.carry: dict | None = None  # the open rows carried over (see ``rollout``)
        self.arrays: dict = {}

    def begin(self, T: int) -> None:
        """Fresh storage for T rows per slot (+ one for a row left open), the carried open rows in front."""
        spec, lead = self.group.spec, (T + 1, self.slots)
        self.arrays = {"obs": obs_buffer(spec.observation, lead, np.zeros),
                       "next_obs": obs_buffer(spec.observation, lead, np.zeros),
                       "actions": np.zeros((*lead, *spec.action_shape), spec.action_dtype),
                       "log_probs": np.zeros(lead, np.float32), "rewards": np.zeros(lead, np.float32),
                       "terminated": np.zeros(lead, bool), "truncated": np.zeros(lead, bool)}
        self.fill[:] = 0
        if self.carry is not None:
            cols = np.flatnonzero(self.open)
            obs_put(self.arrays["obs"], (0, cols), self.carry["obs"])
            self.arrays["actions"][0, cols] = self.carry["actions"]
            self.arrays["log_probs"][0, cols] = self.carry["log_probs"]
            self.carry = None

    def write_obs(self, key: str, rows: np.ndarray, cols: np.ndarray, agent_obs: list, ids: list[int],
                  states: list | None) -> None:
        """Observations of the agents of slots ``cols`` (at ``rows``) as the group's policy reads them (data/
        agents.py ``group_observation``): ``agent_obs[i]`` the agent's own, ``ids[i]`` its index in the group,
        ``states[i]`` the global state (or None). ``key``: ``obs`` or ``next_obs``."""
        g, dst = self.group, self.arrays[key]
        if g.flat:
            width = dst.shape[-1] - g.ids
            dst[rows, cols, :width] = np.stack(agent_obs)
            dst[rows, cols, width:] = 0.0
            dst[rows, cols, width + np.asarray(ids)] = 1.0
            return
        if not g.ids and not g.state:
            for i, obs in enumerate(agent_obs):
                obs_put(dst, (rows[i], cols[i]), obs)
            return
        for i, obs in enumerate(agent_obs):
            index = (rows[i], cols[i])
            if isinstance(obs, dict):
                for k, v in obs.items():
                    if k in dst:
                        obs_put(dst[k], index, v)
            else:
                obs_put(dst[OBS_KEY], index, obs)
            if g.ids:
                dst[AGENT_ID_KEY][index] = 0.0
                dst[AGENT_ID_KEY][index + (ids[i],)] = 1.0
            if g.state:
                dst[STATE_KEY][index] = states[i]  # type: ignore[index]

    def batch(self, cols: np.ndarray) -> object:
        """The open rows' observations of slots ``cols`` as one batch [B, ...] (for acting)."""
        rows = self.fill[cols]
        return obs_map(lambda x: x[rows, cols], self.arrays["obs"])

    def act(self, cols: np.ndarray, actions: np.ndarray, log_probs: np.ndarray) -> None:
        rows = self.fill[cols]
        self.arrays["actions"][rows, cols] = actions
        self.arrays["log_probs"][rows, cols] = log_probs
        self.open[cols] = True

    def close(self, col: int, reward: float, terminated: bool, truncated: bool) -> int:
        """The outcome of slot ``col``'s open row (its next observation is written by ``write_obs``); returns the
        row."""
        row = int(self.fill[col])
        a = self.arrays
        a["rewards"][row, col], a["terminated"][row, col], a["truncated"][row, col] = reward, terminated, truncated
        self.fill[col] += 1
        self.open[col] = False
        return row

    def rollout(self, T: int, version: int, start: CoreState | None) -> Rollout:
        """The first T rows of every slot (module docstring); the open rows are kept for the next ``begin``."""
        a, fill = self.arrays, self.fill
        cols = np.flatnonzero(self.open)
        if len(cols):
            rows = fill[cols]
            self.carry = {"obs": obs_map(lambda x: x[rows, cols].copy(), a["obs"]),
                          "actions": a["actions"][rows, cols].copy(), "log_probs": a["log_probs"][rows, cols].copy()}
        valid = np.arange(T)[:, None] < fill[None, :]
        for s in np.flatnonzero(fill < T):
            last = int(fill[s]) - 1
            pad = slice(last + 1, T)
            if last >= 0:
                if not a["terminated"][last, s]:
                    a["truncated"][last, s] = True  # cut here: bootstrap from the true next observation
                for key in ("obs", "next_obs"):  # a padding row repeats the last observation (finite, in range)
                    obs_map(lambda dst, src, s=s, last=last, pad=pad: dst.__setitem__((pad, s), src[last, s]), a[key],
                            a["next_obs"])
            a["terminated"][pad, s] = True  # an episode of its own each: nothing flows across a padding row
            a["rewards"][pad, s] = 0.0
            a["actions"][pad, s] = a["actions"][max(last, 0), s]
        cut = lambda x: x[:T]  # noqa: E731
        return Rollout(obs=obs_map(cut, a["obs"]), actions=cut(a["actions"]), log_probs=cut(a["log_probs"]),
                       rewards=cut(a["rewards"]), terminated=cut(a["terminated"]), truncated=cut(a["truncated"]),
                       next_obs=obs_map(cut, a["next_obs"]), policy_version=np.full(T, version, np.int64),
                       core_state=start, valid=None if valid.all() else valid)

    def state_dict(self) -> dict:
        """The open rows (exact resume of an AEC env paused between a move and its outcome)."""
        cols = np.flatnonzero(self.open)
        rows = self.fill[cols]
        a = self.arrays
        return {"open": torch.from_numpy(self.open.copy()),
                "obs": obs_map(lambda x: torch.from_numpy(x[rows, cols].copy()), a["obs"]),
                "actions": torch.from_numpy(a["actions"][rows, cols].copy()),
                "log_probs": torch.from_numpy(a["log_probs"][rows, cols].copy())}

    def load_state_dict(self, state: dict) -> None:
        self.open = state["open"].numpy().copy()
        if self.open.any():
            self.carry = {"obs": obs_map(lambda x: x.numpy(), state["obs"]), "actions": state["actions"].numpy(),
                          "log_probs": state["log_probs"].numpy()}

