"""RolloutCollector: the only code that steps environments during training.

Every trainer (sequential, parallel agents, distributed ranks, subprocess actors) collects through this
class; they differ in where it runs, never in what a transition is.
"""

from __future__ import annotations

from collections import deque
from operator import itemgetter

import numpy as np
import torch

from rltrain.data.structs import (
    MASK_KEY,
    EnvSpec,
    ObsArray,
    Policy,
    Rollout,
    obs_buffer,
    obs_leaves,
    obs_map,
    obs_put,
)
from rltrain.envs.make import AsyncVecEnv, VecEnv
from rltrain.errors import ConfigError
from rltrain.models.cores import CoreState, reset_state
from rltrain.models.layers import NumpyActor


class RolloutCollector:
    """Steps ``venv`` with ``policy`` and returns time-major rollouts; keeps episode statistics.

    The hot loop stays lean on purpose: one forward per step for all N envs, actions drawn without
    distribution objects, numpy buffers written in place, episode statistics once per rollout. On CPU,
    a policy with ``numpy_actor()`` acts through a numpy copy of its actor (torch's per-op overhead is
    most of the cost of a tiny forward), drawing noise from ``self.rng``: a generator seeded from the
    torch RNG at construction, whose state is saved in ``state_dict`` so resumed runs draw the same.

    A recurrent policy (``policy.initial_state`` is not None) acts through the torch path with its core
    state, carried here per env across rollouts and zeroed for an env whose episode ended (terminated or
    truncated: the next observation is a new episode's first). Each rollout records the state at its start
    (``Rollout.core_state``) for the learner's recomputation; ``state_dict`` saves it for exact resume.
    """

    def __init__(self, venv: VecEnv | AsyncVecEnv, policy: Policy, spec: EnvSpec, *, device: torch.device,
                 episode_window: int = 100, record_values: bool = False):
        obs = spec.observation
        if obs.kind == "unsupported":
            raise ConfigError(f"env.id={spec.env_id}: {obs.name or obs.kind} observations cannot be stored in "
                              "rollouts (Box, Discrete, MultiBinary or a Dict of them); wrap the env to return one")
        self.venv = venv
        self.policy = policy
        # keep the V(obs) that acting computes anyway (ActOutput.value) in Rollout.values: only for the
        # learner's own policy object, whose weights are the learner's when it learns from the rollout
        self.record_values = record_values
        self.spec = spec
        self.device = device
        self.num_envs = venv.num_envs
        self.obs: ObsArray = venv.reset()
        self._template = obs_buffer(obs, (0,))  # the stored keys and dtypes, for state_dict
        self.ep_return = np.zeros(self.num_envs, np.float64)
        self.ep_length = np.zeros(self.num_envs, np.int64)
        self.recent_returns: deque[float] = deque(maxlen=episode_window)
        self.recent_lengths: deque[int] = deque(maxlen=episode_window)
        # goal tasks: info["is_success"] at the end of the recent episodes that report it
        self.recent_successes: deque[bool] = deque(maxlen=episode_window)
        self.episodes = 0
        self.rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))
        # exploration noise the policy asks for (SAC's algo.action_noise: OrnsteinUhlenbeckNoise), box actions only
        self.action_noise = policy.action_noise if spec.action_kind == "box" else None
        self.core_state: CoreState | None = policy.initial_state(self.num_envs)
        self._low = self._high = None
        if spec.action_kind == "box":
            self._low = np.asarray(spec.action_low, np.float32).reshape(spec.action_shape)
            self._high = np.asarray(spec.action_high, np.float32).reshape(spec.action_shape)
            # the uniform warm-up policy's log-density, once: a dimension with low == high holds one action
            # (heads.sum_log_scale)
            width = self._high - self._low
            self._uniform_logp = float(-np.log(width[width > 0]).sum())

    def collect(self, rollout_len: int, *, policy_version: int = 0, random_actions: bool = False) -> Rollout:
        """Step every env ``rollout_len`` times. ``random_actions`` samples the action space uniformly
        (off-policy warm-up); its log-probs are then those of the uniform policy."""
        T, N, spec = rollout_len, self.num_envs, self.spec
        # one time-major array per Dict key, each in its storage dtype (uint8 pixels stay uint8)
        if isinstance(self._template, np.ndarray):  # one array: skip obs_buffer's dtype lookups
            obs_buf = np.empty((T, N, *self._template.shape[1:]), self._template.dtype)
            next_buf = np.empty((T, N, *self._template.shape[1:]), self._template.dtype)
        else:
            obs_buf = obs_buffer(spec.observation, (T, N))
            next_buf = obs_buffer(spec.observation, (T, N))
        act_buf = np.empty((T, N, *spec.action_shape), spec.action_dtype)
        logp_buf = np.empty((T, N), np.float32)
        rew_buf = np.empty((T, N), np.float32)
        term_buf = np.empty((T, N), bool)
        trunc_buf = np.empty((T, N), bool)
        start_state = None if self.core_state is None else tuple(x.detach().cpu().clone() for x in self.core_state)
        fast = None if random_actions or self.device.type != "cpu" or start_state else self._numpy_actor()
        values = None
        if fast is not None:
            self._collect_numpy(fast, obs_buf, act_buf, logp_buf, rew_buf, term_buf, trunc_buf, next_buf)
        else:
            values = self._collect_torch(random_actions, obs_buf, act_buf, logp_buf, rew_buf, term_buf, trunc_buf,
                                         next_buf)
        self.venv.idle()  # the rollout's steps are done: their deadline timer stops (envs/vector.py)
        ep_returns, ep_lengths = self._episode_stats(rew_buf, term_buf | trunc_buf)
        real = self.venv.pop_real_episodes()
        if real is not None:  # env.wrappers: the game's score (unclipped, all lives), not the learner's rewards
            ep_returns, ep_lengths = [score for _, score, _ in real], [length for _, _, length in real]
        successes = self.venv.pop_successes()
        self.episodes += len(ep_returns)
        self.recent_returns.extend(ep_returns)
        self.recent_lengths.extend(ep_lengths)
        self.recent_successes.extend(successes)
        return Rollout(obs=obs_buf, actions=act_buf, log_probs=logp_buf, rewards=rew_buf, terminated=term_buf,
                       truncated=trunc_buf, next_obs=next_buf,
                       policy_version=np.full(T, policy_version, np.int64),
                       episode_returns=ep_returns, episode_lengths=ep_lengths, episode_successes=successes,
                       core_state=start_state,
                       values=values)

    def _numpy_actor(self) -> NumpyActor | None:
        return self.policy.numpy_actor()

    def _collect_numpy(self, actor: NumpyActor, obs_buf, act_buf, logp_buf, rew_buf, term_buf, trunc_buf,
                       next_buf) -> None:
        """The CPU fast path: act with a numpy copy of the actor. All noise for the rollout comes from the
        collector's seeded generator in one draw, and log-probs are computed in one batch at the end."""
        T, N = rew_buf.shape
        shape = (T, N, actor.out_dim)
        noise = self.rng.random(shape) if actor.discrete else self.rng.standard_normal(shape)
        noise = noise.astype(np.float32)
        perturb = actor.perturb(noise)
        out_buf = np.empty(shape, np.float32)
        box = not actor.discrete
        obs, venv = self.obs, self.venv
        for t in range(T):
            obs_buf[t] = obs
            out = actor.forward(obs)
            out_buf[t] = out
            action = actor.action(out, perturb[t])
            act_buf[t] = action
            obs, rew_buf[t], term_buf[t], trunc_buf[t], next_buf[t] = venv.step(
                np.clip(action, self._low, self._high) if box else action, copy=False)
        self.obs = obs.copy()  # the vector env's own array (copy=False: each step's rows are copied above)
        logp_buf[:] = actor.log_prob(out_buf, act_buf, noise)

    def _collect_torch(self, random_actions: bool, obs_buf, act_buf, logp_buf, rew_buf, term_buf, trunc_buf,
                       next_buf) -> np.ndarray | None:
        """Fills the buffers; returns V(obs) [T, N] when ``record_values`` and the policy gave them, else None."""
        T = rew_buf.shape[0]
        obs, on_cpu, box = self.obs, self.device.type == "cpu", self.spec.action_kind == "box"
        tree = isinstance(obs_buf, dict)
        values: np.ndarray | None = np.empty(rew_buf.shape, np.float32) \
            if self.record_values and not random_actions else None
        with torch.inference_mode():
            for t in range(T):
                if tree:  # Dict observations: act on the stored keys, already in their storage dtype
                    obs_put(obs_buf, t, obs)
                    obs = obs_map(itemgetter(t), obs_buf)
                else:
                    obs_buf[t] = obs
                if random_actions:
                    action, logp = self._random_actions(obs)
                else:
                    obs_t = (obs_map(torch.from_numpy, obs) if on_cpu
                             else obs_map(lambda x: torch.from_numpy(x).to(self.device), obs))
                    out = self.policy.act(obs_t) if self.core_state is None else \
                        self.policy.act(obs_t, self.core_state)
                    action = out.action.numpy() if on_cpu else out.action.cpu().numpy()
                    logp = out.log_prob.numpy() if on_cpu else out.log_prob.cpu().numpy()
                    if values is not None:
                        if out.value is None:
                            values = None  # this policy does not give them: the learner computes its own
                        else:
                            values[t] = out.value.numpy() if on_cpu else out.value.cpu().numpy()
                    if self.action_noise is not None:  # stored as taken (log-probs unused off-policy)
                        action = np.clip(action + self.action_noise.sample(action.shape, self.rng),
                                         self._low, self._high)
                act_buf[t] = action
                logp_buf[t] = logp
                env_action = np.clip(action, self._low, self._high) if box else action
                obs, rew_buf[t], term_buf[t], trunc_buf[t], nxt = self.venv.step(env_action)
                obs_put(next_buf, t, nxt)
                if self.action_noise is not None:
                    self.action_noise.reset(term_buf[t] | trunc_buf[t])
                if self.core_state is not None and not random_actions:
                    # a new episode starts from the zero state (after termination AND truncation)
                    self.core_state = reset_state(out.state, term_buf[t] | trunc_buf[t])
        self.obs = obs
        return values

    def _episode_stats(self, rewards: np.ndarray, done: np.ndarray) -> tuple[list[float], list[int]]:
        """Returns and lengths of the episodes that ended in this rollout, in (step, env) order; partial
        episodes carry over to the next rollout. Computed once per rollout, not per step."""
        T = rewards.shape[0]
        if T == 1 and not done.any():  # most single-step rollouts (off-policy learners): nothing ended
            self.ep_return += rewards[0]  # float64 += float32: the one-row cumsum below, without its cost
            self.ep_length += 1
            return [], []
        csum = np.cumsum(rewards, axis=0, dtype=np.float64)
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        start = np.full(self.num_envs, -1)  # last step (in this rollout) before the current episode
        for t, i in zip(*np.nonzero(done), strict=True):
            before = csum[start[i], i] if start[i] >= 0 else 0.0
            carry = self.ep_return[i] if start[i] < 0 else 0.0
            ep_returns.append(float(carry + csum[t, i] - before))
            ep_lengths.append(int((self.ep_length[i] if start[i] < 0 else 0) + t - start[i]))
            start[i] = t
        for i in range(self.num_envs):
            if start[i] < 0:
                self.ep_return[i] += csum[-1, i]
                self.ep_length[i] += T
            else:
                self.ep_return[i] = csum[-1, i] - csum[start[i], i]
                self.ep_length[i] = T - 1 - start[i]
        return ep_returns, ep_lengths

    def _random_actions(self, obs) -> tuple[np.ndarray, np.ndarray]:
        spec, n = self.spec, self.num_envs
        if spec.action_kind == "discrete" and spec.masked:  # uniform over each env's legal actions
            legal = obs[MASK_KEY].astype(bool)
            pick = (np.random.random(n) * legal.sum(1)).astype(np.int64)
            action = np.array([np.flatnonzero(row)[k] for row, k in zip(legal, pick, strict=True)], np.int64)
            return action, -np.log(legal.sum(1)).astype(np.float32)
        if spec.action_kind == "discrete":
            return np.random.randint(0, spec.n_actions, n), np.full(n, -np.log(spec.n_actions), np.float32)
        action = np.random.uniform(self._low, self._high, (n, *spec.action_shape)).astype(np.float32)
        return action, np.full(n, self._uniform_logp, np.float32)

    def env_state(self) -> bytes | None:
        """The envs mid-episode (pickled by the vector env), or None when they cannot be pickled."""
        return self.venv.get_state()

    def close(self) -> None:
        self.venv.close()

    # -- resume: collector state is part of the trainer checkpoint --------------------------------------
    def state_dict(self) -> dict:
        return {
            # the stored keys only (a Text key has no tensor form)
            "obs": obs_map(lambda _, x: torch.from_numpy(np.array(x)), self._template, self.obs),
            "ep_return": torch.from_numpy(self.ep_return.copy()),
            "ep_length": torch.from_numpy(self.ep_length.copy()),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "recent_successes": list(self.recent_successes),
            "episodes": self.episodes,
            "rng": self.rng.bit_generator.state,  # plain dict of ints: loads with weights_only=True
            # recurrent policies: the state the envs' last step ended in (a list of [1, N, H] tensors)
            "core_state": None if self.core_state is None else [x.detach().cpu().clone() for x in self.core_state],
            "action_noise": None if self.action_noise is None or self.action_noise.x is None
            else torch.from_numpy(self.action_noise.x.copy()),
        }

    def load_state_dict(self, state: dict, venv_blob: bytes | None) -> bool:
        """Restore episode bookkeeping; with ``venv_blob`` (pickled envs) also the envs mid-episode. Whether the
        envs continue where they were (else they stand reset, as built: ``reseed``)."""
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        self.recent_successes.extend(state.get("recent_successes", []))
        self.episodes = int(state["episodes"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        if self.action_noise is not None and state.get("action_noise") is not None:
            self.action_noise.x = state["action_noise"].numpy().copy()
        if venv_blob is not None and obs_leaves(state["obs"])[0].shape[0] == self.num_envs:
            self.venv.set_state(venv_blob)
            self.obs = obs_map(lambda x: x.numpy().copy(), state["obs"])
            self.ep_return = state["ep_return"].numpy().copy()
            self.ep_length = state["ep_length"].numpy().copy()
            if self.core_state is not None and state.get("core_state") is not None:
                self.core_state = tuple(x.to(self.device) for x in state["core_state"])
            return True
        return False

    def reseed(self, seeds: list[int]) -> None:
        """Reset the envs, not yet stepped since they were built, with other ``seeds`` (a resume whose envs did not
        continue: ``run.seeding.resumed_env_seeds``)."""
        self.venv.seeds = list(seeds)
        self.obs = self.venv.reset()
