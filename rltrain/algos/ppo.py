"""Proximal Policy Optimization (Schulman et al. 2017), clipped surrogate, for discrete and Box actions.

Hyper-parameter names follow CleanRL's ppo.py so settings carry over. Implementation details follow
"The 37 Implementation Details of PPO" (Huang et al. 2022): orthogonal init, GAE, advantage
normalisation per minibatch, clipped value loss, global grad-norm clipping, linear LR annealing, Adam
eps 1e-5, state-independent log-std for continuous actions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algos.base import Algorithm, Policy, RewardScaler, Sync, make_adam, positive
from rltrain.errors import ConfigError
from rltrain.nets import (
    RunningNorm,
    categorical_logp_entropy,
    categorical_sample,
    gaussian_logp_entropy,
    gaussian_sample,
    mlp,
)
from rltrain.returns import gae
from rltrain.types import ActOutput, EnvSpec, Metrics, Rollout


class ActorCritic(Policy):
    """Separate actor and critic MLPs over (optionally) normalised observations."""

    def __init__(self, spec: EnvSpec, *, hidden_sizes: Sequence[int], activation: str, norm_obs: bool,
                 init_log_std: float = 0.0):
        super().__init__()
        obs_dim = int(np.prod(spec.obs_shape))
        self.discrete = spec.action_kind == "discrete"
        act_dim = spec.n_actions if self.discrete else int(np.prod(spec.action_shape))
        self.obs_norm = RunningNorm(spec.obs_shape, enabled=norm_obs)
        # a small last-layer gain keeps the initial policy near uniform / zero-mean (Andrychowicz et al. 2021)
        self.actor = mlp(obs_dim, hidden_sizes, act_dim, activation=activation, out_std=0.01)
        self.critic = mlp(obs_dim, hidden_sizes, 1, activation=activation, out_std=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def act(self, obs: Tensor, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        out = self.actor(self.obs_norm(obs))
        if self.discrete:
            return ActOutput(*categorical_sample(out, deterministic, generator))
        return ActOutput(*gaussian_sample(out, self.log_std, deterministic, generator))

    def value(self, obs: Tensor) -> Tensor:
        """obs [B, *obs_shape] -> V(obs) [B]."""
        return self.critic(self.obs_norm(obs)).squeeze(-1)

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """obs [B, ...], action [B, ...] -> (log_prob [B], entropy [B], value [B])."""
        x = self.obs_norm(obs)
        out = self.actor(x)
        if self.discrete:
            logp, ent = categorical_logp_entropy(out, action)
        else:
            logp, ent = gaussian_logp_entropy(out, self.log_std, action)
        return logp, ent, self.critic(x).squeeze(-1)


class PPO(Algorithm):
    name = "ppo"

    def __init__(
        self,
        spec: EnvSpec,
        *,
        num_envs: int,
        device: torch.device,
        sync: Sync | None = None,
        rollout_len: int = 128,  # steps per env per update (CleanRL num_steps)
        update_epochs: int = 4,  # passes over the batch per update
        num_minibatches: int = 4,  # minibatches per epoch; must divide rollout_len * num_envs
        lr: float = 2.5e-4,  # Adam learning rate
        anneal_lr: bool = True,  # linear decay to 0 over total_env_steps
        gamma: float = 0.99,  # discount
        gae_lambda: float = 0.95,  # GAE lambda
        clip_coef: float = 0.2,  # surrogate clipping epsilon
        clip_vloss: bool = True,  # clip the value loss around the old values
        ent_coef: float = 0.01,  # entropy bonus
        vf_coef: float = 0.5,  # value loss weight
        max_grad_norm: float = 0.5,  # global gradient norm clip
        norm_adv: bool = True,  # normalise advantages per minibatch
        target_kl: float | None = None,  # stop the epochs early when approx KL exceeds it
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        norm_obs: bool = False,  # running observation normalisation (stats checkpointed)
        norm_reward: bool = False,  # scale rewards by the running std of the discounted return
        init_log_std: float = 0.0,  # Box actions: initial log std of the Gaussian
    ):
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        for key, value in [("algo.rollout_len", rollout_len), ("algo.update_epochs", update_epochs),
                           ("algo.num_minibatches", num_minibatches), ("algo.lr", lr), ("env.num_envs", num_envs)]:
            positive(key, value)
        for key, value in [("algo.max_grad_norm", max_grad_norm), ("algo.clip_coef", clip_coef)]:
            positive(key, value)
        if not 0 <= gamma <= 1 or not 0 <= gae_lambda <= 1:
            raise ConfigError(f"algo.gamma={gamma} and algo.gae_lambda={gae_lambda} must lie in [0, 1]")
        if activation not in ("tanh", "relu", "elu", "silu"):
            raise ConfigError(f"algo.activation={activation!r} is not one of: tanh, relu, elu, silu")
        batch = rollout_len * num_envs
        if batch % num_minibatches:
            raise ConfigError(f"algo.num_minibatches={num_minibatches} does not divide the batch: "
                              f"algo.rollout_len ({rollout_len}) x env.num_envs ({num_envs}) = {batch}")
        self.rollout_len = rollout_len
        self.update_epochs, self.num_minibatches = update_epochs, num_minibatches
        self.lr, self.anneal_lr = lr, anneal_lr
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.clip_coef, self.clip_vloss = clip_coef, clip_vloss
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        self.norm_adv, self.target_kl = norm_adv, target_kl
        self.policy = ActorCritic(spec, hidden_sizes=list(hidden_sizes), activation=activation,
                                  norm_obs=norm_obs, init_log_std=init_log_std).to(device)
        self.params = list(self.policy.parameters())
        self.optimizer = make_adam(self.params, lr)
        self.reward_scaler = RewardScaler(gamma, num_envs) if norm_reward else None

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        T, N = rollout.shape
        dev, pol = self.device, self.policy
        obs = torch.from_numpy(rollout.obs.reshape(T * N, *self.spec.obs_shape)).to(dev)
        next_obs = torch.from_numpy(rollout.next_obs.reshape(T * N, *self.spec.obs_shape)).to(dev)
        rewards = self.reward_scaler(rollout, self.sync) if self.reward_scaler else rollout.rewards

        # 1. Values of every observation and every true successor, in one batched forward.
        with torch.no_grad():
            v = pol.value(torch.cat([obs, next_obs])).cpu().numpy()
        values, next_values = v[: T * N].reshape(T, N), v[T * N:].reshape(T, N)
        adv, ret = gae(rewards, values, next_values, rollout.terminated, rollout.truncated,
                       gamma=self.gamma, lam=self.gae_lambda)

        lr = self.lr * max(1.0 - progress, 0.0) if self.anneal_lr else self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        b_act = torch.from_numpy(rollout.actions.reshape(T * N, *self.spec.action_shape)).to(dev)
        b_logp = torch.from_numpy(rollout.log_probs.reshape(-1)).to(dev)
        b_adv = torch.from_numpy(adv.reshape(-1)).to(dev)
        b_ret = torch.from_numpy(ret.reshape(-1)).to(dev)
        b_val = torch.from_numpy(values.reshape(-1)).to(dev)

        # 2. Epochs of clipped-surrogate updates over shuffled minibatches (gathered once per epoch).
        B, M = T * N, self.num_minibatches
        mb = B // M
        stats: list[Tensor] = []
        for _ in range(self.update_epochs):
            perm = torch.randperm(B, device=dev)
            g_obs, g_act, g_logp = obs[perm], b_act[perm], b_logp[perm]
            g_adv, g_ret, g_val = b_adv[perm], b_ret[perm], b_val[perm]
            for s in range(0, B, mb):
                sl = slice(s, s + mb)
                stats.append(self._minibatch_step(g_obs[sl], g_act[sl], g_logp[sl], g_adv[sl], g_ret[sl], g_val[sl]))
            if self.target_kl is not None and stats[-1][3].item() > self.target_kl:
                break

        # 3. Observation statistics move after the update, so this update's ratios start at exactly 1.
        if pol.obs_norm.enabled:
            pol.obs_norm.update_from_moments(self.sync.sum(RunningNorm.moments(rollout.obs, len(self.spec.obs_shape))))
        s = torch.stack(stats).mean(0).cpu().numpy()
        y, var_y = ret.reshape(-1), float(np.var(ret))
        explained = float("nan") if var_y == 0 else 1.0 - float(np.var(y - values.reshape(-1))) / var_y
        s = self.sync.mean(np.append(s, explained))
        return {"loss/policy": float(s[0]), "loss/value": float(s[1]), "loss/entropy": float(s[2]),
                "train/approx_kl": float(s[3]), "train/clip_frac": float(s[4]),
                "train/explained_variance": float(s[5]), "train/lr": lr}

    def _minibatch_step(self, obs: Tensor, act: Tensor, old_logp: Tensor, adv: Tensor, ret: Tensor,
                        old_val: Tensor) -> Tensor:
        """One gradient step; returns detached [pg_loss, v_loss, entropy, approx_kl, clip_frac]."""
        logp, entropy, value = self.policy.evaluate(obs, act)
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        if self.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - self.clip_coef, 1 + self.clip_coef)).mean()
        if self.clip_vloss:
            v_clipped = old_val + (value - old_val).clamp(-self.clip_coef, self.clip_coef)
            v_loss = 0.5 * torch.max((value - ret) ** 2, (v_clipped - ret) ** 2).mean()
        else:
            v_loss = 0.5 * ((value - ret) ** 2).mean()
        ent = entropy.mean()
        loss = pg_loss - self.ent_coef * ent + self.vf_coef * v_loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()
        with torch.no_grad():
            # k3 estimator of KL(old || new) (Schulman, "Approximating KL divergence")
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clip_frac = ((ratio - 1.0).abs() > self.clip_coef).float().mean()
            return torch.stack([pg_loss.detach(), v_loss.detach(), ent.detach(), approx_kl, clip_frac])

    def state_dict(self) -> dict:
        state = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.reward_scaler:
            state["reward_scaler"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reward_scaler and "reward_scaler" in state:
            self.reward_scaler.load_state_dict(state["reward_scaler"])


