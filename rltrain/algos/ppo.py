"""Proximal Policy Optimization (Schulman et al. 2017), clipped surrogate, for discrete and Box actions.

Hyper-parameter names follow CleanRL's ppo.py so settings carry over. Implementation details follow
"The 37 Implementation Details of PPO" (Huang et al. 2022): orthogonal init, GAE, advantage
normalisation per minibatch, clipped value loss, global grad-norm clipping, linear LR annealing, Adam
eps 1e-5, state-independent log-std for continuous actions.

Recurrent cores (``model.core=lstm|gru``): the collector stores the core state at each rollout's start;
the learner recomputes log-probs and values over the whole rollout from it, zeroing the state at episode
boundaries (truncated BPTT over one rollout), and minibatches split the envs (columns), never time, so
every sequence stays whole (as SB3-contrib's RecurrentPPO; Kapturowski et al. 2019 on stored states).

``learn()`` reads as the algorithm: values and GAE, the learning rate, epochs of minibatch steps on the loss
(``ppo_loss``: the paper's equations in order), metrics. Where the minibatch step runs is chosen once: the
numpy backend (``surrogate_numpy.NumpyUpdate``, a fused twin MLP on CPU) or autograd (``TorchUpdate``); the
tests check one against the other on the same minibatches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algos.adam import make_adam
from rltrain.algos.base import (
    ActorCriticState,
    Algorithm,
    AlgoSettings,
    RewardScaler,
    Sync,
    UpdateSizes,
    box_only,
    positive,
    set_lr,
    within,
)
from rltrain.algos.minibatches import ColumnMinibatches, Minibatch, RowMinibatches
from rltrain.algos.sequences import join_successors, sequence_inputs, successor_rows, successor_values
from rltrain.algos.surrogate_numpy import NumpyUpdate
from rltrain.data.returns import gae
from rltrain.data.structs import EnvSpec, Metrics, ObsArray, Rollout, obs_map
from rltrain.errors import ConfigError
from rltrain.models.encoders import batch_layout
from rltrain.models.factory import ModelSettings, build
from rltrain.models.layers import RunningNorm
from rltrain.models.numpy_mlp import adam_state_from_flat
from rltrain.models.settings import SB3_MLP

GENERIC_BATCH = 2048  # SB3's n_steps=2048 with one env; Schulman et al. 2017's T=2048 (MuJoCo)


def auto_rollout_len(num_envs: int, num_minibatches: int) -> int:
    """``algo.rollout_len=null``: steps per env for a batch of about ``GENERIC_BATCH`` steps over ``num_envs``
    envs, rounded down to a multiple that ``num_minibatches`` divides (at least one such multiple)."""
    positive("env.num_envs", num_envs)
    positive("algo.num_minibatches", num_minibatches)
    step = num_minibatches // math.gcd(num_envs, num_minibatches)  # rollout_len * num_envs % num_minibatches == 0
    return max(step, GENERIC_BATCH // num_envs // step * step)


def auto_minibatches(num_envs: int, *, recurrent: bool) -> int:
    """``algo.num_minibatches=null``: 32 (minibatches of 64 steps at the 2048-step batch: SB3's batch_size=64, the
    paper's 64); with a recurrent core, whose minibatches are whole env sequences, the largest divisor of
    ``num_envs`` up to 4 (CleanRL's ppo_atari_lstm: 4 minibatches of envs)."""
    positive("env.num_envs", num_envs)
    if not recurrent:
        return 32
    return max(d for d in range(1, min(4, num_envs) + 1) if num_envs % d == 0)


@dataclass(frozen=True, kw_only=True)
class PPOSettings(AlgoSettings):
    """PPO's hyper-parameters (``algo=ppo``): generic defaults for a task nobody tuned, the published ones; names
    follow CleanRL's ppo.py. SB3 = Stable-Baselines3's PPO; paper = Schulman et al. 2017 (its MuJoCo table);
    CleanRL = ppo_continuous_action.py. Tuned settings live in presets (conf/experiment/ppo_*.yaml)."""

    rollout_len: int | None = None  # steps per env per update; null: 2048 // env.num_envs (a 2048-step batch),
    #                                 rounded down so that num_minibatches divides it. Source: SB3 n_steps=2048
    #                                 with 1 env, paper T=2048
    update_epochs: int = 10  # passes over the batch per update. Source: SB3 n_epochs=10, paper K=10
    num_minibatches: int | None = None  # minibatches per epoch; null: 32 (2048 / 32 = 64 samples each), with
    #                                 a recurrent core (minibatches of whole env sequences) the largest divisor of
    #                                 env.num_envs up to 4. Source: SB3 batch_size=64, paper 64; CleanRL
    #                                 ppo_atari_lstm (4 minibatches of envs)
    lr: float = 3e-4  # Adam learning rate. Source: SB3, paper, CleanRL
    anneal_lr: bool = False  # linear decay of lr to 0 over total_env_steps. Source: SB3 (constant)
    gamma: float = 0.99  # discount. Source: SB3, paper
    gae_lambda: float = 0.95  # GAE lambda. Source: SB3, paper
    clip_coef: float = 0.2  # surrogate clipping epsilon. Source: SB3 clip_range, paper epsilon
    clip_vloss: bool = False  # clip the value loss around the old values. Source: SB3 clip_range_vf=None
    #                                 (Andrychowicz et al. 2021: value clipping does not help)
    ent_coef: float = 0.0  # entropy bonus. Source: SB3, paper (MuJoCo)
    vf_coef: float = 0.5  # value loss weight. Source: SB3
    max_grad_norm: float = 0.5  # global gradient norm clip. Source: SB3
    norm_adv: bool = True  # normalise advantages per minibatch. Source: SB3 normalize_advantage=True
    target_kl: float | None = None  # stop an update's epochs once the approx KL exceeds it; null: never.
    #                                 Source: SB3
    norm_obs: bool = False  # running observation normalisation (its statistics are checkpointed).
    #                                 Source: SB3 (VecNormalize is opt-in)
    norm_reward: bool = False  # scale rewards by the running std of the discounted return. Source: SB3
    init_log_std: float = 0.0  # Box actions: initial log std of the Gaussian. Source: SB3 log_std_init=0.0
    numpy_update: bool = True  # on CPU: the update in numpy (models/numpy_mlp.py + algos/surrogate_numpy.py),
    #                                 the same maths as the torch path and the same checkpoints; false: autograd
    #                                 + torch Adam (what CUDA always runs). Source: rltrain

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma
        for key in ("rollout_len", "update_epochs", "num_minibatches", "lr", "max_grad_norm", "clip_coef"):
            if getattr(self, key) is not None:  # None: resolved against env.num_envs by ``sizes``
                positive(f"algo.{key}", getattr(self, key))
        if self.target_kl is not None:  # a KL is >= 0: a threshold <= 0 would end every update after one minibatch
            positive("algo.target_kl", self.target_kl)
        within("algo.gae_lambda", self.gae_lambda, 0, 1)

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        return {**super().unread_keys(action_kind=action_kind), **box_only(action_kind, "init_log_std")}

    def sizes(self, num_envs: int, *, recurrent: bool) -> tuple[int, int]:
        """(rollout_len, num_minibatches) over ``num_envs`` envs, the nulls resolved; the minibatches must split
        the batch (a recurrent core's split the envs)."""
        num_minibatches = self.num_minibatches
        if num_minibatches is None:
            num_minibatches = auto_minibatches(num_envs, recurrent=recurrent)
        rollout_len = auto_rollout_len(num_envs, num_minibatches) if self.rollout_len is None else self.rollout_len
        positive("env.num_envs", num_envs)
        batch = rollout_len * num_envs
        if batch % num_minibatches:
            raise ConfigError(f"algo.num_minibatches={num_minibatches} does not divide the batch: "
                              f"algo.rollout_len ({rollout_len}) x env.num_envs ({num_envs}) = {batch}")
        if recurrent and num_envs % num_minibatches:
            raise ConfigError(f"algo.num_minibatches={num_minibatches}: a recurrent core splits minibatches by env, "
                              f"so it must divide env.num_envs={num_envs}; set algo.num_minibatches to a divisor")
        return rollout_len, num_minibatches


class PPO(ActorCriticState, Algorithm):
    name = "ppo"
    settings_class = PPOSettings
    mlp = SB3_MLP  # SB3's MlpPolicy: 64x64 tanh, actor and critic

    @classmethod
    def update_sizes(cls, settings: PPOSettings, *, num_envs: int, recurrent: bool) -> UpdateSizes:
        """``rollout_len`` and ``num_minibatches`` with their nulls resolved (``PPOSettings.sizes``)."""
        return UpdateSizes(*settings.sizes(num_envs, recurrent=recurrent))

    def __init__(self, spec: EnvSpec, settings: PPOSettings = PPOSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoder by observation space, cli/build.py); None: its defaults."""
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        model = model or ModelSettings()
        s = self.settings = settings
        self.recurrent = model.core != "identity"
        sizes = self.update_sizes(s, num_envs=num_envs, recurrent=self.recurrent)
        self.rollout_len, self.num_minibatches = sizes.rollout_len, sizes.num_minibatches
        self.policy = build(spec, model.with_mlp(*self.mlp), "actor_critic",
                            norm_obs=s.norm_obs, init_log_std=s.init_log_std).to(device)
        # the numpy backend runs the fused twin-MLP torso (float vectors) with a categorical or Gaussian head;
        # encoders, cores and other action spaces learn in torch
        self.numpy_update = (s.numpy_update and device.type == "cpu" and self.policy.fused_mlp is not None
                             and self.policy.dist.numpy_kind is not None)
        self.update: NumpyUpdate | TorchUpdate
        if self.numpy_update:
            self.update = NumpyUpdate(self.policy, lr=s.lr, clip_coef=s.clip_coef, clip_vloss=s.clip_vloss,
                                      ent_coef=s.ent_coef, vf_coef=s.vf_coef, max_grad_norm=s.max_grad_norm,
                                      sync=self.sync)
        else:
            self.update = TorchUpdate(self.policy, s, self.sync, device)
        self.params, self.optimizer = self.update.params, self.update.optimizer  # the shared state order
        self.reward_scaler = RewardScaler(s.gamma, num_envs) if s.norm_reward else None

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        s = self.settings
        # 1. Data in: rewards (norm_reward: over the running std of the return), V(obs) and V(next_obs) with the
        #    weights that acted, GAE advantages A and returns R = A + V (Schulman et al. 2016).
        rewards = self.reward_scaler(rollout, self.sync) if self.reward_scaler else rollout.rewards
        inputs = sequence_inputs(rollout, self.device) if self.recurrent else None
        values, next_values = self._values(rollout, inputs)
        adv, ret = gae(rewards, values, next_values, rollout.terminated, rollout.truncated,
                       gamma=s.gamma, lam=s.gae_lambda)

        # 2. The learning rate: constant, or annealed linearly to 0 over the budget.
        lr = set_lr(self.optimizer, s.lr, anneal=s.anneal_lr, progress=progress)

        # 3. K epochs over shuffled minibatches, one optimiser step each on ``ppo_loss`` (below: the ratio, the
        #    clipped surrogate L^CLIP, the value loss, the entropy bonus, their sum).
        batches = self._minibatches(rollout, inputs, adv, ret, values)
        stats: list = []
        for epoch in range(s.update_epochs):
            for minibatch in batches.epoch(epoch):
                stats.append(self.update.step(minibatch))
            # the KL of the epoch's last minibatch, averaged over workers: every rank must take the same
            # decision, or the ranks still in the epoch loop would wait forever in the gradient all-reduce
            if s.target_kl is not None:
                approx_kl = float(self.sync.mean(np.asarray([float(stats[-1][3])]))[0])
                if approx_kl > s.target_kl:
                    break

        # 4. Metrics out; observation statistics move after the update, so this update's ratios start at 1. The
        #    padding rows of a multi-agent rollout (``Rollout.valid`` False: an agent done while its env went on)
        #    repeat an observation that was not seen again: they count in neither the statistics nor the metrics.
        rows = slice(None) if rollout.valid is None else rollout.valid
        if self.policy.obs_norm.enabled:
            moments = RunningNorm.moments(obs_map(lambda x: x[rows], rollout.obs), len(self.spec.obs_shape))
            self.policy.obs_norm.update_from_moments(self.sync.sum(moments))
        y, var_y = ret[rows].reshape(-1), float(np.var(ret[rows]))
        explained = float("nan") if var_y == 0 else 1.0 - float(np.var(y - values[rows].reshape(-1))) / var_y
        m = self.sync.mean(np.append(self.update.mean(stats), explained))
        return {"loss/policy": float(m[0]), "loss/value": float(m[1]), "loss/entropy": float(m[2]),
                "train/approx_kl": float(m[3]), "train/clip_frac": float(m[4]),
                "train/explained_variance": float(m[5]), "train/lr": lr}

    def _values(self, rollout: Rollout, inputs: tuple | None) -> tuple[np.ndarray, np.ndarray]:
        """(V(obs), V(next_obs)), both [T, N]; V(next_obs) is 0 where the episode terminated (unused there).
        A recurrent policy unrolls over the rollout from its stored start state (``inputs``). Otherwise V(obs)
        is the rollout's own where acting computed it with these weights (``Rollout.values``: a torso shared
        with the critic, as CleanRL's and SB3's rollouts keep theirs), else one forward over the observations
        that the successors of their own (``successor_rows``) join, on the update's backend."""
        if inputs is not None:
            with torch.inference_mode():
                _, value, states = self.policy.unroll(*inputs)
                values = value.cpu().numpy().astype(np.float32)
                return values, successor_values(self.policy, rollout, values, states, self.device)
        if rollout.values is not None:  # acting ran the torch policy: its successors the same way
            return rollout.values, successor_values(self.policy, rollout, rollout.values, None, self.device)
        T, N = rollout.rewards.shape
        own = successor_rows(rollout)
        v = self.update.values(obs_map(lambda o, n: np.concatenate([o.reshape(T * N, *o.shape[2:]), n[own]]),
                                       rollout.obs, rollout.next_obs))
        values = v[: T * N].reshape(T, N)
        return values, join_successors(values, own, v[T * N:], rollout.terminated)

    def _minibatches(self, rollout: Rollout, inputs: tuple | None, adv: np.ndarray, ret: np.ndarray,
                     values: np.ndarray) -> RowMinibatches | ColumnMinibatches:
        """Whole env columns for a recurrent policy, else shuffled rows as the update's backend reads them."""
        s = self.settings
        if inputs is not None:
            return ColumnMinibatches(*inputs, rollout, adv, ret, values, minibatches=self.num_minibatches,
                                     norm_adv=s.norm_adv, device=self.device)
        return RowMinibatches(self.update.rows(rollout.obs), rollout, adv, ret, values, epochs=s.update_epochs,
                              minibatches=self.num_minibatches, norm_adv=s.norm_adv, device=self.update.device)

    def load_state_dict(self, state: dict) -> None:
        """``ActorCriticState``'s, also for checkpoints from before the numpy path wrote torch Adam's format."""
        opt = state["optimizer"]
        if "param_groups" not in opt and "exp_avg" in opt:
            group = {k: v for k, v in self.optimizer.state_dict()["param_groups"][0].items() if k != "params"}
            state = {**state, "optimizer": adam_state_from_flat(opt, [p.shape for p in self.params], group)}
        super().load_state_dict(state)


def ppo_loss(logp: Tensor, entropy: Tensor, value: Tensor, mb: Minibatch, s: PPOSettings) -> tuple[Tensor, Tensor]:
    """PPO's objective on one minibatch (Schulman et al. 2017), as a loss to minimise, and its detached
    statistics [policy loss, value loss, entropy, approx KL, clip fraction]. logp, entropy, value [mb] under
    the current weights; mb.old_logp, mb.adv (normalised), mb.ret, mb.old_values [mb]."""
    log_ratio = logp - mb.old_logp
    ratio = log_ratio.exp()  # r_t(theta) = pi(a|s) / pi_old(a|s)
    surr1 = ratio * mb.adv
    surr2 = ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef) * mb.adv
    l_clip = torch.min(surr1, surr2).mean()  # L^CLIP (eq. 7)
    if s.clip_vloss:  # the value's move clipped around the old value, as OpenAI baselines (Huang et al. 2022)
        v_clipped = mb.old_values + (value - mb.old_values).clamp(-s.clip_coef, s.clip_coef)
        v_loss = 0.5 * torch.max((value - mb.ret).square(), (v_clipped - mb.ret).square()).mean()
    else:
        v_loss = 0.5 * (value - mb.ret).square().mean()  # L^VF (eq. 9), halved as CleanRL and SB3
    ent = entropy.mean()  # S[pi] (eq. 9)
    pg_loss = -l_clip
    loss = pg_loss + s.vf_coef * v_loss - s.ent_coef * ent  # -(L^CLIP - c1 L^VF + c2 S) (eq. 9)
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator of KL(old || new) (Schulman, "Approximating KL")
        clip_frac = ((ratio - 1.0).abs() > s.clip_coef).float().mean()
        return loss, torch.stack([pg_loss, v_loss, ent, approx_kl, clip_frac])


