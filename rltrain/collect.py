"""RolloutCollector: the only code that steps environments during training.

Every trainer (sequential, parallel agents, distributed ranks, subprocess actors) collects through this
class; they differ in where it runs, never in what a transition is.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from rltrain.algos.base import Policy
from rltrain.envs import AsyncVecEnv, VecEnv
from rltrain.types import EnvSpec, Rollout


class RolloutCollector:
    """Steps ``venv`` with ``policy`` and returns time-major rollouts; keeps episode statistics.

    The hot loop stays lean on purpose: one inference-mode forward per step for all N envs, actions
    drawn without distribution objects, and numpy buffers written in place.
    """

    def __init__(self, venv: VecEnv | AsyncVecEnv, policy: Policy, spec: EnvSpec, *, device: torch.device,
                 episode_window: int = 20):
        self.venv = venv
        self.policy = policy
        self.spec = spec
        self.device = device
        self.num_envs = venv.num_envs
        self.obs = venv.reset()
        self.ep_return = np.zeros(self.num_envs, np.float64)
        self.ep_length = np.zeros(self.num_envs, np.int64)
        self.recent_returns: deque[float] = deque(maxlen=episode_window)
        self.recent_lengths: deque[int] = deque(maxlen=episode_window)
        self.episodes = 0
        if spec.action_kind == "box":
            self._low = np.asarray(spec.action_low, np.float32).reshape(spec.action_shape)
            self._high = np.asarray(spec.action_high, np.float32).reshape(spec.action_shape)

    def collect(self, rollout_len: int, *, policy_version: int = 0, random_actions: bool = False) -> Rollout:
        """Step every env ``rollout_len`` times. ``random_actions`` samples the action space uniformly
        (off-policy warm-up); its log-probs are then those of the uniform policy."""
        T, N, spec = rollout_len, self.num_envs, self.spec
        obs_buf = np.empty((T, N, *spec.obs_shape), np.float32)
        next_buf = np.empty_like(obs_buf)
        act_buf = np.empty((T, N, *spec.action_shape), spec.action_dtype)
        logp_buf = np.empty((T, N), np.float32)
        rew_buf = np.empty((T, N), np.float32)
        term_buf = np.empty((T, N), bool)
        trunc_buf = np.empty((T, N), bool)
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        obs, on_cpu, box = self.obs, self.device.type == "cpu", spec.action_kind == "box"
        with torch.inference_mode():
            for t in range(T):
                obs_buf[t] = obs
                if random_actions:
                    action, logp = self._random_actions()
                else:
                    obs_t = torch.from_numpy(obs) if on_cpu else torch.from_numpy(obs).to(self.device)
                    out = self.policy.act(obs_t)
                    action = out.action.numpy() if on_cpu else out.action.cpu().numpy()
                    logp = out.log_prob.numpy() if on_cpu else out.log_prob.cpu().numpy()
                act_buf[t] = action
                logp_buf[t] = logp
                env_action = np.clip(action, self._low, self._high) if box else action
                obs, rew, term, trunc, final = self.venv.step(env_action)
                rew_buf[t], term_buf[t], trunc_buf[t], next_buf[t] = rew, term, trunc, final
                self.ep_return += rew
                self.ep_length += 1
                done = term | trunc
                if done.any():
                    for i in np.flatnonzero(done):
                        ep_returns.append(float(self.ep_return[i]))
                        ep_lengths.append(int(self.ep_length[i]))
                    self.ep_return[done] = 0.0
                    self.ep_length[done] = 0
        self.obs = obs
        self.episodes += len(ep_returns)
        self.recent_returns.extend(ep_returns)
        self.recent_lengths.extend(ep_lengths)
        return Rollout(obs=obs_buf, actions=act_buf, log_probs=logp_buf, rewards=rew_buf, terminated=term_buf,
                       truncated=trunc_buf, next_obs=next_buf,
                       policy_version=np.full(T, policy_version, np.int64),
                       episode_returns=ep_returns, episode_lengths=ep_lengths)

    def _random_actions(self) -> tuple[np.ndarray, np.ndarray]:
        spec, n = self.spec, self.num_envs
        if spec.action_kind == "discrete":
            return np.random.randint(0, spec.n_actions, n), np.full(n, -np.log(spec.n_actions), np.float32)
        action = np.random.uniform(self._low, self._high, (n, *spec.action_shape)).astype(np.float32)
        logp = -np.log(self._high - self._low).sum()
        return action, np.full(n, logp, np.float32)

    # -- resume: collector state is part of the trainer checkpoint --------------------------------------
    def state_dict(self) -> dict:
        return {
            "obs": torch.from_numpy(self.obs.copy()),
            "ep_return": torch.from_numpy(self.ep_return.copy()),
            "ep_length": torch.from_numpy(self.ep_length.copy()),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "episodes": self.episodes,
        }

    def load_state_dict(self, state: dict, venv_blob: bytes | None) -> None:
        """Restore episode bookkeeping; with ``venv_blob`` (pickled envs) also the envs mid-episode."""
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        self.episodes = int(state["episodes"])
        if venv_blob is not None and state["obs"].shape[0] == self.num_envs:
            self.venv.set_state(venv_blob)
            self.obs = state["obs"].numpy().copy()
            self.ep_return = state["ep_return"].numpy().copy()
            self.ep_length = state["ep_length"].numpy().copy()
