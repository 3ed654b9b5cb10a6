"""Return estimators as pure functions on time-major numpy arrays [T, N].

Truncation vs termination: a terminated step has no future (bootstrap value 0); a truncated step is cut
by a time limit, so its target bootstraps from V(next_obs) (Pardo et al. 2018, "Time Limits in RL").
Either one ends the recursion: the next row belongs to a new episode.
"""

from __future__ import annotations

import numpy as np


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
        truncated: np.ndarray, *, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised Advantage Estimation (Schulman et al. 2016).

    rewards, values, next_values, terminated, truncated: [T, N]; ``next_values[t]`` is V(next_obs[t]),
    i.e. the value of the true successor (the final observation when the episode ended).
    Returns (advantages [T, N], returns [T, N]) in float32.
    """
    not_term = 1.0 - terminated.astype(np.float32)
    not_done = not_term * (1.0 - truncated.astype(np.float32))
    deltas = rewards + gamma * next_values * not_term - values
    adv = np.zeros_like(deltas, dtype=np.float32)
    last = np.zeros(deltas.shape[1], dtype=np.float32)
    decay = gamma * lam * not_done
    for t in range(deltas.shape[0] - 1, -1, -1):
        last = deltas[t] + decay[t] * last
        adv[t] = last
    return adv, (adv + values).astype(np.float32)


def nstep_returns(rewards: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
                  truncated: np.ndarray, *, gamma: float) -> np.ndarray:
    """Bootstrapped discounted returns over the rollout (A2C's n-step targets), [T, N].

    The return at t sums rewards to the end of the rollout or episode, then bootstraps from
    V(next_obs) at the last step of the rollout or at a truncation; a termination bootstraps 0.
    """
    not_term = 1.0 - terminated.astype(np.float32)
    done = terminated | truncated
    out = np.zeros_like(rewards, dtype=np.float32)
    ret = next_values[-1] * not_term[-1]
    for t in range(rewards.shape[0] - 1, -1, -1):
        # where the episode ended at t, the tail after t belongs to another episode: restart from V(next)
        if t < rewards.shape[0] - 1:
            ret = np.where(done[t], next_values[t] * not_term[t], ret)
        ret = rewards[t] + gamma * ret
        out[t] = ret
    return out


def vtrace(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray, *, gamma: float, rho_bar: float = 1.0,
           c_bar: float = 1.0, pg_rho_bar: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """V-trace targets (Espeholt et al. 2018, eq. 1) and policy-gradient advantages.

    log_rhos: [T, N] log(pi(a|x) / mu(a|x)) of the learner vs behaviour policy.
    Returns (vs [T, N], pg_advantages [T, N]) where
    vs_t = V(x_t) + delta_t + gamma c_t (vs_{t+1} - V(x_{t+1})) and
    pg_adv_t = min(pg_rho_bar, rho_t) (r_t + gamma vs_{t+1} - V(x_t)), with vs_{t+1} = V(next_obs_t)
    at episode ends (truncation) and 0 after a termination.
    """
    rhos = np.exp(log_rhos).astype(np.float32)
    clipped_rhos = np.minimum(rho_bar, rhos)
    cs = np.minimum(c_bar, rhos)
    not_term = 1.0 - terminated.astype(np.float32)
    not_done = not_term * (1.0 - truncated.astype(np.float32))
    deltas = clipped_rhos * (rewards + gamma * next_values * not_term - values)
    acc = np.zeros(rewards.shape[1], dtype=np.float32)
    vs_minus_v = np.zeros_like(rewards, dtype=np.float32)
    for t in range(rewards.shape[0] - 1, -1, -1):
        acc = deltas[t] + gamma * cs[t] * not_done[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values
    # vs_{t+1}: the next row's target inside an episode, V(next_obs) at a boundary or at the rollout end
    vs_next = next_values.astype(np.float32).copy()
    vs_next[:-1] = np.where(not_done[:-1] > 0, vs[1:], next_values[:-1])
    pg_adv = np.minimum(pg_rho_bar, rhos) * (rewards + gamma * vs_next * not_term - values)
    return vs.astype(np.float32), pg_adv.astype(np.float32)


def q_lambda_returns(rewards: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
                     truncated: np.ndarray, *, gamma: float, lam: float) -> np.ndarray:
    """Peng's Q(lambda) returns over a rollout (Peng & Williams 1996), PQN's targets (Gallici et al. 2024):
    ``G_t = r_t + gamma (1 - terminated_t) [lam G_{t+1} + (1 - lam) max_a Q(s_{t+1}, a)]``, with
    ``G_t = r_t + gamma (1 - terminated_t) max_a Q(s_{t+1}, a)`` at the rollout's last step and where the episode
    ended (a truncation bootstraps from its true final observation).

    rewards, next_values (max_a Q(next_obs_t, a)), terminated, truncated: [T, N] -> returns [T, N] float32.
    """
    not_term = 1.0 - terminated.astype(np.float32)
    done = terminated | truncated
    out = np.zeros_like(rewards, dtype=np.float32)
    ret = np.zeros(rewards.shape[1], dtype=np.float32)  # G_{t+1}
    for t in range(rewards.shape[0] - 1, -1, -1):
        blend = next_values[t] if t == rewards.shape[0] - 1 else \
            np.where(done[t], next_values[t], lam * ret + (1.0 - lam) * next_values[t])
        ret = rewards[t] + gamma * not_term[t] * blend
        out[t] = ret
    return out
