"""Data contracts shared by every trainer: environment description, acting output, rollouts.

Rollouts are *time-major* numpy arrays ``[T, N, ...]`` (T steps per env, N envs). They stay numpy
because the collector writes them in place (cheap) and they cross process boundaries as plain buffers;
algorithms turn them into tensors with ``torch.from_numpy`` (zero copy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

ActionKind = Literal["discrete", "box"]
Metrics = dict[str, float]


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm must know about an environment to build its networks."""

    env_id: str
    obs_shape: tuple[int, ...]
    action_kind: ActionKind
    action_shape: tuple[int, ...]  # () for discrete
    n_actions: int = 0  # discrete only
    action_low: tuple[float, ...] = ()  # box only
    action_high: tuple[float, ...] = ()  # box only

    @property
    def action_dtype(self) -> np.dtype:
        return np.dtype(np.int64) if self.action_kind == "discrete" else np.dtype(np.float32)

    def describe(self) -> str:
        if self.action_kind == "discrete":
            return f"Discrete({self.n_actions})"
        return f"Box(shape={self.action_shape})"


@dataclass
class ActOutput:
    """Result of ``Policy.act`` for a batch of N observations.

    action:   [N] int64 (discrete) or [N, A] float32 (box, unclipped sample)
    log_prob: [N] float32, log-probability of ``action`` under the acting policy
    """

    action: torch.Tensor
    log_prob: torch.Tensor


@dataclass
class Rollout:
    """T steps of N environments, time-major.

    obs:            [T, N, *obs_shape] float32, raw (unnormalised) observation acted on
    actions:        [T, N, *action_shape] (int64 or float32)
    log_probs:      [T, N] float32, behaviour log-prob (for PPO ratios, V-trace rhos)
    rewards:        [T, N] float32, raw rewards
    terminated:     [T, N] bool, the MDP ended: no bootstrap
    truncated:      [T, N] bool, cut by a time limit: bootstrap from ``next_obs``
    next_obs:       [T, N, *obs_shape] float32, the true next observation (the final one when the
                    episode ended; gymnasium's autoreset observation never enters a transition)
    policy_version: [T] int64, version of the weights that chose the actions
    env_ids:        [N] int64 or None, the env stream each column comes from (None: column n is stream n);
                    a replay buffer links a rollout's last step to the next rollout of the same stream
    """

    obs: np.ndarray
    actions: np.ndarray
    log_probs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: np.ndarray
    policy_version: np.ndarray
    episode_returns: list[float] = field(default_factory=list)  # episodes that finished in this rollout
    episode_lengths: list[int] = field(default_factory=list)
    env_ids: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.rewards.size)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rewards.shape  # type: ignore[return-value]


class Policy(nn.Module, ABC):
    """The only object shipped to actors / agent processes. Acts on a batch of raw observations."""

    @abstractmethod
    def act(self, obs: Tensor, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        """obs [N, *obs_shape] float32 -> ActOutput(action [N, ...], log_prob [N])."""
