"""Twin Delayed DDPG (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods").

Reads like CleanRL's td3_continuous_action.py. TD3 is DDPG (Lillicrap et al. 2016: a deterministic actor
trained through a learned Q, algos/ddpg.py) with three changes, each against overestimation:

1. **Clipped double-Q** (sec. 4.2): two critics, the TD target takes the smaller of the two target critics.
2. **Delayed policy updates** (sec. 5.2): the actor and every target network move once per ``policy_delay``
   critic steps, so the actor climbs a critic whose error has had time to shrink.
3. **Target policy smoothing** (sec. 5.3): the target action gets clipped Gaussian noise, so the target
   averages Q over a small neighbourhood of actions instead of exploiting a sharp peak.

Exploration is Gaussian noise on the actor's actions (sec. 6.1), which the collector adds while collecting
(``models.deterministic_actor.GaussianActionNoise``), never in evaluation. Replay, the ``learning_starts``
uniform-random warm-up and ``gradient_steps`` updates every ``train_frequency`` env steps are the off-policy
base's (algos/off_policy.py), as DQN's and SAC's; so is hindsight relabelling on goal tasks (``her``). Any
observation the model family encodes, in SAC's two layouts (models/deterministic_actor.py).
"""

from __future__ import annotations

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
from rltrain.models.deterministic_actor import GaussianActionNoise
from rltrain.models.factory import ModelSettings, build
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class TD3Settings(HindsightSettings):
    """TD3's hyper-parameters (``algo=td3``): generic defaults, Stable-Baselines3's TD3 (SB3), which follows
    Fujimoto et al. 2018, unless said. Step counts are env steps over all envs and workers. Tuned settings live in
    presets (conf/experiment/td3_*.yaml)."""

    rollout_len: int = 1  # steps per env between two learn() calls. Source: rltrain (SB3 collects 1 step)
    buffer_size: int = 1_000_000  # replay capacity in observations. Source: SB3, Fujimoto et al. 2018
    batch_size: int = 256  # transitions per gradient step. Source: SB3 (the paper: 100)
    gamma: float = 0.99  # discount. Source: SB3, Fujimoto et al. 2018
    tau: float = 0.005  # Polyak rate of every target network. Source: SB3, Fujimoto et al. 2018
    lr: float = 1e-3  # Adam learning rate of the actor and the critics. Source: SB3, Fujimoto et al. 2018
    learning_starts: int = 100  # env steps of uniform-random acting before the first update. Source: SB3
    train_frequency: int = 1  # env steps between two rounds of updates. Source: SB3, Fujimoto et al. 2018
    gradient_steps: int = 1  # gradient steps per round. Source: SB3, Fujimoto et al. 2018
    policy_delay: int = 2  # critic steps per actor (and target) step. Source: SB3, Fujimoto et al. 2018 sec. 5.2
    target_policy_noise: float = 0.2  # std of the target action's smoothing noise, in half action ranges.
    #                                   Source: SB3, Fujimoto et al. 2018 sec. 5.3
    target_noise_clip: float = 0.5  # the smoothing noise is clipped to +-this. Source: SB3, Fujimoto et al. 2018
    exploration_noise: float = 0.1  # std of the Gaussian noise on collected actions, in half action ranges
    #                                 (0: none). Source: Fujimoto et al. 2018 sec. 6.1, CleanRL (SB3: none set)
    checkpoint_buffer: bool = field(default=False, metadata={"internal": True})  # put the replay buffer into
    #                                  state_dict: set by the CLI from checkpoint.replay_buffer

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma, tau and the replay's sizes (HindsightSettings)
        for key in ("lr", "policy_delay"):
            positive(f"algo.{key}", getattr(self, key))
        for key in ("target_policy_noise", "target_noise_clip", "exploration_noise"):
            positive(f"algo.{key}", getattr(self, key), allow_zero=True)
        if self.target_policy_noise > 0 and self.target_noise_clip == 0:  # the noise clipped to +-0: none at all
            raise ConfigError(f"algo.target_noise_clip=0 clips the target smoothing noise (algo.target_policy_noise="
                              f"{self.target_policy_noise}) to nothing; set algo.target_noise_clip > 0 (TD3's 0.5), "
                              "or algo.target_policy_noise=0 to turn smoothing off")

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        unread = super().unread_keys(action_kind=action_kind)
        if self.target_policy_noise == 0:  # TD3.update draws (and clips) the smoothing noise only above 0
            unread["target_noise_clip"] = only_with("algo.target_policy_noise > 0", 0)
        return unread


