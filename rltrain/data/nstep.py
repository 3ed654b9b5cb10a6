"""n-step transitions read from the replay buffer at sampling time (Sutton 1988; Hessel et al. 2018 take n = 3):
``nstep_batch``.

The buffer links every row to its successor in the same env stream (``ReplayBuffer.next_gid``), so an n-step
transition needs no pending state of its own: from a sampled row, follow the links for up to n steps, summing
``r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1}``, and bootstrap from the observation k steps later with
discount ``gamma^k``. The walk stops early (k < n) where the episode ends: a termination bootstraps nothing,
a truncation bootstraps from the stored final observation (Pardo et al. 2018), as one-step DQN does; and where
the next row's own successor has not arrived yet (the newest step of a stream), as SB3's n-step replay stops
at the buffer's write position. Checkpoints therefore need nothing beyond the buffer: a resumed run samples
the same n-step transitions.
"""

from __future__ import annotations

import numpy as np
import torch

from rltrain.data.replay import Batch, ReplayBuffer
from rltrain.data.structs import obs_map


def nstep_targets(buffer: ReplayBuffer, slots: np.ndarray, *, n: int,
                  gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """slots [B] (sampleable rows) -> (returns [B] float32: the discounted rewards of the k <= n steps taken,
    bootstrap gids [B]: the row k steps later, terminated [B] bool: the k-th step ended the episode by
    termination, discounts [B] float32: gamma^k)."""
    C = buffer.capacity
    ret = buffer.rewards[slots].astype(np.float64)
    term = buffer.terminated[slots].copy()
    boot = buffer.next_gid[slots].copy()
    discount = np.full(len(slots), float(gamma))
    going = ~term
    for _ in range(1, n):
        nxt = boot % C
        # one more step only from a row holding a transition (not an episode's final observation) whose own
        # successor has arrived
        going &= ~buffer.final[nxt] & (buffer.next_gid[nxt] >= 0)
        if not going.any():
            break
        rows = nxt[going]
        ret[going] += discount[going] * buffer.rewards[rows]
        term[going] = buffer.terminated[rows]
        boot[going] = buffer.next_gid[rows]
        discount[going] *= gamma
        going &= ~term
    return ret.astype(np.float32), boot, term, discount.astype(np.float32)


def nstep_batch(buffer: ReplayBuffer, slots: np.ndarray, *, n: int, gamma: float) -> Batch:
    """The n-step transitions starting at ``slots`` [B]: ``Batch.rewards`` the n-step returns, ``next_obs`` the
    bootstrap observations, ``discounts`` gamma^k (``nstep_targets``)."""
    ret, boot, term, discount = nstep_targets(buffer, slots, n=n, gamma=gamma)
    device = buffer.device
    to = torch.from_numpy if device.type == "cpu" else lambda x: torch.from_numpy(x).to(device)
    return Batch(obs=obs_map(to, buffer._rows_obs(buffer._gids(slots))), actions=to(buffer.actions[slots]),
                 rewards=to(ret), next_obs=obs_map(to, buffer._rows_obs(boot)),
                 terminated=to(term.astype(np.float32)), discounts=to(discount))