class TorchUpdate:
    """PPO's update with autograd and torch Adam: any encoder, core and action space, and what CUDA runs. The
    interface of ``surrogate_numpy.NumpyUpdate``: minibatches of tensors on ``device``."""

    def __init__(self, policy: nn.Module, settings: PPOSettings, sync: Sync, device: torch.device):
        self.policy, self.settings, self.sync, self.device = policy, settings, sync, device
        self.params = policy.param_list()
        self.optimizer = make_adam(self.params, settings.lr, eps=1e-5)  # CleanRL's PPO

    def rows(self, obs: ObsArray) -> Tensor | dict:
        """[T, N, ...] -> [T * N, ...] on the device, pixels channels-last once (``batch_layout``)."""
        return obs_map(lambda x: batch_layout(torch.from_numpy(x.reshape(-1, *x.shape[2:])).to(self.device)), obs)

    def values(self, x: ObsArray) -> np.ndarray:
        """x [B, *obs_shape] raw observations (a dict of them for Dict spaces) -> V [B] float32."""
        with torch.inference_mode():
            return self.policy.value(obs_map(lambda a: torch.from_numpy(a).to(self.device), x)).cpu().numpy()

    def step(self, mb: Minibatch) -> Tensor:
        """One optimiser step on ``mb``; returns the detached statistics of ``ppo_loss``."""
        out, value = mb.outputs(self.policy)
        logp, entropy = self.policy.dist.log_prob_entropy(out, mb.actions)
        loss, stats = ppo_loss(logp, entropy, value, mb, self.settings)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm, foreach=True)
        self.optimizer.step()
        return stats

    def mean(self, stats: list[Tensor]) -> np.ndarray:
        return torch.stack(stats).mean(0).cpu().numpy()
