"""The rollouts the ``subprocess_actors`` learner consumes: ``ActorSource``, the loop's rollout source (what a
``RolloutCollector`` is for the other trainers), takes the next batch out of the actors' queue (``batches.py``)
and merges its rollouts along the env axis (``merge_rollouts``); it keeps the episode statistics of what it
consumed, as a collector does of what it collected."""

from __future__ import annotations

import functools
from collections import deque

import numpy as np
import torch

from rltrain.data.agents import MultiRollout
from rltrain.data.structs import Rollout, obs_map
from rltrain.run.signals import StopFlag
from rltrain.trainers.actors.batches import BatchQueue
from rltrain.trainers.actors.pool import ActorFailure
from rltrain.trainers.actors.stats import ActorStats


def merge_rollouts(rollouts: list[Rollout] | list[MultiRollout]) -> Rollout | MultiRollout:
    """Concatenate along the env axis: k rollouts [T, N] -> [T, k*N]; ``policy_version`` becomes [T, k*N]. A
    multi-agent env's rollouts are merged group by group (each actor's slots side by side)."""
    if len(rollouts) == 1:
        return rollouts[0]
    if isinstance(rollouts[0], MultiRollout):
        multi: list[MultiRollout] = rollouts  # type: ignore[assignment]
        agents = dict.fromkeys(a for m in multi for a in m.agent_returns)  # the env's agent order, not a set's
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
                   episode_successes=[x for r in rollouts for x in r.episode_successes],
                   # recurrent policies: each actor's start state [1, N, H] per tensor, joined like the envs
                   core_state=None if any(r.core_state is None for r in rollouts) else
                   tuple(torch.cat([torch.as_tensor(x) for x in parts], dim=1)
                         for parts in zip(*(r.core_state for r in rollouts), strict=True)))


class ActorSource:
    """Batches from the actors' queue, merged along the env axis; None once stopped or when the actors failed
    (the failure is logged and the run asked to stop: the loop checkpoints and ends)."""

    def __init__(self, queue: BatchQueue, stats: ActorStats, stop: StopFlag, window: int = 100):
        self.queue, self.stats, self.stop = queue, stats, stop
        self.recent_returns: deque[float] = deque(maxlen=window)
        self.recent_lengths: deque[int] = deque(maxlen=window)
        self.recent_successes: deque[bool] = deque(maxlen=window)
        self.agent_returns: dict[str, deque[float]] = {}  # a multi-agent env's: each agent's recent returns
        self.episodes, self.window = 0, window

    def collect(self, rollout_len: int, *, policy_version: int, random_actions: bool) -> Rollout | None:
        """The next batch (``rollout_len`` and ``random_actions`` are the actors' business: their spec says)."""
        try:
            batch = self.queue.next_batch(policy_version, self.stop)
        except ActorFailure:  # the run ends failed: its one line is the summary's error (ActorPool.failure)
            self.stop.request("actor_failure")
            return None
        if not batch:
            return None
        self.stats.batch([policy_version - m.version for m in batch])
        rollout = merge_rollouts([m.rollout() for m in batch])
        self.recent_returns.extend(rollout.episode_returns)
        self.recent_lengths.extend(rollout.episode_lengths)
        self.recent_successes.extend(getattr(rollout, "episode_successes", []))
        self.episodes += len(rollout.episode_returns)
        for agent, returns in getattr(rollout, "agent_returns", {}).items():
            self.agent_returns.setdefault(agent, deque(maxlen=self.window)).extend(returns)
        return rollout

    def state_dict(self) -> dict:
        return {"recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths),
                "recent_successes": list(self.recent_successes), "episodes": self.episodes}

    def load_state_dict(self, state: dict, venv_blob: bytes | None) -> bool:
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        self.recent_successes.extend(state.get("recent_successes", []))
        self.episodes = int(state["episodes"])
        return True  # nothing to reseed here: a resumed actor is a new generation with seeds of its own

    def env_state(self) -> bytes | None:
        return None  # the envs live in the actors; a resumed actor is a new generation with fresh episodes

    def close(self) -> None:
        pass  # the trainer stops the actors (ActorPool.stop) after the loop, also when it failed
