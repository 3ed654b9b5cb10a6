"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Algorithms and Applications") for Box actions.

Reads like CleanRL's sac_continuous_action.py: twin Q networks with Polyak-averaged targets (clipped
double-Q, Fujimoto et al. 2018), a squashed Gaussian actor (tanh, with the change-of-variables log-det
correction), and automatic entropy tuning towards ``target_entropy = -dim(A)``. The replay buffer and the
schedule are the off-policy base's (algos/off_policy.py), as DQN's: ``gradient_steps`` updates every
``train_frequency`` env steps after ``learning_starts`` steps of uniform-random warm-up (all counts in env steps
over all envs and workers).

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
from rltrain.algos.base import ACTOR_CRITIC_ONLY, Sync, positive, refuse_recurrent
from rltrain.algos.off_policy import HindsightSettings, OffPolicy, TargetNetwork
from rltrain.data.replay import Batch
from rltrain.data.structs import EnvSpec
from rltrain.errors import ConfigError, only_with
from rltrain.models.factory import ModelSettings, build
from rltrain.models.heads import OrnsteinUhlenbeckNoise
from rltrain.models.sac_networks import holds_separate_encoders
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class SACSettings(HindsightSettings):
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
        super().__post_init__()  # gamma, tau and the replay's sizes (HindsightSettings)
        for key in ("policy_lr", "q_lr", "alpha", "policy_frequency", "noise_dt"):
            positive(f"algo.{key}", getattr(self, key))
        positive("algo.action_noise", self.action_noise, allow_zero=True)
        positive("algo.noise_theta", self.noise_theta, allow_zero=True)  # 0: a random walk, reset each episode
        if not np.isfinite(self.target_entropy_scale):  # any finite target entropy is one alpha can track
            raise ConfigError(f"algo.target_entropy_scale={self.target_entropy_scale} must be a finite number")
        if self.noise_theta * self.noise_dt > 1:
            # each step pulls the noise theta * dt of the way back to 0: past 1 it overshoots 0 every step (an
            # alternating sign, not a smooth Ornstein-Uhlenbeck process), and past 2 it grows without bound
            raise ConfigError(f"algo.noise_theta={self.noise_theta} x algo.noise_dt={self.noise_dt} = "
                              f"{self.noise_theta * self.noise_dt:g} must be <= 1 (the share of the way back to 0 "
                              "the noise moves each step); lower either (SB3's: 0.15 and 0.01)")

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        """The Ornstein-Uhlenbeck noise's shape without the noise, the target entropy without tuning alpha."""
        unread = super().unread_keys(action_kind=action_kind)
        if self.action_noise == 0:  # SAC.__init__ builds the noise only for action_noise > 0
            unread |= dict.fromkeys(("noise_theta", "noise_dt"), only_with("algo.action_noise > 0", 0))
        if not self.autotune:  # the target entropy is the alpha loss's, which only autotune computes
            unread["target_entropy_scale"] = only_with("algo.autotune=true", False)
        return unread


