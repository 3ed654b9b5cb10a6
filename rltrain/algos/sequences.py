"""Rollouts as sequences, for recurrent policies (``model.core=lstm|gru``), shared by PPO, A2C and IMPALA.

A recurrent learner recomputes log-probs and values over the whole rollout [T, N] from the core state
stored at its start (``Rollout.core_state``), zeroing the state wherever an episode ended before a step
(R2D2's "stored state" strategy, Kapturowski et al. 2019; truncated BPTT over one rollout). A truncated
step and the rollout's last step bootstrap from their successor valued with the state the step ended in
(before the collector's reset), so a cut episode bootstraps from its own memory.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rltrain.data.structs import ObsArray, Rollout, obs_map
from rltrain.models.cores import CoreState, stack_states


def sequence_inputs(rollout: Rollout, device: torch.device) -> tuple[ObsArray, CoreState, Tensor]:
    """(observations [T, N, ...] as tensors, the start state (each [1, N, H]), mask [T, N]: 0 where an
    episode ended before step t; step 0 starts from the stored state, already zeroed after an episode's end)."""
    T, N = rollout.shape
    obs = obs_map(lambda x: torch.from_numpy(x).to(device), rollout.obs)
    done = rollout.terminated | rollout.truncated
    mask = np.ones((T, N), np.float32)
    mask[1:] = ~done[:-1]
    if rollout.core_state is None:
        raise ValueError("a recurrent learner needs Rollout.core_state (the state at the rollout's start)")
    start = tuple(x.to(device) for x in rollout.core_state)
    return obs, start, torch.from_numpy(mask).to(device)


@torch.no_grad()
def successor_values(policy, rollout: Rollout, values: np.ndarray, states: list[CoreState],
                     device: torch.device) -> np.ndarray:
    """V(next_obs) [T, N] given V(obs) [T, N] and the state after each step: V(obs[t+1]) inside an episode,
    the successor evaluated with the state step t ended in at truncations and at the rollout's end, 0 after
    a termination."""
    T, N = rollout.shape
    term = rollout.terminated
    own = rollout.truncated.copy()
    own[-1] = True
    own &= ~term
    next_values = np.zeros((T, N), np.float32)
    next_values[:-1] = values[1:]
    if own.any():
        t_idx, n_idx = np.nonzero(own)  # row-major: the order of next_values[own]
        ended_in = tuple(x[t_idx, n_idx][None].detach() for x in stack_states(states))
        succ = obs_map(lambda x: torch.from_numpy(x[t_idx, n_idx]).to(device), rollout.next_obs)
        next_values[own] = policy.value(succ, ended_in).cpu().numpy()
    next_values[term] = 0.0
    return next_values


def evaluate_sequences(policy, rollout: Rollout, actions: Tensor, device: torch.device
                       ) -> tuple[Tensor, Tensor, Tensor, np.ndarray, np.ndarray]:
    """One unroll with gradients for the single-step learners (A2C, IMPALA): actions [T * N, ...] ->
    (log pi(a|x) [T * N], entropy [T * N], V(x) [T * N], V(x) as numpy [T, N], V(next_obs) [T, N])."""
    T, N = rollout.shape
    obs, start, mask = sequence_inputs(rollout, device)
    out, value, states = policy.unroll(obs, start, mask)
    logp, entropy = policy.actor_head.log_prob_entropy(out.reshape(T * N, -1), actions)
    value = value.reshape(T * N)
    values = value.detach().cpu().numpy().reshape(T, N).astype(np.float32)
    return logp, entropy, value, values, successor_values(policy, rollout, values, states, device)
