"""Deep Q-Network (Mnih et al. 2015) with an optional Double-DQN target (van Hasselt et al. 2016), and the
Rainbow family's options (Hessel et al. 2018), each one setting: n-step returns (``n_step``), proportional
prioritised replay (``prioritized``, Schaul et al. 2016), dueling streams (``dueling``, Wang et al. 2016),
distributional Q-learning (``distributional``: C51, Bellemare et al. 2017; QR-DQN, Dabney et al. 2018) and noisy
nets (``noisy``, Fortunato et al. 2018); ``algo=rainbow`` (``Rainbow``, at the end) is all of them at Hessel et
al.'s values.

Reads like CleanRL's dqn.py: epsilon-greedy acting with a linear schedule and one TD step per update. The
replay buffer, the ``learning_starts`` uniform-random warm-up, ``gradient_steps`` updates every
``train_frequency`` env steps and the target network (hard copy every ``target_network_frequency`` env steps,
or Polyak with ``tau < 1``) are the off-policy base's (algos/off_policy.py). Every step count here is in env
steps over all envs (and all distributed workers), so a setting means the same whatever ``env.num_envs`` is.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rltrain.algos.adam import clip_grad_norm, make_adam
from rltrain.algos.base import Q_NETWORK_UNREAD, Sync, check_epsilon_schedule, positive, refuse_recurrent, within
from rltrain.algos.distributional import c51_projection, quantile_huber_loss
from rltrain.algos.off_policy import HindsightSettings, OffPolicy, TargetNetwork
from rltrain.algos.td_numpy import NumpyTDStep
from rltrain.data.nstep import nstep_batch
from rltrain.data.prioritized import PrioritizedReplayBuffer
from rltrain.data.replay import Batch, ReplayBuffer
from rltrain.data.structs import EnvSpec, Metrics
from rltrain.errors import ConfigError, only_with
from rltrain.models.factory import ModelSettings, build
from rltrain.models.q_heads import QHeadOptions
from rltrain.models.settings import MLP

log = logging.getLogger(__name__)


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
    numpy_update: bool = True  # on CPU, an MLP over a flattened Box or MultiBinary (float vectors, bool / int /
    #                               uint8 planes such as MinAtar's under model.encoder=mlp) with a one-Linear head
    #                               (plain, qr or c51; any n_step, prioritized, double_dqn): the TD step in numpy
    #                               (algos/td_numpy.py; the same loss and checkpoints); false: autograd (what CUDA,
    #                               CNN, Dict and one-hot encoders, dueling and noisy heads run). QR-DQN on MinAtar
    #                               Breakout's planes with it: 0.50x sb3-contrib's whole-process CPU at level
    #                               returns (3 seeds, 20k steps, 2026-11-27, commit 5e6361d; a same-run ratio on a
    #                               shared VM: docs/algorithms/dqn.md). Source: rltrain (an implementation choice;
    #                               the results are autograd's)
    checkpoint_buffer: bool = field(default=False, metadata={"internal": True})  # put the replay buffer into
    #                               state_dict: set by the CLI from checkpoint.replay_buffer
    n_step: int = 1  # n-step returns read from the replay at sampling time (data/nstep.py). Source: SB3 n_steps
    prioritized: bool = False  # proportional prioritised replay (data/prioritized.py). Source: SB3 (uniform)
    priority_alpha: float = 0.6  # how much priorities count (0: uniform). Source: Schaul et al. 2016, proportional
    priority_beta0: float = 0.4  # importance-weight exponent at the start, annealed linearly to 1 over the
    #                              budget. Source: Schaul et al. 2016, proportional
    priority_eps: float = 1e-6  # added to |TD error| so that no priority is 0. Source: rltrain
    dueling: bool = False  # value and advantage streams (Wang et al. 2016). Source: SB3 (none)
    distributional: str = "none"  # none | c51 (Bellemare et al. 2017) | qr (QR-DQN, Dabney et al. 2018); these
    #                               replace algo.loss by cross-entropy / the quantile Huber loss. Source: SB3
    n_atoms: int = 51  # C51's atoms. Source: Bellemare et al. 2017
    v_min: float = -10.0  # lower end of C51's support; set it to the task's return range. Source: Bellemare
    #                       et al. 2017 (Atari, clipped rewards)
    v_max: float = 10.0  # upper end of C51's support. Source: Bellemare et al. 2017
    n_quantiles: int = 200  # QR-DQN's quantiles. Source: sb3-contrib QR-DQN (Dabney et al. 2018: 200)
    noisy: bool = False  # factorised noisy layers in the head (Fortunato et al. 2018). Source: SB3 (none)
    noisy_sigma0: float = 0.5  # their initial noise scale. Source: Fortunato et al. 2018 (factorised)
    adam_eps: float = 1e-8  # Adam's epsilon. Source: PyTorch / SB3

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma, tau and the replay's sizes (HindsightSettings)
        for key in ("lr", "target_network_frequency"):
            positive(f"algo.{key}", getattr(self, key))
        if self.max_grad_norm is not None:  # a norm <= 0 would zero or flip every gradient; null turns clipping off
            positive("algo.max_grad_norm", self.max_grad_norm)
        check_epsilon_schedule(self)
        if self.frame_stack is not None and (self.frame_stack < 0 or self.frame_stack == 1):
            # a 1-frame stack is the observation itself: no frames for rows to share, 0 stores it whole
            one = " (a stack of 1 frame is the observation itself, stored whole as 0 does)" \
                if self.frame_stack == 1 else ""
            raise ConfigError(f"algo.frame_stack={self.frame_stack}: K >= 2, 0 (whole stacks stored) or null "
                              f"(inferred){one}; set algo.frame_stack=null")
        if self.loss not in ("mse", "huber"):
            raise ConfigError(f"algo.loss={self.loss!r}: choose mse or huber")
        # noisy nets explore by their sigma: 0 would start them without noise (algo.noisy=false turns them off)
        for key in ("n_step", "n_atoms", "n_quantiles", "priority_eps", "adam_eps", "noisy_sigma0"):
            positive(f"algo.{key}", getattr(self, key))
        within("algo.priority_alpha", self.priority_alpha, 0, 1)
        within("algo.priority_beta0", self.priority_beta0, 0, 1)
        if self.her and (self.prioritized or self.n_step > 1):
            # hindsight goals are drawn per sampled row, uniformly; priorities and n-step chains belong to the
            # stored goal's rewards, which relabelling changes
            raise ConfigError(f"algo.her=true relabels uniform one-step samples: set algo.prioritized=false and "
                              f"algo.n_step=1 (got prioritized={self.prioritized}, n_step={self.n_step})")
        self.head_options()  # validates distributional, atoms and the support

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        """C51's support and atoms, QR-DQN's quantiles, the scalar TD loss, the priorities' and the noisy layers'
        settings: each read only with the option it belongs to (``head_options``, the TD steps, ``sample``)."""
        unread = super().unread_keys(action_kind=action_kind)
        mode = self.distributional
        for key, needs in (("n_atoms", "c51"), ("v_min", "c51"), ("v_max", "c51"), ("n_quantiles", "qr"),
                           ("loss", "none")):
            if mode != needs:
                unread[key] = only_with(f"algo.distributional={needs}", mode)
        for key, option in (("priority_alpha", "prioritized"), ("priority_beta0", "prioritized"),
                            ("priority_eps", "prioritized"), ("noisy_sigma0", "noisy")):
            if not getattr(self, option):
                unread[key] = only_with(f"algo.{option}=true", False)
        return unread

    def head_options(self) -> QHeadOptions:
        """What the Q-network outputs (models/q_heads.py)."""
        return QHeadOptions(dueling=self.dueling, distributional=self.distributional, noisy=self.noisy,
                            atoms=self.n_quantiles if self.distributional == "qr" else self.n_atoms,
                            v_min=self.v_min, v_max=self.v_max, noisy_sigma0=self.noisy_sigma0)


class DQN(OffPolicy):
    """DQN's networks and TD step; replay, warm-up, updates owed and the target schedule are ``OffPolicy``'s."""

    name = "dqn"
    action_kinds = ("discrete",)
    settings_class = DQNSettings
    mlp = MLP((64, 64), "relu")  # SB3's DQN MlpPolicy (its QNetwork: net_arch [64, 64], ReLU)
    model_keys_unread = Q_NETWORK_UNREAD
    stat_names = ("loss/q", "train/q_mean")
    settings: DQNSettings

    def __init__(self, spec: EnvSpec, settings: DQNSettings = DQNSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoder by observation space, cli/build.py); None: its defaults."""
        model = model or ModelSettings()
        refuse_recurrent(f"algo={self.name} (off-policy)", model.core)
        s = settings
        # the env's stack depth (EnvSpec.frame_stack, from its FrameStackObservation) unless the user sets one
        frame_stack = getattr(spec, "frame_stack", None) if s.frame_stack is None else (s.frame_stack or None)
        buffer = partial(PrioritizedReplayBuffer, alpha=s.priority_alpha, eps=s.priority_eps) if s.prioritized \
            else ReplayBuffer
        super().__init__(spec, s, num_envs=num_envs, device=device, sync=sync, frame_stack=frame_stack,
                         buffer_class=buffer)

        # Q(s, .) from the model family: encoder by observation space + a head (plain, dueling, distributional,
        # noisy: models/q_heads.py)
        head = s.head_options()
        self.policy = build(spec, model.with_mlp(*self.mlp), "q", **vars(head)).to(device)
        self.target = copy.deepcopy(self.policy).requires_grad_(False)
        self.params = list(self.policy.parameters())
        # the TD step: in numpy for an MLP over a flattened Box whose head is one Linear (plain, QR-DQN, C51) on CPU,
        # whatever the loss, target and replay options (its parameters re-homed into one flat buffer; Adam in
        # torch's checkpoint format), else autograd (dueling, noisy, encoders, action masks, CUDA)
        self.numpy_step = NumpyTDStep(
            self.policy.mlp_layers, self.target.mlp_layers, activation=self.policy.mlp_activation, lr=s.lr,
            adam_eps=s.adam_eps, gamma=s.gamma, loss=s.loss, double_dqn=s.double_dqn, max_grad_norm=s.max_grad_norm,
            sync=self.sync, distributional=head.distributional, outputs=head.outputs,
            support=getattr(self.policy.q.head, "support", None),
        ) if s.numpy_update and device.type == "cpu" and self.policy.mlp_layers else None
        self.optimizer = self.numpy_step.optimizer if self.numpy_step else make_adam(self.params, s.lr,
                                                                                      eps=s.adam_eps)
        self.beta = s.priority_beta0  # prioritised replay's importance exponent, annealed in sample()
        self.support_warned = False  # C51's values pinned at an end of its support: said once (_check_support)
        self.epsilon_set: float | None = None  # what explore() last wrote into the policy's epsilon buffer
        # hard copy (tau = 1) or Polyak average every target_network_frequency env steps
        self.sync_targets_every(s.target_network_frequency, TargetNetwork(self.policy, self.target, tau=s.tau))

    @classmethod
    def target_sync_key(cls) -> str | None:
        return "target_network_frequency"  # the sync_targets_every above

    def _learn(self, rollout, progress: float, *, rollouts: int) -> Metrics:
        metrics = super()._learn(rollout, progress, rollouts=rollouts)
        if self.settings.distributional == "c51" and "train/q_mean" in metrics:
            self._check_support(metrics["train/q_mean"])
        return metrics

    def _check_support(self, q_mean: float) -> None:
        """C51 cannot value a return outside [v_min, v_max]: targets are projected onto it, so a task whose
        discounted returns pass an end (the paper's [-10, 10] fits Atari's clipped rewards, not CartPole's 1 per
        step over 500 steps) learns values pinned at that end and acts on ties. Said once, when the mean Q is
        within 5% of the range of an end (the same on every rank: q_mean is all-reduced)."""
        s = self.settings
        margin = 0.05 * (s.v_max - s.v_min)
        end = "v_max" if q_mean > s.v_max - margin else "v_min" if q_mean < s.v_min + margin else None
        if end is None or self.support_warned:
            return
        self.support_warned = True
        if self.sync.rank == 0:
            log.warning("algo.distributional=c51: the mean Q (%.2f) is at the support's end algo.%s=%g: returns past "
                        "it are clipped there, so the values stop telling actions apart; set algo.v_min / algo.v_max "
                        "to the task's range of discounted returns (e.g. +-max|reward| / (1 - gamma) = +-%g here at "
                        "most)", q_mean, end, getattr(s, end), self._return_bound())

    def _return_bound(self) -> float:
        """max |reward| seen in the replay over (1 - gamma): a bound on any discounted return of this task."""
        rewards = self.buffer.rewards[:self.buffer.ready] if self.buffer.ready else np.zeros(1)
        return float(np.round(np.abs(rewards).max() / (1.0 - self.settings.gamma), 1))

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

    def sample(self, progress: float) -> Batch:
        """A minibatch: uniform or by priority (beta annealed linearly from ``priority_beta0`` to 1 over the
        budget, Schaul et al. 2016), of one-step or n-step transitions."""
        s, buffer = self.settings, self.buffer
        if not s.prioritized and s.n_step == 1:
            return self.uniform_batch(self.batch_size)  # the buffer's, or relabelled with hindsight goals
        weights = None
        if s.prioritized:
            self.beta = s.priority_beta0 + min(progress, 1.0) * (1.0 - s.priority_beta0)
            slots, weights = buffer.draw(self.batch_size, beta=self.beta)
        else:
            slots = buffer._draw(self.batch_size)
        batch = nstep_batch(buffer, slots, n=s.n_step, gamma=s.gamma) if s.n_step > 1 else buffer.batch(slots)
        if weights is not None:
            batch.weights, batch.slots = torch.as_tensor(weights, device=self.device), slots
        return batch

    def update(self, batch: Batch) -> Tensor:
        """One TD step on a minibatch (numpy's or autograd's); returns detached [td_loss, mean Q(s, a)]. Prioritised
        replay's drawn rows get their new priorities."""
        stats, priority = self.numpy_step.step(batch) if self.numpy_step is not None else self.autograd_step(batch)
        if batch.slots is not None:  # (read back from the device only here: without PER no step waits for it)
            self.buffer.update_priorities(batch.slots, priority.cpu().numpy())
        return stats

    def autograd_step(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The TD step in torch: ([td_loss, mean Q(s, a)], the per-transition priorities [B]), detached."""
        s, b = self.settings, batch
        # the buffer hands observations out in their stored dtype (a dict of them for Dict spaces); the
        # Q-network converts them (the MLP casts to float, an encoder also scales uint8 pixels)
        obs, next_obs, actions = b.obs, b.next_obs, b.actions.long()
        rows = torch.arange(len(actions), device=actions.device)
        # gamma^k (1 - terminated): the bootstrap's weight, k = 1 unless n-step
        discounts = (s.gamma if b.discounts is None else b.discounts) * (1.0 - b.terminated)
        with torch.no_grad():
            next_q_target, next_raw = self.target.q_and_raw(next_obs)
            # Double DQN: the online net picks a', the target net values it (reduces overestimation)
            next_a = (self.policy(next_obs) if s.double_dqn else next_q_target).argmax(-1)
            next_raw = next_raw[rows, next_a]  # [B, K]: the target's outputs for a'
        raw = self.policy.q.raw(obs)[rows, actions]  # [B, K]
        if s.distributional == "c51":
            # cross-entropy to the projected target distribution (Bellemare et al. 2017, algorithm 1)
            target = c51_projection(next_raw.softmax(-1), b.rewards, discounts, self.policy.q.head.support)
            per_sample = -(target * raw.log_softmax(-1)).sum(-1)
            priority = per_sample  # Rainbow prioritises by this loss (Hessel et al. 2018)
            q = self.policy.q.head.q_values(raw.unsqueeze(1)).squeeze(1)
        elif s.distributional == "qr":
            targets = b.rewards[:, None] + discounts[:, None] * next_raw
            per_sample = quantile_huber_loss(raw, targets)
            priority = per_sample
            q = raw.mean(-1)
        else:
            q = raw.squeeze(-1)
            td_target = b.rewards + discounts * next_raw.squeeze(-1)
            per_sample = F.mse_loss(q, td_target, reduction="none") if s.loss == "mse" else \
                F.smooth_l1_loss(q, td_target, reduction="none")
            priority = q - td_target
        # prioritised replay corrects its sampling bias with importance weights (Schaul et al. 2016, eq. 4)
        loss = per_sample.mean() if b.weights is None else (per_sample * b.weights).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        if s.max_grad_norm is not None:
            clip_grad_norm(self.params, s.max_grad_norm)
        self.optimizer.step()
        return torch.stack([loss.detach(), q.detach().mean()]), priority.detach()

    def networks_state(self) -> dict:
        return {"policy": self.policy.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_networks_state(self, state: dict) -> None:
        self.epsilon_set = None  # the loaded buffer holds the checkpoint's epsilon
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])


@dataclass(frozen=True, kw_only=True)
class RainbowSettings(DQNSettings):
    """Rainbow (``algo=rainbow``): DQN with every option on at Hessel et al. 2018's values (their table 1; step
    counts there are in frames at action repeat 4, here in env steps). Every other field is DQN's."""

    lr: float = 6.25e-5  # Adam learning rate. Source: Hessel et al. 2018
    adam_eps: float = 1.5e-4  # Adam's epsilon. Source: Hessel et al. 2018
    n_step: int = 3  # multi-step returns. Source: Hessel et al. 2018
    prioritized: bool = True  # proportional prioritised replay. Source: Hessel et al. 2018
    priority_alpha: float = 0.5  # priority exponent. Source: Hessel et al. 2018
    priority_beta0: float = 0.4  # importance exponent, annealed to 1. Source: Hessel et al. 2018
    dueling: bool = True  # dueling streams. Source: Hessel et al. 2018
    distributional: str = "c51"  # distributional head. Source: Hessel et al. 2018 (C51, 51 atoms in [-10, 10])
    double_dqn: bool = True  # the online net selects a' for the target distribution. Source: Hessel et al. 2018
    noisy: bool = True  # noisy nets replace epsilon-greedy. Source: Hessel et al. 2018 (sigma0 0.5)
    start_e: float = 0.0  # epsilon: greedy in the noisy net. Source: Hessel et al. 2018
    end_e: float = 0.0  # epsilon at the end. Source: Hessel et al. 2018
    learning_starts: int = 20_000  # env steps before learning. Source: Hessel et al. 2018 (80K frames)
    target_network_frequency: int = 8_000  # env steps between target copies. Source: Hessel et al. 2018
    #                                        (32K frames)


class Rainbow(DQN):
    """DQN with every Rainbow option on by default (``RainbowSettings``); the same class of network and TD step."""

    name = "rainbow"
    settings_class = RainbowSettings
    mlp = MLP((64, 64), "relu")  # DQN's (SB3's DQN MlpPolicy); Hessel et al. 2018 used the Nature CNN on Atari
    settings: RainbowSettings

    def __init__(self, spec: EnvSpec, settings: RainbowSettings = RainbowSettings(), **kwargs):
        super().__init__(spec, settings, **kwargs)
