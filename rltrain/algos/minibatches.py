"""PPO's minibatches: every epoch's shuffled rows of a rollout, or whole env columns of a recurrent one.

A minibatch holds what the clipped surrogate needs (Schulman et al. 2017): observations, actions, the
behaviour log-probs, advantages A (normalised per minibatch with ``norm_adv``, as CleanRL and SB3), the
returns and the old values (value clipping). The shuffles come from the torch RNG (seeded and checkpointed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rltrain.data.structs import Rollout, obs_map
from rltrain.models.cores import CoreState


@dataclass
class Minibatch:
    """Rows of a rollout: obs [mb, ...] (a dict of them for Dict spaces), actions [mb] (int64) or [mb, A],
    old_logp / adv / ret / old_values [mb]; numpy arrays for the numpy backend, tensors on the device for torch."""

    obs: Any
    actions: Any
    old_logp: Any
    adv: Any
    ret: Any
    old_values: Any

    def outputs(self, policy) -> tuple[Tensor, Tensor]:
        """(the policy's distribution parameters [mb, P], V [mb]), with gradients."""
        return policy(self.obs)


@dataclass
class SequenceMinibatch(Minibatch):
    """Whole env columns of a recurrent rollout: obs [T, n, ...], the core state at the rollout's start (each
    [1, n, H]) and mask [T, n] (0 where an episode ended before the step); the other fields flattened to
    [T * n] (actions [T * n, ...]) in the unroll's order."""

    start: CoreState = ()
    mask: Tensor | None = None

    def outputs(self, policy) -> tuple[Tensor, Tensor]:
        out, value, _ = policy.unroll(self.obs, self.start, self.mask, keep_states=False)  # fused kernels
        B = self.old_logp.numel()
        return out.reshape(B, -1), value.reshape(B)


class RowMinibatches:
    """Every epoch's shuffled minibatches of rows, for a feed-forward policy. The permutations of all epochs are
    drawn up front and each array is gathered once per update, not once per minibatch; advantages are
    normalised per minibatch in one vectorised op. On the torch backend (``device`` set) the observations are
    gathered minibatch by minibatch as the steps ask (``MinibatchRows``): all epochs' pixels at once would hold
    E copies of the rollout. A Dict observation is gathered per key."""

    def __init__(self, obs: np.ndarray | Tensor | dict, rollout: Rollout, adv: np.ndarray, ret: np.ndarray,
                 values: np.ndarray, *, epochs: int, minibatches: int, norm_adv: bool,
                 device: torch.device | None):
        """obs [T * N, ...] as the backend reads it; adv, ret, values [T, N]; ``device`` None: numpy arrays."""
        B = rollout.rewards.size
        idx = torch.argsort(torch.rand(epochs, B), dim=1).reshape(-1).numpy()  # E independent permutations
        shape = (epochs * minibatches, B // minibatches)
        self.minibatches = minibatches

        def gather(x: np.ndarray | Tensor, time_major: bool = True) -> np.ndarray:
            # rollout arrays are [T, N, ...]; the observations come already flattened to [T * N, ...]
            # (deciding by x.shape[0] != B would skip the reshape when N == 1)
            x = x.reshape(B, *x.shape[2:]) if time_major else x
            return x[idx].reshape(*shape, *x.shape[1:])

        g_adv = gather(adv)
        if norm_adv and g_adv.shape[1] > 1:  # a one-sample minibatch has no spread (SB3 skips it too)
            g_adv = (g_adv - g_adv.mean(1, keepdims=True)) / (g_adv.std(1, ddof=1, keepdims=True) + 1e-8)
        arrays = [gather(rollout.actions), gather(rollout.log_probs), g_adv.astype(np.float32), gather(ret),
                  gather(values)]
        if device is None:
            self.columns: list = [gather(obs, False), *arrays]
        else:
            tensors = [torch.as_tensor(a).to(device) for a in arrays]
            self.columns = [MinibatchRows(obs, torch.from_numpy(idx.reshape(shape)).to(device)),
                            *(t.unbind(0) for t in tensors)]

    def __getitem__(self, k: int) -> Minibatch:
        return Minibatch(*(c[k] for c in self.columns))

    def epoch(self, e: int) -> Iterator[Minibatch]:
        for k in range(e * self.minibatches, (e + 1) * self.minibatches):
            yield self[k]


class MinibatchRows(Sequence):
    """Minibatch k of ``obs`` ([B, ...] tensors, or a dict of them) on demand: rows ``rows[k]`` ([E * M, mb]).
    Advanced indexing keeps a channels-last batch channels-last (``index_select`` would not)."""

    def __init__(self, obs: Tensor | dict, rows: Tensor):
        self.obs, self.rows = obs, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k):  # type: ignore[override]
        return obs_map(lambda x: x[self.rows[k]], self.obs)


class ColumnMinibatches:
    """Each epoch's minibatches of whole env columns [T, N / M] for a recurrent policy, so every sequence stays
    whole (as SB3-contrib's RecurrentPPO). An epoch's permutation is drawn when the epoch starts (an epoch that
    ``target_kl`` skips draws none); advantages are normalised per minibatch."""

    def __init__(self, obs: dict | Tensor, start: CoreState, mask: Tensor, rollout: Rollout, adv: np.ndarray,
                 ret: np.ndarray, values: np.ndarray, *, minibatches: int, norm_adv: bool, device: torch.device):
        """obs [T, N, ...], start (each [1, N, H]) and mask [T, N] on ``device``; adv, ret, values [T, N]."""
        self.obs, self.start, self.mask, self.device = obs, start, mask, device
        self.minibatches, self.norm_adv = minibatches, norm_adv
        self.actions = torch.from_numpy(rollout.actions).to(device)
        self.old = [torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(device)
                    for a in (rollout.log_probs, adv, ret, values)]

    def epoch(self, e: int) -> Iterator[SequenceMinibatch]:
        N = self.mask.shape[1]
        width = N // self.minibatches
        perm = torch.randperm(N)  # torch RNG: seeded and checkpointed
        for k in range(self.minibatches):
            cols = perm[k * width:(k + 1) * width].to(self.device)
            mask = self.mask[:, cols]
            B = mask.numel()
            old_logp, adv, ret, old_values = (x[:, cols].reshape(B) for x in self.old)
            if self.norm_adv and B > 1:  # one sample has no spread (SB3 skips it too)
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            actions = self.actions[:, cols]
            yield SequenceMinibatch(obs_map(lambda x, c=cols: x[:, c], self.obs),
                                    actions.reshape(B, *actions.shape[2:]), old_logp, adv, ret, old_values,
                                    start=tuple(x[:, cols] for x in self.start), mask=mask)