class SAC(OffPolicy):
    """SAC's networks and its update; replay, warm-up and updates owed are ``OffPolicy``'s."""

    name = "sac"
    action_kinds = ("box",)
    settings_class = SACSettings
    mlp = MLP((256, 256), "relu")  # SB3, Haarnoja et al. 2018: 256x256 ReLU, actor and each critic
    mlp_after_image = True  # each critic's MLP reads the image features with the action (sac_networks.py)
    model_keys_unread = {"critic_keys": ACTOR_CRITIC_ONLY}
    # "loss/alpha" only with autotune (a fixed alpha has no loss: __init__ drops the name, update the value)
    stat_names = ("loss/q", "loss/actor", "loss/alpha", "train/alpha", "train/entropy", "train/q_mean")
    # computed on the policy_frequency-th critic steps only (OffPolicy.actor_steps_at); alpha is read every step
    delayed_stats = ("loss/actor", "loss/alpha", "train/entropy")
    settings: SACSettings

    def __init__(self, spec: EnvSpec, settings: SACSettings = SACSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoders for images / Dict, cli/build.py); None: its defaults."""
        refuse_recurrent("algo=sac (off-policy)", (model or ModelSettings()).core)
        super().__init__(spec, settings, num_envs=num_envs, device=device, sync=sync)
        s = settings
        self.gamma, self.actor_delay, self.autotune = s.gamma, s.policy_frequency, s.autotune
        if not s.autotune:
            self.stat_names = tuple(name for name in self.stat_names if name != "loss/alpha")

        model = (model or ModelSettings()).with_mlp(*self.mlp)
        if not model.hidden_sizes:
            raise ConfigError("model.hidden_sizes=[]: algo=sac needs at least one hidden layer")
        # the model family: actor + twin critic (models/sac_networks.py). On images one critic encoder, read by
        # both Q heads and, detached, by the actor (SAC-AE, DrQ); on float vectors CleanRL's separate MLPs.
        networks = build(spec, model, "sac").to(device)
        self.policy, self.critic = networks.actor, networks.critic
        if s.action_noise > 0:  # the collector adds it while acting (evaluation stays noise-free)
            self.policy.action_noise = OrnsteinUhlenbeckNoise(sigma=s.action_noise, theta=s.noise_theta,
                                                              dt=s.noise_dt)
        # the target critic, its encoder included, is Polyak-averaged at one rate, algo.tau, after every critic
        # step, as DrQ's (its critic_tau 0.01 covers the encoder); SAC-AE moves the target encoder faster
        self.critic_target = build(spec, model, "twin_q").to(device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.target = TargetNetwork(self.critic, self.critic_target, tau=s.tau)
        self.q_params = list(self.critic.parameters())
        self.actor_params = list(self.policy.actor_parameters())
        self.q_optimizer = make_adam(self.q_params, s.q_lr, eps=1e-8)
        self.actor_optimizer = make_adam(self.actor_params, s.policy_lr, eps=1e-8)
        self.target_entropy = -s.target_entropy_scale * float(np.prod(spec.action_shape))
        self.log_alpha = torch.tensor(math.log(s.alpha), device=device, requires_grad=s.autotune)
        self.alpha_optimizer = make_adam([self.log_alpha], s.q_lr, eps=1e-8)

    @classmethod
    def actor_delay_key(cls) -> str | None:
        return "policy_frequency"

    def update(self, batch: Batch) -> Tensor:
        """One SAC step; returns detached [q_loss, actor_loss, alpha_loss, alpha, entropy, mean Q] (alpha_loss
        only with autotune; the ``delayed_stats`` NaN where the actor does not step)."""
        b = batch
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
        # the actor reads the features this critic step computed, detached, as DrQ-v2 (Yarats et al. 2021)
        # does: no actor gradient reaches the encoder, and no second encoder forward. With separate encoders
        # they are the observation itself (no graph).
        if isinstance(features, Tensor) and features.requires_grad:
            features = features.detach()

        # 2. Actor (and alpha), possibly delayed: maximise E[min Q(s, a~pi) - alpha log pi(a|s)].
        if not self.actor_steps_at(self.gradient_steps_taken):  # not computed: left out of the means
            actor_loss = alpha_loss = entropy = torch.full((), torch.nan, device=self.device)
        else:
            for _ in range(self.actor_delay):  # compensate the delay (CleanRL)
                a, logp = self.policy.sample_from(features)
                min_q = self.critic.min_q(features, a)  # its gradient reaches the action only
                actor_loss = (alpha * logp - min_q).mean()
                self.actor_optimizer.zero_grad(set_to_none=True)
                # gradients for the actor only: the critics' weight gradients of this loss (two of the largest
                # matmuls of the update) would be computed and thrown away at the next critic step
                actor_loss.backward(inputs=self.actor_params)
                self.sync.grads(self.actor_params)
                self.actor_optimizer.step()
                mean_logp = logp.detach().mean()
                entropy = -mean_logp
                if self.autotune:
                    # loss -log_alpha * E[log pi + target]: its gradient pushes alpha up when the entropy is
                    # below target, down when above. The gradient of this one scalar is written directly,
                    # -E[log pi + target], rather than by a second autograd pass.
                    gap = mean_logp + self.target_entropy
                    alpha_loss = -self.log_alpha.detach() * gap
                    self.log_alpha.grad = -gap
                    self.sync.grads([self.log_alpha])
                    self.alpha_optimizer.step()
                    alpha = self.log_alpha.detach().exp()

        # 3. Polyak-average the target critic (its encoder too).
        self.target.update()
        if not self.autotune:  # a fixed alpha: no loss/alpha column (stat_names)
            return torch.stack([q_loss.detach(), actor_loss.detach(), alpha, entropy, q1.detach().mean()])
        return torch.stack([q_loss.detach(), actor_loss.detach(), alpha_loss, alpha, entropy, q1.detach().mean()])

    def networks_state(self) -> dict:
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
        })
        return state

    def load_networks_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])  # refuses, in one line, a policy of the other layout
        parts = self.critic.checkpoint_parts()
        theirs = holds_separate_encoders(state)
        if "qf1" in parts and theirs != holds_separate_encoders({"qf1": parts["qf1"].state_dict()}):
            raise ConfigError(f"the checkpoint's SAC critics {'each hold an' if theirs else 'hold no'} encoder of "
                              "their own (one per critic: model.shared=false, or a Dict / Discrete observation "
                              "before SAC read them flat); resume it with "
                              f"model.shared={'false' if theirs else 'auto'} resume_allow_changes=[model.shared]")
        for name, part in parts.items():
            part.load_state_dict(state[name])
        for name, part in self.critic_target.checkpoint_parts().items():
            part.load_state_dict(state[f"{name}_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for name in ("q_optimizer", "actor_optimizer", "alpha_optimizer"):
            getattr(self, name).load_state_dict(state[name])
