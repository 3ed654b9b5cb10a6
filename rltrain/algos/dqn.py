"""Deep Q-Network (Mnih et al. 2015) with an optional Double-DQN target (van Hasselt et al. 2016).

Reads like CleanRL's dqn.py: epsilon-greedy acting with a linear schedule, a preallocated replay buffer,
a target network (hard copy every ``target_network_frequency`` env steps, or Polyak with ``tau < 1``),
``learning_starts`` uniform-random warm-up, ``gradient_steps`` updates every ``train_frequency`` env
steps. Every step count here is in env steps over all envs (and all distributed workers), so a setting
means the same whatever ``env.num_envs`` is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rltrain.algos.adam import clip_grad_norm, make_adam
from rltrain.algos.base import Algorithm, AlgoSettings, Sync, positive, refuse_recurrent
from rltrain.data.replay import ReplayBuffer, UnwrittenSteps
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class DQNSettings(AlgoSettings):
    """DQN's hyper-parameters (``algo=dqn``): generic defaults, Stable-Baselines3's DQN (SB3) unless said. Step
    counts are env steps over all envs and workers. Tuned settings live in presets (conf/experiment/dqn_*.yaml)."""

    rollout_len: int = 1  # steps per env between two learn() calls. Source: SB3 (one step per env per call)
    lr: float = 1e-4  # Adam learning rate. Source: SB3
    buffer_size: int = 1_000_000  # replay capacity in observations (one per transition + one per episode end).
    #                               Source: SB3
    batch_size: int = 32  # transitions per gradient step. Source: SB3, Mnih et al. 2015
    gamma: float = 0.99  # discount. Source: SB3
    tau: float = 1.0  # target update rate: 1.0 = hard copy, < 1 = Polyak averaging. Source: SB3
    target_network_frequency: int = 10_000  # env steps between target updates. Source: SB3
    #                               target_update_interval (Mnih et al. 2015: 10k updates)
    start_e: float = 1.0  # epsilon at the start ... Source: SB3 exploration_initial_eps
    end_e: float = 0.05  # ... and after exploration_fraction of the budget. Source: SB3 exploration_final_eps
    exploration_fraction: float = 0.1  # share of total_env_steps over which epsilon falls. Source: SB3
    learning_starts: int = 100  # env steps of uniform-random acting before the first update. Source: SB3 (v2)
    train_frequency: int = 4  # env steps between two rounds of updates. Source: SB3 train_freq, Mnih et al. 2015
    gradient_steps: int = 1  # gradient steps per round. Source: SB3
    double_dqn: bool = False  # select the next action with the online net, value it with the target (van
    #                               Hasselt et al. 2016). Source: SB3 (vanilla DQN targets)
    max_grad_norm: float | None = 10.0  # clip the global gradient norm; null: no clipping. Source: SB3
    loss: str = "huber"  # TD loss: huber (smooth L1, Mnih et al. 2015's error clipping) | mse (CleanRL).
    #                               Source: SB3
    frame_stack: int | None = None  # K: observations are K-frame stacks, stored once per frame; null: the
    #                               env's (read from its FrameStackObservation); 0: off. Source: rltrain
    checkpoint_buffer: bool = field(default=False, metadata={"internal": True})  # put the replay buffer into
    #                               state_dict: set by the CLI from checkpoint.replay_buffer

    def __post_init__(self) -> None:
        for key in ("rollout_len", "lr", "batch_size", "tau", "target_network_frequency", "train_frequency",
                    "gradient_steps", "exploration_fraction", "buffer_size"):
            positive(f"algo.{key}", getattr(self, key))
        positive("algo.learning_starts", self.learning_starts, allow_zero=True)
        if not 0 <= self.end_e <= 1 or not 0 <= self.start_e <= 1 or self.tau > 1:
            raise ConfigError(f"algo.start_e={self.start_e}, algo.end_e={self.end_e} must lie in [0, 1] and "
                              f"algo.tau={self.tau} in (0, 1]")
        if self.frame_stack is not None and self.frame_stack < 0:
            raise ConfigError(f"algo.frame_stack={self.frame_stack}: K >= 2, 0 (whole stacks stored) or null "
                              "(inferred)")
        if self.loss not in ("mse", "huber"):
            raise ConfigError(f"algo.loss={self.loss!r}: choose mse or huber")


class DQN(Algorithm):
    name = "dqn"
    on_policy = False
    action_kinds = ("discrete",)
    settings_class = DQNSettings
    mlp = MLP((64, 64), "relu")  # SB3's DQN MlpPolicy (its QNetwork: net_arch [64, 64], ReLU)

    def __init__(self, spec: EnvSpec, settings: DQNSettings = DQNSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoder by observation space, cli/build.py); None: its defaults."""
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        model = model or ModelSettings()
        refuse_recurrent("algo=dqn (off-policy)", model.core)
        s = self.settings = settings
        self.rollout_len = s.rollout_len
        self.learning_starts = s.learning_starts  # read by the loop (uniform-random warm-up)
        self.frame_stack = getattr(spec, "frame_stack", None) if s.frame_stack is None else (s.frame_stack or None)

        # Q(s, .) from the model family: encoder by observation space + one output per action
        self.policy = build(spec, model.with_mlp(*self.mlp), "q").to(device)
        self.target = copy.deepcopy(self.policy).requires_grad_(False)
        self.params = list(self.policy.parameters())
        self.optimizer = make_adam(self.params, s.lr, eps=1e-8)
        # observations keep their dtype in the buffer (EnvSpec.obs_dtype where the spec has one; float32 is
        # what the collector writes otherwise); frame stacks are stored one frame per step
        self.buffer = ReplayBuffer(s.buffer_size, spec.obs_shape, spec.action_shape, spec.action_dtype,
                                   device=device, obs_dtype=getattr(spec, "obs_dtype", np.dtype(np.float32)),
                                   frame_stack=self.frame_stack, obs_space=spec.observation)
        # counters in env steps over all workers; checkpointed so resume keeps the schedules
        self.env_steps = 0
        self.pending_updates = 0.0  # rounds of updates owed (train_frequency may not divide the batch)
        self.last_target_sync = 0
        self.unwritten = UnwrittenSteps(self.buffer)
        self.weight_writes = 0  # optimiser steps (and target updates): the loop checks the weights when it moves

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        """Stores the rollout, advances the schedules and runs the updates now due (none on most env steps:
        then this returns at once, and the rollout waits to be written with the next ones)."""
        s = self.settings
        steps = rollout.num_steps * self.sync.world_size
        self.env_steps += steps
        # linear epsilon schedule over the first exploration_fraction of the budget (CleanRL)
        frac = min(progress / s.exploration_fraction, 1.0)
        self.policy.epsilon.fill_(s.start_e + frac * (s.end_e - s.start_e))
        metrics: Metrics = {"train/epsilon": float(self.policy.epsilon)}
        self.unwritten.add(rollout)
        if self.env_steps < self.learning_starts:
            return metrics
        owed = steps / s.train_frequency
        due = int(self.pending_updates + owed) >= 1 or \
            self.env_steps - self.last_target_sync >= s.target_network_frequency
        if due or self.buffer.ready < s.batch_size:
            self.unwritten.write()  # the buffer now holds every transition so far, as if written one by one
            return {**metrics, **self._learn(steps)}
        # nothing due and the buffer holds a batch already (more once the unwritten steps are in): what
        # _learn would have done
        self.pending_updates += owed
        return metrics

    def wants_random_actions(self, env_steps: int) -> bool:
        return env_steps < self.learning_starts

    def _learn(self, steps: int) -> Metrics:
        """The buffer holds every rollout so far: owe ``steps`` env steps' worth of updates and run them."""
        s = self.settings
        metrics: Metrics = {}
        if self.env_steps < self.learning_starts or self.buffer.ready < s.batch_size:
            return metrics
        self.pending_updates += steps / s.train_frequency
        rounds = int(self.pending_updates)
        self.pending_updates -= rounds
        stats: list[Tensor] = []
        for _ in range(rounds * s.gradient_steps):
            stats.append(self._update())

        # target network: hard copy (tau = 1) or Polyak average, every target_network_frequency env steps
        if self.env_steps - self.last_target_sync >= s.target_network_frequency:
            self.last_target_sync = self.env_steps
            self.weight_writes += 1
            with torch.no_grad():
                for p_t, p in zip(self.target.parameters(), self.policy.parameters(), strict=True):
                    p_t.copy_(p) if s.tau == 1.0 else p_t.lerp_(p, s.tau)
        if stats:
            m = self.sync.mean(torch.stack(stats).mean(0).cpu().numpy())
            metrics.update({"loss/q": float(m[0]), "train/q_mean": float(m[1]), "train/updates_per_learn":
                            float(len(stats))})
        return metrics

    def _update(self) -> Tensor:
        """One TD step on a uniform minibatch; returns detached [td_loss, mean Q(s, a)]."""
        s = self.settings
        b = self.buffer.sample(s.batch_size)
        # the buffer hands observations out in their stored dtype (a dict of them for Dict spaces); the
        # Q-network converts them (the MLP casts to float, an encoder also scales uint8 pixels)
        obs, next_obs = b.obs, b.next_obs
        with torch.no_grad():
            next_q_target = self.target(next_obs)
            if s.double_dqn:
                # Double DQN: the online net picks a', the target net values it (reduces overestimation)
                next_a = self.policy(next_obs).argmax(-1, keepdim=True)
                next_q = next_q_target.gather(-1, next_a).squeeze(-1)
            else:
                next_q = next_q_target.max(-1).values
            td_target = b.rewards + s.gamma * next_q * (1.0 - b.terminated)
        q = self.policy(obs).gather(-1, b.actions.long().unsqueeze(-1)).squeeze(-1)
        loss = F.mse_loss(q, td_target) if s.loss == "mse" else F.smooth_l1_loss(q, td_target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        if s.max_grad_norm is not None:
            clip_grad_norm(self.params, s.max_grad_norm)
        self.optimizer.step()
        self.weight_writes += 1
        return torch.stack([loss.detach(), q.detach().mean()])

    def state_dict(self) -> dict:
        self.unwritten.write()
        state = {"policy": self.policy.state_dict(), "target": self.target.state_dict(),
                 "optimizer": self.optimizer.state_dict(),
                 "counters": {"env_steps": self.env_steps, "pending_updates": self.pending_updates,
                              "last_target_sync": self.last_target_sync}}
        if self.settings.checkpoint_buffer:
            state["replay_buffer"] = self.buffer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        c = state["counters"]
        self.env_steps, self.pending_updates = int(c["env_steps"]), float(c["pending_updates"])
        self.last_target_sync = int(c["last_target_sync"])
        self.unwritten.clear()
        if "replay_buffer" in state:
            self.buffer.load_state_dict(state["replay_buffer"])
