"""Synchronous Advantage Actor-Critic (A2C; Mnih et al. 2016's A3C made synchronous), discrete and Box.

Settings follow Stable-Baselines3's A2C (short rollouts of ``rollout_len`` steps over N envs, one
gradient step per rollout, RMSprop with alpha 0.99 / eps 1e-5, grad-norm clip 0.5). Targets are n-step
bootstrapped returns (``gae_lambda = 1``) or GAE (``gae_lambda < 1``), from the shared ``returns.py``.
The network comes from the model family (``models.factory.build(..., "actor_critic")``): separate actor and critic
MLPs on vectors, a CNN / multi-input encoder on images and Dict observations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rltrain.algos.adam import make_adam
from rltrain.algos.base import (
    ActorCriticState,
    Algorithm,
    AlgoSettings,
    RewardScaler,
    Sync,
    box_only,
    positive,
    set_lr,
    within,
)
from rltrain.algos.sequences import evaluate_rollout
from rltrain.data.returns import gae, nstep_returns
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.layers import RunningNorm
from rltrain.models.settings import SB3_MLP

OPTIMIZERS = ("rmsprop", "adam")


def check_optimizer(name: str) -> None:
    if name not in OPTIMIZERS:
        raise ConfigError(f"algo.optimizer={name!r} is not one of: rmsprop, adam")


def make_optimizer(name: str, params: list, lr: float, eps: float) -> torch.optim.Optimizer:
    """``rmsprop`` (A2C / IMPALA papers; alpha 0.99) or ``adam``."""
    check_optimizer(name)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=0.99, eps=eps)
    return make_adam(params, lr, eps=eps)


class ActorCriticLearner(ActorCriticState):
    """What A2C and IMPALA build alike: the actor-critic from the model family, its optimiser (``optimizer``:
    rmsprop or adam) and the reward scaler. ``settings`` carries rollout_len, norm_obs, init_log_std, optimizer,
    lr, optimizer_eps, gamma and norm_reward; the MLP is the algorithm's ``mlp`` unless the model group sets it."""

    def _build_learner(self, spec: EnvSpec, settings, *, num_envs: int, model: ModelSettings | None) -> None:
        s = self.settings = settings
        self.rollout_len = s.rollout_len
        model = model or ModelSettings()
        self.policy = build(spec, model.with_mlp(*self.mlp), "actor_critic",
                            norm_obs=s.norm_obs, init_log_std=s.init_log_std).to(self.device)
        self.recurrent = model.core != "identity"  # model.core=lstm|gru: learn on sequences
        self.params = self.policy.param_list()  # the shared optimiser-state order
        self.optimizer = make_optimizer(s.optimizer, self.params, s.lr, s.optimizer_eps)
        self.reward_scaler = RewardScaler(s.gamma, num_envs) if s.norm_reward else None


@dataclass(frozen=True, kw_only=True)
class A2CSettings(AlgoSettings):
    """A2C's hyper-parameters (``algo=a2c``): generic defaults, Stable-Baselines3's A2C (SB3) for every key;
    tuned settings live in presets (conf/experiment/a2c_*.yaml)."""

    rollout_len: int = 5  # steps per env per update (the "n" of n-step returns). Source: SB3 n_steps=5
    #                        (Mnih et al. 2016: t_max=5)
    lr: float = 7e-4  # learning rate. Source: SB3
    optimizer: str = "rmsprop"  # rmsprop (alpha 0.99) | adam. Source: SB3 use_rms_prop=True
    optimizer_eps: float = 1e-5  # the optimiser's epsilon. Source: SB3 rms_prop_eps
    anneal_lr: bool = False  # linear decay of lr to 0 over total_env_steps. Source: SB3 (constant)
    gamma: float = 0.99  # discount. Source: SB3
    gae_lambda: float = 1.0  # 1.0: plain n-step returns; < 1: GAE. Source: SB3
    ent_coef: float = 0.0  # entropy bonus. Source: SB3
    vf_coef: float = 0.5  # value loss weight. Source: SB3
    max_grad_norm: float = 0.5  # global gradient norm clip. Source: SB3
    norm_adv: bool = False  # normalise advantages over the batch. Source: SB3 normalize_advantage=False
    norm_obs: bool = False  # running observation normalisation. Source: SB3 (VecNormalize is opt-in)
    norm_reward: bool = False  # scale rewards by the running std of the discounted return. Source: SB3
    init_log_std: float = 0.0  # Box actions: initial log std of the Gaussian. Source: SB3 log_std_init=0.0

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma
        for key in ("rollout_len", "lr", "max_grad_norm", "optimizer_eps"):
            positive(f"algo.{key}", getattr(self, key))
        within("algo.gae_lambda", self.gae_lambda, 0, 1)
        check_optimizer(self.optimizer)

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        return {**super().unread_keys(action_kind=action_kind), **box_only(action_kind, "init_log_std")}


