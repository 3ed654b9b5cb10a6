"""The rollouts the ``subprocess_actors`` learner consumes: several actors' rollouts merged along the env
axis into one batch (``merge_rollouts``), and the episode statistics of what it consumed (``EpisodeStats``,
the learner's stand-in for a collector's)."""

from __future__ import annotations

import functools
from collections import deque

import numpy as np
import torch

from rltrain.data.agents import MultiRollout
from rltrain.data.structs import Rollout, obs_map


def merge_rollouts(rollouts: list[Rollout] | list[MultiRollout]) -> Rollout | MultiRollout:
    """Concatenate along the env axis: k rollouts [T, N] -> [T, k*N]; ``policy_version`` becomes [T, k*N]. A
    multi-agent env's rollouts are merged group by group (each actor's slots side by side)."""
    if len(rollouts) == 1:
        return rollouts[0]
    if isinstance(rollouts[0], MultiRollout):
        multi: list[MultiRollout] = rollouts  # type: ignore[assignment]
        agents = {a for m in multi for a in m.agent_returns}
        return MultiRollout({name: merge_rollouts([m.groups[name] for m in multi]) for name in multi[0].groups},
                            sum(m.env_steps for m in multi),
                            episode_returns=[x for m in multi for x in m.episode_returns],
                            episode_lengths=[x for m in multi for x in m.episode_lengths],
                            agent_returns={a: [x for m in multi for x in m.agent_returns.get(a, [])] for a in agents})
    cat = functools.partial(np.concatenate, axis=1)
    T = rollouts[0].shape[0]
    versions = [np.broadcast_to(r.policy_version.reshape(T, -1), r.shape) for r in rollouts]
    # per key for Dict observations
    obs_cat = functools.partial(obs_map, lambda *xs: np.concatenate(xs, axis=1))
    return Rollout(obs=obs_cat(*[r.obs for r in rollouts]), actions=cat([r.actions for r in rollouts]),
                   log_probs=cat([r.log_probs for r in rollouts]), rewards=cat([r.rewards for r in rollouts]),
                   terminated=cat([r.terminated for r in rollouts]),
                   truncated=cat([r.truncated for r in rollouts]),
                   next_obs=obs_cat(*[r.next_obs for r in rollouts]), policy_version=cat(versions),
                   env_ids=None if any(r.env_ids is None for r in rollouts)
                   else np.concatenate([r.env_ids for r in rollouts]),
                   # padding rows of multi-agent slots (data/agents.py): every row of a rollout without any is valid
                   valid=None if all(r.valid is None for r in rollouts) else
                   cat([np.ones(r.shape, bool) if r.valid is None else r.valid for r in rollouts]),
                   episode_returns=[x for r in rollouts for x in r.episode_returns],
                   episode_lengths=[x for r in rollouts for x in r.episode_lengths],
                   # recurrent policies: each actor's start state [1, N, H] per tensor, joined like the envs
                   core_state=None if any(r.core_state is None for r in rollouts) else
                   tuple(torch.cat([torch.as_tensor(x) for x in parts], dim=1)
                         for parts in zip(*(r.core_state for r in rollouts), strict=True)))


class EpisodeStats:
    """The learner's stand-in for a collector: episode statistics of the rollouts it consumed."""

    def __init__(self, window: int = 100):
        self.recent_returns: deque[float] = deque(maxlen=window)
        self.recent_lengths: deque[int] = deque(maxlen=window)
        self.agent_returns: dict[str, deque[float]] = {}  # a multi-agent env's: each agent's recent returns
        self.episodes = 0
        self.window = window

    def add(self, rollout: Rollout | MultiRollout) -> None:
        for agent, returns in getattr(rollout, "agent_returns", {}).items():
            self.agent_returns.setdefault(agent, deque(maxlen=self.window)).extend(returns)
        self.recent_returns.extend(rollout.episode_returns)
        self.recent_lengths.extend(rollout.episode_lengths)
        self.episodes += len(rollout.episode_returns)

    def state_dict(self) -> dict:
        return {"recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths),
                "episodes": self.episodes}

    def load_state_dict(self, state: dict, venv_blob: bytes | None) -> None:
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        self.episodes = int(state["episodes"])
