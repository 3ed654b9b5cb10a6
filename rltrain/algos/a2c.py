"""Synchronous Advantage Actor-Critic (A2C; Mnih et al. 2016's A3C made synchronous), discrete and Box.

Settings follow Stable-Baselines3's A2C (short rollouts of ``rollout_len`` steps over N envs, one
gradient step per rollout, RMSprop with alpha 0.99 / eps 1e-5, grad-norm clip 0.5). Targets are n-step
bootstrapped returns (``gae_lambda = 1``) or GAE (``gae_lambda < 1``), from the shared ``returns.py``.
The network comes from the model family (``models.factory.build(..., "actor_critic")``): separate actor and critic
MLPs on vectors, a CNN / multi-input encoder on images and Dict observations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rltrain.algos.base import (
    ActorCriticState,
    Algorithm,
    RewardScaler,
    Sync,
    make_adam,
    positive,
)
from rltrain.algos.sequences import evaluate_rollout
from rltrain.data.returns import gae, nstep_returns
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.layers import RunningNorm


def make_optimizer(name: str, params: list, lr: float, eps: float) -> torch.optim.Optimizer:
    """``rmsprop`` (A2C / IMPALA papers; alpha 0.99) or ``adam``."""
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=0.99, eps=eps)
    if name == "adam":
        return make_adam(params, lr, eps=eps)
    raise ConfigError(f"algo.optimizer={name!r} is not one of: rmsprop, adam")


class A2C(ActorCriticState, Algorithm):
    name = "a2c"
    on_policy = True

    def __init__(
        self,
        spec: EnvSpec,
        *,
        num_envs: int,
        device: torch.device,
        sync: Sync | None = None,
        model: ModelSettings | None = None,  # the model group: encoder by observation space (cli/build.py)
        rollout_len: int = 5,  # steps per env per update (the "n" of n-step returns)
        lr: float = 7e-4,
        optimizer: str = "rmsprop",  # rmsprop | adam
        optimizer_eps: float = 1e-5,
        anneal_lr: bool = False,  # linear decay to 0 over total_env_steps
        gamma: float = 0.99,
        gae_lambda: float = 1.0,  # 1.0: n-step returns; < 1: GAE
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        norm_adv: bool = False,  # normalise advantages over the batch
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        norm_obs: bool = False,
        norm_reward: bool = False,
        init_log_std: float = 0.0,  # Box actions: initial log std of the Gaussian
    ):
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        for key, value in [("algo.rollout_len", rollout_len), ("algo.lr", lr), ("algo.max_grad_norm", max_grad_norm),
                           ("algo.optimizer_eps", optimizer_eps)]:
            positive(key, value)
        if not 0 <= gamma <= 1 or not 0 <= gae_lambda <= 1:
            raise ConfigError(f"algo.gamma={gamma} and algo.gae_lambda={gae_lambda} must lie in [0, 1]")
        self.rollout_len, self.lr, self.anneal_lr = rollout_len, lr, anneal_lr
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.ent_coef, self.vf_coef, self.max_grad_norm, self.norm_adv = ent_coef, vf_coef, max_grad_norm, norm_adv
        self.policy = build(spec, (model or ModelSettings()).with_mlp(hidden_sizes, activation), "actor_critic",
                            norm_obs=norm_obs, init_log_std=init_log_std).to(device)
        self.recurrent = (model or ModelSettings()).core != "identity"  # model.core=lstm|gru: learn on sequences
        self.params = self.policy.param_list()  # the shared optimiser-state order
        self.optimizer = make_optimizer(optimizer, self.params, lr, optimizer_eps)
        self.reward_scaler = RewardScaler(gamma, num_envs) if norm_reward else None

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        T, N = rollout.shape
        dev, pol, shape = self.device, self.policy, self.spec.obs_shape
        actions = torch.from_numpy(rollout.actions.reshape(T * N, *self.spec.action_shape)).to(dev)
        rewards = self.reward_scaler(rollout, self.sync) if self.reward_scaler else rollout.rewards

        # 1. log pi(a|x), entropy and V(x) with grad; targets bootstrap from V(next_obs), the true successor
        #    (0 after a termination).
        logp, entropy, value, values, next_values = evaluate_rollout(pol, rollout, actions, dev,
                                                                     recurrent=self.recurrent)
        if self.gae_lambda == 1.0:
            returns = nstep_returns(rewards, next_values, rollout.terminated, rollout.truncated, gamma=self.gamma)
            adv = returns - values
        else:
            adv, returns = gae(rewards, values, next_values, rollout.terminated, rollout.truncated,
                               gamma=self.gamma, lam=self.gae_lambda)
        b_adv = torch.from_numpy(adv.reshape(-1)).to(dev)
        b_ret = torch.from_numpy(returns.reshape(-1)).to(dev)
        if self.norm_adv:
            b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)

        # 2. One gradient step on  -A * log pi  - ent_coef * H  + vf_coef * (R - V)^2.
        pg_loss = -(b_adv * logp).mean()
        v_loss = F.mse_loss(value, b_ret)
        ent = entropy.mean()
        loss = pg_loss - self.ent_coef * ent + self.vf_coef * v_loss
        lr = self.lr * max(1.0 - progress, 0.0) if self.anneal_lr else self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()

        # 3. Observation statistics move after the update (the loss above saw the acting statistics).
        if pol.obs_norm.enabled:
            pol.obs_norm.update_from_moments(self.sync.sum(RunningNorm.moments(rollout.obs, len(shape))))
        var_y = float(np.var(returns))
        explained = float("nan") if var_y == 0 else 1.0 - float(np.var(returns - values)) / var_y
        s = self.sync.mean(np.array([pg_loss.item(), v_loss.item(), ent.item(), explained]))
        return {"loss/policy": float(s[0]), "loss/value": float(s[1]), "loss/entropy": float(s[2]),
                "train/explained_variance": float(s[3]), "train/lr": lr}