class A2C(ActorCriticLearner, Algorithm):
    name = "a2c"
    on_policy = True
    settings_class = A2CSettings
    mlp = SB3_MLP  # SB3's MlpPolicy: 64x64 tanh, actor and critic

    def __init__(self, spec: EnvSpec, settings: A2CSettings = A2CSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoder by observation space, cli/build.py); None: its defaults."""
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        self._build_learner(spec, settings, num_envs=num_envs, model=model)

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        s, dev, pol = self.settings, self.device, self.policy
        T, N = rollout.shape
        # 1. Data in: rewards (scaled by the running return std with norm_reward), log pi(a|x), entropy and V(x)
        #    with grad, and V(next_obs) of the true successor (0 after a termination).
        rewards = self.reward_scaler(rollout, self.sync) if self.reward_scaler else rollout.rewards
        actions = torch.from_numpy(rollout.actions.reshape(T * N, *self.spec.action_shape)).to(dev)
        logp, entropy, value, values, next_values = evaluate_rollout(pol, rollout, actions, dev,
                                                                     recurrent=self.recurrent)

        # 2. Targets: n-step returns R (gae_lambda = 1, Mnih et al. 2016) or GAE; advantages A = R - V.
        if s.gae_lambda == 1.0:
            returns = nstep_returns(rewards, next_values, rollout.terminated, rollout.truncated, gamma=s.gamma)
            adv = returns - values
        else:
            adv, returns = gae(rewards, values, next_values, rollout.terminated, rollout.truncated,
                               gamma=s.gamma, lam=s.gae_lambda)
        b_adv = torch.from_numpy(adv.reshape(-1)).to(dev)
        b_ret = torch.from_numpy(returns.reshape(-1)).to(dev)
        if s.norm_adv:
            b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)

        # 3. The loss:  -A * log pi(a|x)  + vf_coef * (R - V)^2  - ent_coef * H.
        pg_loss = -(b_adv * logp).mean()
        v_loss = F.mse_loss(value, b_ret)
        ent = entropy.mean()
        loss = pg_loss - s.ent_coef * ent + s.vf_coef * v_loss

        # 4. One optimiser step (learning rate linearly annealed with anneal_lr).
        lr = set_lr(self.optimizer, s.lr, anneal=s.anneal_lr, progress=progress)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, s.max_grad_norm, foreach=True)
        self.optimizer.step()

        # 5. Metrics out; observation statistics move after the update (the loss saw the acting statistics).
        if pol.obs_norm.enabled:
            pol.obs_norm.update_from_moments(self.sync.sum(RunningNorm.moments(rollout.obs, len(self.spec.obs_shape))))
        var_y = float(np.var(returns))
        explained = float("nan") if var_y == 0 else 1.0 - float(np.var(returns - values)) / var_y
        m = self.sync.mean(np.array([pg_loss.item(), v_loss.item(), ent.item(), explained]))
        return {"loss/policy": float(m[0]), "loss/value": float(m[1]), "loss/entropy": float(m[2]),
                "train/explained_variance": float(m[3]), "train/lr": lr}
