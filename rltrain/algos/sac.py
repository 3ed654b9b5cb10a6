"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications") for Box actions.

Reads like CleanRL's sac_continuous_action.py: twin Q networks with Polyak-averaged targets (clipped
double-Q, Fujimoto et al. 2018), a squashed Gaussian actor (tanh, with the change-of-variables log-det
correction), and automatic entropy tuning towards ``target_entropy = -dim(A)``. Updates are driven like
DQN's: ``gradient_steps`` updates every ``train_frequency`` env steps after ``learning_starts`` steps of
uniform-random warm-up (all counts in env steps over all envs and workers).

Any observation the model family encodes (``models.factory.build``: ``sac``, ``twin_q``): float vectors through
CleanRL's MLPs (actor and each critic their own); observations holding an image through ONE critic encoder that
both Q heads read from one forward per batch and the actor reads detached, plus its Polyak-averaged copy in the
target critic (SAC-AE, Yarats et al. 2019; DrQ, Kostrikov et al. 2020; models/sac_networks.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rltrain.algos.adam import make_adam
from rltrain.algos.base import Algorithm, AlgoSettings, Sync, positive, refuse_recurrent
from rltrain.data.replay import ReplayBuffer, UnwrittenSteps
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.heads import OrnsteinUhlenbeckNoise
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class SACSettings(AlgoSettings):
    """SAC's hyper-parameters (``algo=sac``): generic defaults, Stable-Baselines3's SAC (SB3), which follows
    Haarnoja et al. 2018 (paper), for every key unless said. Step counts are env steps over all envs and workers.
    Tuned settings live in presets (conf/experiment/sac_*.yaml)."""

    rollout_len: int = 1  # steps per env between two learn() calls. Source: SB3 (one step per env per call)
    buffer_size: int = 1_000_000  # replay capacity in observations (one per transition + one per episode end).
    #                               Source: SB3, paper
    batch_size: int = 256  # transitions per gradient step. Source: SB3, paper
    gamma: float = 0.99  # discount. Source: SB3, paper
    tau: float = 0.005  # Polyak rate of the target critics. Source: SB3, paper
    policy_lr: float = 3e-4  # the actor's Adam learning rate. Source: SB3, paper
    q_lr: float = 3e-4  # the critics' (and alpha's) Adam learning rate. Source: SB3, paper (one rate for all)
    learning_starts: int = 100  # env steps of uniform-random acting before the first update. Source: SB3
    train_frequency: int = 1  # env steps between two rounds of updates. Source: SB3 train_freq, paper
    gradient_steps: int = 1  # gradient steps per round. Source: SB3, paper
    policy_frequency: int = 1  # actor/alpha update every k critic steps (TD3-style delay; 1 = every).
    #                               Source: SB3, paper
    alpha: float = 1.0  # entropy coefficient (the initial value when autotune). Source: SB3 ent_coef="auto"
    #                               starts at 1.0
    autotune: bool = True  # learn alpha so that E[-log pi] tracks the target entropy. Source: SB3, Haarnoja
    #                               et al. 2018b
    target_entropy_scale: float = 1.0  # target entropy = -scale * dim(A). Source: SB3, paper (-dim(A))
    action_noise: float = 0.0  # sigma of Ornstein-Uhlenbeck noise on collected actions; 0: none. Source: SB3
    #                               action_noise=None
    noise_theta: float = 0.15  # the noise's mean reversion per unit time. Source: SB3
    #                               OrnsteinUhlenbeckActionNoise
    noise_dt: float = 1e-2  # the noise's time step. Source: SB3 OrnsteinUhlenbeckActionNoise
    checkpoint_buffer: bool = field(default=False, metadata={"internal": True})  # put the replay buffer into
    #                               state_dict: set by the CLI from checkpoint.replay_buffer

    def __post_init__(self) -> None:
        for key in ("rollout_len", "batch_size", "tau", "policy_lr", "q_lr", "alpha", "train_frequency",
                    "gradient_steps", "policy_frequency", "buffer_size"):
            positive(f"algo.{key}", getattr(self, key))
        positive("algo.learning_starts", self.learning_starts, allow_zero=True)
        if self.tau > 1:
            raise ConfigError(f"algo.tau={self.tau} must lie in (0, 1]")
        positive("algo.action_noise", self.action_noise, allow_zero=True)


class SAC(Algorithm):
    name = "sac"
    on_policy = False
    action_kinds = ("box",)
    settings_class = SACSettings
    mlp = MLP((256, 256), "relu")  # SB3, Haarnoja et al. 2018: 256x256 ReLU, actor and each critic

    def __init__(self, spec: EnvSpec, settings: SACSettings = SACSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoders for images / Dict, cli/build.py); None: its defaults."""
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        refuse_recurrent("algo=sac (off-policy)", (model or ModelSettings()).core)
        s = self.settings = settings
        self.rollout_len, self.learning_starts = s.rollout_len, s.learning_starts  # read by the loop
        self.batch_size, self.gamma, self.tau = s.batch_size, s.gamma, s.tau
        self.train_frequency, self.gradient_steps, self.policy_frequency = (s.train_frequency, s.gradient_steps,
                                                                            s.policy_frequency)
        self.checkpoint_buffer = s.checkpoint_buffer
        action_noise = s.action_noise
        noise_theta, noise_dt, q_lr, policy_lr, alpha = s.noise_theta, s.noise_dt, s.q_lr, s.policy_lr, s.alpha
        autotune, target_entropy_scale, buffer_size = s.autotune, s.target_entropy_scale, s.buffer_size

        model = (model or ModelSettings()).with_mlp(*self.mlp)
        if not model.hidden_sizes:
            raise ConfigError("model.hidden_sizes=[]: algo=sac needs at least one hidden layer")
        # the model family: actor + twin critic (models/sac_networks.py). On images one critic encoder, read by
        # both Q heads and, detached, by the actor (SAC-AE, DrQ); on float vectors CleanRL's separate MLPs.
        networks = build(spec, model, "sac").to(device)
        self.policy, self.critic = networks.actor, networks.critic
        if action_noise > 0:  # the collector adds it while acting (evaluation stays noise-free)
            self.policy.action_noise = OrnsteinUhlenbeckNoise(sigma=action_noise, theta=noise_theta, dt=noise_dt)
        # the target critic, its encoder included, is Polyak-averaged at one rate, algo.tau, as DrQ's (its
        # critic_tau 0.01 covers the encoder); SAC-AE moves the target encoder faster (0.05 vs 0.01)
        self.critic_target = build(spec, model, "twin_q").to(device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.q_params = list(self.critic.parameters())
        self.actor_params = list(self.policy.actor_parameters())
        self.q_optimizer = make_adam(self.q_params, q_lr, eps=1e-8)
        self.actor_optimizer = make_adam(self.actor_params, policy_lr, eps=1e-8)
        self.autotune = autotune
        self.target_entropy = -target_entropy_scale * float(np.prod(spec.action_shape))
        self.log_alpha = torch.tensor(math.log(alpha), device=device, requires_grad=autotune)
        self.alpha_optimizer = make_adam([self.log_alpha], q_lr, eps=1e-8)
        # observations keep their dtype in the buffer (EnvSpec.obs_dtype where the spec has one)
        self.buffer = ReplayBuffer(buffer_size, spec.obs_shape, spec.action_shape, spec.action_dtype, device=device,
                                   obs_dtype=getattr(spec, "obs_dtype", np.dtype(np.float32)),
                                   obs_space=spec.observation)
        self.env_steps = 0
        self.pending_updates = 0.0
        self.critic_steps = 0
        self.unwritten = UnwrittenSteps(self.buffer)
        self.weight_writes = 0  # optimiser steps (and target updates): the loop checks the weights when it moves

    def wants_random_actions(self, env_steps: int) -> bool:
        return env_steps < self.learning_starts

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        """Stores the rollout and runs the updates now due; with ``train_frequency`` > 1 most env steps have
        none: then this returns at once and the rollout waits to be written with the next ones."""
        steps = rollout.num_steps * self.sync.world_size
        self.env_steps += steps
        self.unwritten.add(rollout)
        if self.env_steps < self.learning_starts:
            return {}
        owed = steps / self.train_frequency
        if int(self.pending_updates + owed) >= 1 or self.buffer.ready < self.batch_size:
            self.unwritten.write()  # the buffer now holds every transition so far, as if written one by one
            return self._learn(steps)
        self.pending_updates += owed  # nothing due and the buffer holds a batch already: what _learn would do
        return {}

    def _learn(self, steps: int) -> Metrics:
        """The buffer holds every rollout so far: owe ``steps`` env steps' worth of updates and run them."""
        if self.env_steps < self.learning_starts or self.buffer.ready < self.batch_size:
            return {}
        self.pending_updates += steps / self.train_frequency
        rounds = int(self.pending_updates)
        self.pending_updates -= rounds
        stats = [self._update() for _ in range(rounds * self.gradient_steps)]
        if not stats:
            return {}
        s = self.sync.mean(torch.stack(stats).mean(0).cpu().numpy())
        return {"loss/q": float(s[0]), "loss/actor": float(s[1]), "loss/alpha": float(s[2]),
                "train/alpha": float(s[3]), "train/entropy": float(s[4]), "train/q_mean": float(s[5])}

    def _update(self) -> Tensor:
        """One SAC step; returns detached [q_loss, actor_loss, alpha_loss, alpha, entropy, mean Q]."""
        b = self.buffer.sample(self.batch_size)
        obs, next_obs = b.obs, b.next_obs  # stored dtype (a dict of them for Dict spaces): encoders convert
        alpha = self.log_alpha.detach().exp()

        # 1. Critics: soft Bellman target from the clipped double-Q of the target nets. With a shared encoder
        #    each batch goes through it once for both Q heads: next_obs through the online encoder (the actor's
        #    input) and the target's, obs through the online one.
        with torch.no_grad():
            next_a, next_logp = self.policy.sample_from(self.critic.features(next_obs))
            min_next_q = torch.min(*self.critic_target(next_obs, next_a))
            target = b.rewards + self.gamma * (1.0 - b.terminated) * (min_next_q - alpha * next_logp)
        features = self.critic.features(obs)
        q1, q2 = self.critic.heads(features, b.actions)
        q_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.q_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.sync.grads(self.q_params)
        self.q_optimizer.step()
        self.critic_steps += 1
        self.weight_writes += 1
        # the actor reads the features this critic step computed, detached, as DrQ-v2 (Yarats et al. 2021)
        # does: no actor gradient reaches the encoder, and no second encoder forward. With separate encoders
        # they are the observation itself (no graph).
        if isinstance(features, Tensor) and features.requires_grad:
            features = features.detach()

        # 2. Actor (and alpha), possibly delayed: maximise E[min Q(s, a~pi) - alpha log pi(a|s)].
        actor_loss = alpha_loss = torch.zeros((), device=self.device)
        entropy = torch.zeros((), device=self.device)
        if self.critic_steps % self.policy_frequency == 0:
            for _ in range(self.policy_frequency):  # compensate the delay (CleanRL)
                a, logp = self.policy.sample_from(features)
                min_q = torch.min(*self.critic.heads(features, a))
                actor_loss = (alpha * logp - min_q).mean()
                self.actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward()
                self.sync.grads(self.actor_params)
                self.actor_optimizer.step()
                entropy = -logp.detach().mean()
                if self.autotune:
                    # gradient pushes alpha up when the entropy is below target, down when above
                    alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
                    self.alpha_optimizer.zero_grad(set_to_none=True)
                    alpha_loss.backward()
                    self.sync.grads([self.log_alpha])
                    self.alpha_optimizer.step()
                    alpha = self.log_alpha.detach().exp()

        # 3. Polyak-average the target critic (its encoder too).
        with torch.no_grad():
            for p, p_t in zip(self.critic.parameters(), self.critic_target.parameters(), strict=True):
                p_t.lerp_(p, self.tau)
        return torch.stack([q_loss.detach(), actor_loss.detach(), alpha_loss.detach(), alpha, entropy,
                            q1.detach().mean()])

    def state_dict(self) -> dict:
        self.unwritten.write()
        state = {"policy": self.policy.state_dict()}
        # separate encoders: qf1, qf2, qf1_target, qf2_target (the names from before the layouts); shared: critic
        targets = self.critic_target.checkpoint_parts()
        for name, part in self.critic.checkpoint_parts().items():
            state[name] = part.state_dict()
        for name, part in targets.items():
            state[f"{name}_target"] = part.state_dict()
        state.update({
            "log_alpha": self.log_alpha.detach().clone(),
            "q_optimizer": self.q_optimizer.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "counters": {"env_steps": self.env_steps, "pending_updates": self.pending_updates,
                         "critic_steps": self.critic_steps},
        })
        if self.checkpoint_buffer:
            state["replay_buffer"] = self.buffer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])  # refuses, in one line, a policy of the other layout
        for name, part in self.critic.checkpoint_parts().items():
            part.load_state_dict(state[name])
        for name, part in self.critic_target.checkpoint_parts().items():
            part.load_state_dict(state[f"{name}_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for name in ("q_optimizer", "actor_optimizer", "alpha_optimizer"):
            getattr(self, name).load_state_dict(state[name])
        c = state["counters"]
        self.env_steps, self.pending_updates = int(c["env_steps"]), float(c["pending_updates"])
        self.critic_steps = int(c["critic_steps"])
        self.unwritten.clear()
        if "replay_buffer" in state:
            self.buffer.load_state_dict(state["replay_buffer"])