class TD3(OffPolicy):
    """TD3's networks and its update; replay, warm-up and updates owed are ``OffPolicy``'s. DDPG (algos/ddpg.py)
    is this class with one critic (``n_critics``) and settings without a delay or target smoothing."""

    name = "td3"
    action_kinds = ("box",)
    settings_class = TD3Settings
    # SB3's TD3Policy on vectors (the paper's 400-300 ReLU), actor and each critic; CleanRL uses 256x256
    mlp = MLP((400, 300), "relu")
    mlp_after_image = True  # each critic's MLP reads the image features with the action (deterministic_actor.py)
    model_keys_unread = {"critic_keys": ACTOR_CRITIC_ONLY}
    stat_names = ("loss/q", "loss/actor", "train/q_mean")
    delayed_stats = ("loss/actor",)  # computed on the policy_delay-th critic steps only (OffPolicy.actor_steps_at)
    settings: TD3Settings
    n_critics = 2  # clipped double-Q

    def __init__(self, spec: EnvSpec, settings: TD3Settings | None = None, *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``settings``: None for the class's defaults; ``model``: the model group (encoders for images / Dict,
        cli/build.py), None for its defaults."""
        refuse_recurrent(f"algo={self.name} (off-policy)", (model or ModelSettings()).core)
        s = settings or self.settings_class()
        super().__init__(spec, s, num_envs=num_envs, device=device, sync=sync)
        self.gamma = s.gamma
        # TD3's additions to DDPG; DDPGSettings has none of these fields (no delay, no smoothing)
        self.actor_delay = getattr(s, "policy_delay", 1)
        self.smoothing = getattr(s, "target_policy_noise", 0.0)
        self.noise_clip = getattr(s, "target_noise_clip", 0.0)

        model = (model or ModelSettings()).with_mlp(*self.mlp)
        if not model.hidden_sizes:
            raise ConfigError(f"model.hidden_sizes=[]: algo={self.name} needs at least one hidden layer")
        # the model family: deterministic actor + n critics (models/deterministic_actor.py); on images one
        # critic encoder that the actor reads detached (DrQ-v2). The targets are a second build of the same:
        # its actor reads the target critic's encoder.
        online = build(spec, model, "deterministic", n_critics=self.n_critics).to(device)
        target = build(spec, model, "deterministic", n_critics=self.n_critics).to(device)
        target.load_state_dict(online.state_dict())
        target.requires_grad_(False)
        self.policy, self.critic = online.actor, online.critic
        self.actor_target, self.critic_target = target.actor, target.critic
        half_range = (np.asarray(spec.action_high, np.float32) - np.asarray(spec.action_low, np.float32)) / 2
        if s.exploration_noise > 0:  # the collector adds it while acting (evaluation stays noise-free)
            self.policy.action_noise = GaussianActionNoise(sigma=s.exploration_noise,
                                                           half_range=half_range.reshape(spec.action_shape))
        self.half_range = torch.as_tensor(half_range, device=device)
        self.low = torch.as_tensor(spec.action_low, dtype=torch.float32, device=device)
        self.high = torch.as_tensor(spec.action_high, dtype=torch.float32, device=device)
        # Polyak-averaged at one rate after every actor step (Fujimoto et al. 2018, algorithm 1)
        self.targets_every_delay = [TargetNetwork(self.critic, self.critic_target, tau=s.tau),
                                    TargetNetwork(self.policy.policy_parts(), self.actor_target.policy_parts(),
                                                  tau=s.tau)]
        self.q_params = list(self.critic.parameters())
        self.actor_params = list(self.policy.actor_parameters())
        self.q_optimizer = make_adam(self.q_params, s.lr, eps=1e-8)
        self.actor_optimizer = make_adam(self.actor_params, s.lr, eps=1e-8)

    @classmethod
    def actor_delay_key(cls) -> str | None:
        return "policy_delay"  # DDPG, which has none, says None

    def update(self, batch: Batch) -> Tensor:
        """One TD3 step; returns detached [q_loss, actor_loss (NaN: no actor step), mean Q1(s, a)]."""
        b = batch

        # 1. Critics: y = r + gamma * (1 - terminated) * min_i Q_target_i(s', clip(mu_target(s') + eps)),
        #    eps = clip(N(0, target_policy_noise), -c, c) in half action ranges (target policy smoothing).
        #    With a shared encoder, next_obs goes through the target encoder once for the target actor and
        #    the target critics.
        with torch.no_grad():
            next_features = self.critic_target.features(b.next_obs)
            next_a = self.actor_target.action_from(next_features)
            if self.smoothing > 0:
                noise = (torch.randn_like(next_a) * self.smoothing).clamp(-self.noise_clip, self.noise_clip)
                next_a = torch.max(torch.min(next_a + noise * self.half_range, self.high), self.low)
            next_qs = self.critic_target.heads(next_features, next_a)
            min_next_q = next_qs[0] if len(next_qs) == 1 else torch.min(*next_qs)
            target = b.rewards + self.gamma * (1.0 - b.terminated) * min_next_q
        features = self.critic.features(b.obs)
        qs = self.critic.heads(features, b.actions)
        q_loss = sum(F.mse_loss(q, target) for q in qs)
        self.q_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.sync.grads(self.q_params)
        self.q_optimizer.step()

        # 2. Actor, every policy_delay critic steps: maximise Q1(s, mu(s)) (deterministic policy gradient,
        #    Silver et al. 2014), then every target network moves by tau.
        actor_loss = torch.full((), torch.nan, device=self.device)  # not computed: left out of the means
        if self.actor_steps_at(self.gradient_steps_taken):
            if isinstance(features, Tensor) and features.requires_grad:
                features = features.detach()  # the encoder is the critic's to train (DrQ-v2)
            actor_loss = -self.critic.heads(features, self.policy.action_from(features), first_only=True)[0].mean()
            self.actor_optimizer.zero_grad(set_to_none=True)
            # gradients for the actor only: the critics' weight gradients of this loss would be thrown away
            actor_loss.backward(inputs=self.actor_params)
            self.sync.grads(self.actor_params)
            self.actor_optimizer.step()
            for target_network in self.targets_every_delay:
                target_network.update()
        return torch.stack([q_loss.detach(), actor_loss.detach(), qs[0].detach().mean()])

    def networks_state(self) -> dict:
        return {"policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
                "actor_target": self.actor_target.state_dict(), "critic_target": self.critic_target.state_dict(),
                "q_optimizer": self.q_optimizer.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict()}

    def load_networks_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.actor_target.load_state_dict(state["actor_target"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
