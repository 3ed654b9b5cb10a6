"""Rollouts as sequences and their successors, shared by PPO, A2C and IMPALA.

A recurrent learner (``model.core=lstm|gru``) recomputes log-probs and values over the whole rollout [T, N]
from the core state stored at its start (``Rollout.core_state``), zeroing the state wherever an episode ended
before a step (R2D2's "stored state" strategy, Kapturowski et al. 2019; truncated BPTT over one rollout).

Every learner bootstraps from V(next_obs). Inside an episode next_obs[t] is obs[t+1], whose value the learner
has already computed, so only the successors at the rollout's end and at truncations need a forward of their
own (``successor_rows``): T*N + N (+ truncations) rows instead of 2*T*N. A recurrent policy values them with
the state the step ended in (before the collector's reset), so a cut episode bootstraps from its own memory.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rltrain.data.structs import ObsArray, Rollout, obs_leaves, obs_map
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


def successor_rows(rollout: Rollout) -> np.ndarray:
    """own [T, N] bool: the steps whose successor V(next_obs[t]) is not V(obs[t+1]) of the same rollout
    and needs a forward of its own (the last step, truncations; never after a termination, whose successor
    counts 0). Checked, not assumed: where next_obs[t] differs from obs[t+1] inside an episode (a rollout
    assembled some other way) every successor gets its own forward."""
    term = rollout.terminated
    cont = ~(term[:-1] | rollout.truncated[:-1])
    # row by row where the episode continues, every key of a Dict observation (no fancy-indexed copies of
    # the pixels: one elementwise compare)
    if not all(bool((n[:-1] == o[1:]).reshape(*cont.shape, -1).all(-1)[cont].all())
               for o, n in zip(obs_leaves(rollout.obs), obs_leaves(rollout.next_obs), strict=True)):
        return ~term
    own = rollout.truncated.copy()
    own[-1] = True
    return own & ~term


def join_successors(values: np.ndarray, own: np.ndarray, own_values: np.ndarray, terminated: np.ndarray
                    ) -> np.ndarray:
    """V(next_obs) [T, N] from V(obs) [T, N] and the values of the ``own`` successors (row-major order):
    V(obs[t+1]) inside an episode, 0 after a termination."""
    next_values = np.zeros(values.shape, np.float32)
    next_values[:-1] = values[1:]
    next_values[own] = own_values
    next_values[terminated] = 0.0
    return next_values


@torch.no_grad()
def successor_values(policy, rollout: Rollout, values: np.ndarray, states: list[CoreState] | None,
                     device: torch.device) -> np.ndarray:
    """V(next_obs) [T, N] given V(obs) [T, N]; ``states`` (recurrent policies): the state after each step,
    with which a successor of its own is valued; None for a feed-forward policy."""
    own = successor_rows(rollout)
    own_values = np.zeros(0, np.float32)
    if own.any():
        t_idx, n_idx = np.nonzero(own)  # row-major: the order of next_values[own]
        succ = obs_map(lambda x: torch.from_numpy(x[t_idx, n_idx]).to(device), rollout.next_obs)
        if states is None:
            own_values = policy.value(succ).cpu().numpy()
        else:
            ended_in = tuple(x[t_idx, n_idx][None].detach() for x in stack_states(states))
            own_values = policy.value(succ, ended_in).cpu().numpy()
    return join_successors(values, own, own_values, rollout.terminated)


def evaluate_sequences(policy, rollout: Rollout, actions: Tensor, device: torch.device
                       ) -> tuple[Tensor, Tensor, Tensor, np.ndarray, np.ndarray]:
    """One unroll with gradients for the single-step learners (A2C, IMPALA): actions [T * N, ...] ->
    (log pi(a|x) [T * N], entropy [T * N], V(x) [T * N], V(x) as numpy [T, N], V(next_obs) [T, N])."""
    T, N = rollout.shape
    obs, start, mask = sequence_inputs(rollout, device)
    out, value, states = policy.unroll(obs, start, mask)
    logp, entropy = policy.dist.log_prob_entropy(out.reshape(T * N, -1), actions)
    value = value.reshape(T * N)
    values = value.detach().cpu().numpy().reshape(T, N).astype(np.float32)
    return logp, entropy, value, values, successor_values(policy, rollout, values, states, device)


def evaluate_rollout(policy, rollout: Rollout, actions: Tensor, device: torch.device, *, recurrent: bool
                     ) -> tuple[Tensor, Tensor, Tensor, np.ndarray, np.ndarray]:
    """What A2C and IMPALA learn from, recurrent or not: actions [T * N, ...] -> (log pi(a|x) [T * N],
    entropy [T * N], V(x) [T * N] with grad, V(x) as numpy [T, N], V(next_obs) [T, N] without)."""
    if recurrent:  # one unroll over the rollout from its stored start state
        return evaluate_sequences(policy, rollout, actions, device)
    T, N = rollout.shape
    # [T, N, ...] -> [T * N, ...], per key for Dict observations
    flat = lambda x: torch.from_numpy(x.reshape(T * N, *x.shape[2:])).to(device)  # noqa: E731
    logp, entropy, value = policy.evaluate(obs_map(flat, rollout.obs), actions)
    values = value.detach().cpu().numpy().reshape(T, N)
    return logp, entropy, value, values, successor_values(policy, rollout, values, None, device)
