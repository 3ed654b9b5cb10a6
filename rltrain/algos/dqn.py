"""Deep Q-Network (Mnih et al. 2015) with an optional Double-DQN target (van Hasselt et al. 2016).

Reads like CleanRL's dqn.py: epsilon-greedy acting with a linear schedule and one TD step per update. The
replay buffer, the ``learning_starts`` uniform-random warm-up, ``gradient_steps`` updates every
``train_frequency`` env steps and the target network (hard copy every ``target_network_frequency`` env steps,
or Polyak with ``tau < 1``) are the off-policy base's (algos/off_policy.py). Every step count here is in env
steps over all envs (and all distributed workers), so a setting means the same whatever ``env.num_envs`` is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rltrain.algos.adam import clip_grad_norm, make_adam
from rltrain.algos.base import Sync, positive, refuse_recurrent
from rltrain.algos.off_policy import HindsightSettings, OffPolicy, TargetNetwork
from rltrain.algos.td_numpy import NumpyTDStep
from rltrain.data.replay import Batch
from rltrain.data.structs import EnvSpec, Metrics
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class DQNSettings(HindsightSettings):
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
    numpy_update: bool = True  # on CPU, a plain MLP over float vectors: the TD step in numpy (algos/td_numpy.py;
    #                               the same loss and checkpoints); false: autograd (what CUDA and encoders run).
    #                               Source: rltrain (an implementation choice; the results are autograd's)
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


class DQN(OffPolicy):
    """DQN's networks and TD step; replay, warm-up, updates owed and the target schedule are ``OffPolicy``'s."""

    name = "dqn"
    action_kinds = ("discrete",)
    settings_class = DQNSettings
    mlp = MLP((64, 64), "relu")  # SB3's DQN MlpPolicy (its QNetwork: net_arch [64, 64], ReLU)
    stat_names = ("loss/q", "train/q_mean")
    settings: DQNSettings

    def __init__(self, spec: EnvSpec, settings: DQNSettings = DQNSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoder by observation space, cli/build.py); None: its defaults."""
        model = model or ModelSettings()
        refuse_recurrent("algo=dqn (off-policy)", model.core)
        s = settings
        # the env's stack depth (EnvSpec.frame_stack, from its FrameStackObservation) unless the user sets one
        frame_stack = getattr(spec, "frame_stack", None) if s.frame_stack is None else (s.frame_stack or None)
        super().__init__(spec, s, num_envs=num_envs, device=device, sync=sync, frame_stack=frame_stack)

        # Q(s, .) from the model family: encoder by observation space + one output per action
        self.policy = build(spec, model.with_mlp(*self.mlp), "q").to(device)
        self.target = copy.deepcopy(self.policy).requires_grad_(False)
        self.params = list(self.policy.parameters())
        # the TD step: in numpy for a plain MLP on CPU (its parameters re-homed into one flat buffer; Adam in
        # torch's checkpoint format), else autograd
        self.numpy_step = NumpyTDStep(self.policy.mlp_layers, self.target.mlp_layers,
                                      activation=self.policy.mlp_activation, lr=s.lr, gamma=s.gamma, loss=s.loss,
                                      double_dqn=s.double_dqn, max_grad_norm=s.max_grad_norm, sync=self.sync) \
            if s.numpy_update and device.type == "cpu" and self.policy.mlp_layers else None
        self.optimizer = self.numpy_step.optimizer if self.numpy_step else make_adam(self.params, s.lr, eps=1e-8)
        self.epsilon_set: float | None = None  # what explore() last wrote into the policy's epsilon buffer
        # hard copy (tau = 1) or Polyak average every target_network_frequency env steps
        self.sync_targets_every(s.target_network_frequency, TargetNetwork(self.policy, self.target, tau=s.tau))

    def explore(self, progress: float) -> Metrics:
        """Epsilon decays linearly over the first ``exploration_fraction`` of the budget (CleanRL); it is a
        buffer of the policy, so actors receive it with the weights."""
        s = self.settings
        frac = min(progress / s.exploration_fraction, 1.0)
        epsilon = float(np.float32(s.start_e + frac * (s.end_e - s.start_e)))  # as the float32 buffer holds it
        if epsilon != self.epsilon_set:
            self.policy.epsilon.fill_(epsilon)
            self.epsilon_set = epsilon
        return {"train/epsilon": epsilon}

    def explore_settled(self, progress: float) -> bool:
        return progress / self.settings.exploration_fraction >= 1.0  # explore()'s frac is 1 from here on

    def update(self, batch: Batch) -> Tensor:
        """One TD step on a uniform minibatch; returns detached [td_loss, mean Q(s, a)]."""
        if self.numpy_step is not None:
            return self.numpy_step.step(batch)
        s, b = self.settings, batch
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
        return torch.stack([loss.detach(), q.detach().mean()])

    def networks_state(self) -> dict:
        return {"policy": self.policy.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_networks_state(self, state: dict) -> None:
        self.epsilon_set = None  # the loaded buffer holds the checkpoint's epsilon
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
