"""Deep Deterministic Policy Gradient (Lillicrap et al. 2016, "Continuous control with deep reinforcement
learning"), in the form Stable-Baselines3 and CleanRL's ddpg_continuous_action.py train it.

A deterministic actor mu(s) climbs one learned critic (the deterministic policy gradient, Silver et al. 2014):

    y = r + gamma * (1 - terminated) * Q_target(s', mu_target(s'))
    L_Q = mean((Q(s, a) - y)^2),   L_mu = -mean(Q(s, mu(s)))

with Polyak-averaged targets of both networks after every step, and Gaussian exploration noise on the actions
collected (the paper used Ornstein-Uhlenbeck noise and batch normalisation; SB3 and CleanRL use N(0, 0.1),
which Fujimoto et al. 2018 found as good, and no normalisation). That is TD3 (algos/td3.py) without its three
changes: one critic instead of the clipped pair, the actor updated at every critic step, no target policy
smoothing. So this file holds DDPG's settings and the one class attribute that differs; the update is TD3's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rltrain.algos.base import positive
from rltrain.algos.off_policy import HindsightSettings
from rltrain.algos.td3 import TD3
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class DDPGSettings(HindsightSettings):
    """DDPG's hyper-parameters (``algo=ddpg``): generic defaults, Stable-Baselines3's DDPG (SB3) unless said.
    Step counts are env steps over all envs and workers. Tuned settings live in presets (conf/experiment/ddpg_*)."""

    rollout_len: int = 1  # steps per env between two learn() calls. Source: rltrain (SB3 collects 1 step)
    buffer_size: int = 1_000_000  # replay capacity in observations. Source: SB3, Lillicrap et al. 2016
    batch_size: int = 256  # transitions per gradient step. Source: SB3 (the paper: 64)
    gamma: float = 0.99  # discount. Source: SB3, Lillicrap et al. 2016
    tau: float = 0.005  # Polyak rate of the target actor and critic. Source: SB3 (the paper: 0.001)
    lr: float = 1e-3  # Adam learning rate of the actor and the critic. Source: SB3 (the paper: 1e-4 / 1e-3)
    learning_starts: int = 100  # env steps of uniform-random acting before the first update. Source: SB3
    train_frequency: int = 1  # env steps between two rounds of updates. Source: SB3, Lillicrap et al. 2016
    gradient_steps: int = 1  # gradient steps per round. Source: SB3, Lillicrap et al. 2016
    exploration_noise: float = 0.1  # std of the Gaussian noise on collected actions, in half action ranges
    #                                 (0: none). Source: CleanRL (SB3: none set; the paper: OU noise 0.2)
    checkpoint_buffer: bool = field(default=False, metadata={"internal": True})  # put the replay buffer into
    #                                  state_dict: set by the CLI from checkpoint.replay_buffer

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma, tau and the replay's sizes (HindsightSettings)
        positive("algo.lr", self.lr)
        positive("algo.exploration_noise", self.exploration_noise, allow_zero=True)


class DDPG(TD3):
    """TD3's update with one critic; ``DDPGSettings`` has no policy delay or target smoothing, so the update runs
    the actor at every critic step on the unsmoothed target action."""

    name = "ddpg"
    settings_class = DDPGSettings
    settings: DDPGSettings  # type: ignore[assignment]
    n_critics = 1
    mlp = MLP((400, 300), "relu")  # SB3's DDPG (its TD3Policy), Lillicrap et al. 2016's 400-300

    @classmethod
    def actor_delay_key(cls) -> str | None:
        return None  # no policy delay: the actor steps with every critic step
