"""Preallocated ring replay buffer for the off-policy algorithms (DQN, SAC).

Storage is numpy, allocated once at full capacity (no growth, no Python lists of transitions): ``add``
copies a flattened rollout in with at most two slice writes, ``sample`` gathers uniform indices and hands
tensors out through ``torch.from_numpy``. Only ``terminated`` is stored: a truncated transition keeps
its true ``next_obs`` and bootstraps from it like any other (Pardo et al. 2018).

The buffer can travel in checkpoints (``checkpoint.replay_buffer=true``): ``state_dict`` holds only the
filled part, so a checkpoint costs what the buffer holds, not its capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rltrain.data.structs import Rollout
from rltrain.errors import ConfigError


@dataclass
class Batch:
    """A sampled minibatch of B transitions (tensors on the learner's device).

    obs [B, *obs_shape], actions [B, *action_shape], rewards [B], next_obs [B, *obs_shape],
    terminated [B] float32 (1.0 = no bootstrap)
    """

    obs: Tensor
    actions: Tensor
    rewards: Tensor
    next_obs: Tensor
    terminated: Tensor


class ReplayBuffer:
    """Uniform-sampling ring buffer of single transitions."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype, *, device: torch.device):
        if capacity <= 0:
            raise ConfigError(f"algo.buffer_size={capacity} must be > 0")
        self.capacity, self.device = int(capacity), device
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), np.float32)
        self.actions = np.zeros((capacity, *action_shape), action_dtype)
        self.rewards = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, np.float32)
        self.pos = 0  # next write index
        self.size = 0  # number of valid rows

    def __len__(self) -> int:
        return self.size

    def add_rollout(self, rollout: Rollout) -> None:
        """Append every transition of a time-major rollout ``[T, N, ...]`` (flattened to T*N rows)."""
        T, N = rollout.shape
        flat = lambda x: x.reshape(T * N, *x.shape[2:])  # noqa: E731
        self.add(flat(rollout.obs), flat(rollout.actions), flat(rollout.rewards), flat(rollout.next_obs),
                 flat(rollout.terminated))

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray) -> None:
        """Append B transitions (leading dim B); the oldest rows are overwritten once full."""
        b = obs.shape[0]
        if b > self.capacity:  # only the newest `capacity` rows can survive
            keep = slice(b - self.capacity, b)
            obs, actions, rewards, next_obs, terminated = (x[keep] for x in (obs, actions, rewards, next_obs,
                                                                              terminated))
            b = self.capacity
        idx = (self.pos + np.arange(b)) % self.capacity
        self.obs[idx] = obs
        self.actions[idx] = actions
        self.rewards[idx] = rewards
        self.next_obs[idx] = next_obs
        self.terminated[idx] = terminated
        self.pos = int((self.pos + b) % self.capacity)
        self.size = min(self.size + b, self.capacity)

    def sample(self, batch_size: int) -> Batch:
        """Uniform sample with replacement; draws from numpy's global RNG (seeded, checkpointed)."""
        idx = np.random.randint(0, self.size, batch_size)
        to = lambda x: torch.from_numpy(x[idx]).to(self.device)  # noqa: E731
        return Batch(obs=to(self.obs), actions=to(self.actions), rewards=to(self.rewards),
                     next_obs=to(self.next_obs), terminated=to(self.terminated))

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Filled rows only, in storage order, plus the write position."""
        return {"pos": self.pos, "size": self.size,
                **{k: torch.from_numpy(getattr(self, k)[: self.size].copy()) for k in self.FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        size = int(state["size"])
        if size > self.capacity:
            raise ConfigError(f"the checkpoint's replay buffer holds {size} transitions, more than "
                              f"algo.buffer_size={self.capacity}")
        for k in self.FIELDS:
            getattr(self, k)[:size] = state[k].numpy()
        self.size, self.pos = size, int(state["pos"]) % self.capacity
