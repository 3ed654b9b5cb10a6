"""Hindsight experience replay (Andrychowicz et al. 2017, "Hindsight Experience Replay"), "future" strategy.

On a goal-conditioned task (Gymnasium-Robotics' convention: a Dict observation with ``observation``,
``achieved_goal`` and ``desired_goal``, and an env ``compute_reward(achieved_goal, desired_goal, info)``) a
sparse reward is almost never seen by a random policy. HER replays a transition as if the goal had been one
the agent actually reached later in the same episode: in a batch of B, the first ``int(B * k / (k + 1))``
transitions (SB3's ``her_ratio = 1 - 1 / (k + 1)``, k = ``n_sampled_goal`` = 4) get a new desired goal, the
achieved goal after a transition drawn uniformly from this one to the episode's last so far (inclusive, as
SB3's), in ``obs`` and ``next_obs`` alike, and the reward the env's ``compute_reward`` gives for it: the
achieved goal of the NEXT observation against the new goal (the reward of s -> s' depends on s'). The
``terminated`` flag is the stored one (as SB3's). Relabelling happens at sampling time, so every sample draws
new goals.

The replay buffer (data/replay.py) keeps each env stream's transitions as a chain of rows (``next_gid``), ending
in an episode's final row; this module walks those chains, vectorised over the batch: the cost is one gather
per step of the longest remainder of an episode in the batch (goal tasks' episodes are short: 50 steps for
Fetch). An episode still running offers the transitions that have arrived so far (SB3 samples only finished
episodes). ``compute_reward`` is called once on the whole batch when it is vectorised, as Gymnasium-Robotics'
is (judged from its first call), else once per row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rltrain.data.replay import Batch, ReplayBuffer
from rltrain.data.structs import ObsSpace
from rltrain.errors import ConfigError

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
GoalReward = Callable[[np.ndarray, np.ndarray, dict], np.ndarray]


def goal_keys_missing(obs: ObsSpace) -> str | None:
    """Why ``obs`` is not a goal-conditioned observation (one phrase), or None."""
    keys = [k for k, _ in obs.parts] if obs.kind == "dict" else []
    missing = [k for k in GOAL_KEYS[1:] if k not in keys]
    if missing:
        return f"its observation is {obs.name or obs.kind}, with no key {missing[0]!r}"
    return None


class HindsightSampler:
    """``sample(batch_size)``: the buffer's uniform sample, the first ``her_ratio`` of it relabelled."""

    def __init__(self, buffer: ReplayBuffer, *, k: int, reward: GoalReward):
        if not buffer.tree or not isinstance(buffer.obs, dict) or "desired_goal" not in buffer.obs:
            raise ConfigError("hindsight replay needs Dict observations with achieved_goal and desired_goal")
        self.buffer, self.k, self.reward = buffer, int(k), reward
        self.her_ratio = 1.0 - 1.0 / (self.k + 1)
        self.vectorised: bool | None = None  # learned from compute_reward's first call

    def sample(self, batch_size: int) -> Batch:
        buf = self.buffer
        slots = buf._draw(batch_size)
        virtual = int(self.her_ratio * batch_size)
        batch = buf.batch(slots)
        if virtual == 0:
            return batch
        future = self.future_rows(buf._gids(slots[:virtual]))
        goals = buf.obs["achieved_goal"][buf.next_gid[future % buf.capacity] % buf.capacity]
        achieved_next = batch.next_obs["achieved_goal"][:virtual].cpu().numpy()
        rewards = self.rewards(achieved_next, goals)
        to = torch.from_numpy(goals).to(batch.rewards.device)
        for obs in (batch.obs, batch.next_obs):  # gathered copies: written in place
            obs["desired_goal"][:virtual] = to
        batch.rewards[:virtual] = torch.from_numpy(rewards).to(batch.rewards.device)
        return batch

    def future_rows(self, gids: np.ndarray) -> np.ndarray:
        """gids [V] of sampleable transitions -> [V] gids of a transition drawn uniformly from each one to the
        last of its episode whose successor has arrived (inclusive)."""
        buf, C = self.buffer, self.buffer.capacity
        next_gid, final = buf.next_gid, buf.final
        cur = gids % C  # walked in slots: one modulo per step
        chain = [cur]
        while True:
            nxt = next_gid[cur] % C
            # the next row continues the episode if it is a transition (not the episode's final row) whose own
            # successor has arrived. A chain that stopped stays on its row, whose next row fails this again (the
            # buffer does not change during the walk): no mask of the chains still running is needed
            ok = ~final[nxt] & (next_gid[nxt] >= 0)
            if not ok.any():
                break
            cur = np.where(ok, nxt, cur)
            chain.append(cur)
        steps = np.stack(chain)  # [L, V] slots; a finished chain repeats its last row
        lengths = 1 + (steps[1:] != steps[:-1]).sum(0)
        pick = (np.random.random(len(gids)) * lengths).astype(np.int64)
        return buf._gids(steps[pick, np.arange(len(gids))])

    def rewards(self, achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        """``compute_reward`` on [V, G] goals -> [V] float32: one vectorised call where the env's is."""
        if self.vectorised is not False:
            try:
                out = np.asarray(self.reward(achieved, desired, {}), np.float32)
            except Exception:  # a per-goal compute_reward that cannot take a batch (noqa: the fallback below)
                out = None
            if out is not None and out.shape == (len(achieved),):
                self.vectorised = True
                return out
            if self.vectorised:
                raise ValueError(f"compute_reward returned shape {None if out is None else out.shape} for "
                                 f"{len(achieved)} goals")
            self.vectorised = False
        return np.array([float(self.reward(a, d, {})) for a, d in zip(achieved, desired, strict=True)], np.float32)
