"""IMPALA's learner (Espeholt et al. 2018): actor-critic trained on V-trace targets.

The rollout carries the behaviour policy's log-probs mu(a|x) (written by the collector, wherever it ran);
the learner recomputes pi(a|x) with its current weights, and the importance ratios rho = pi / mu,
clipped at ``rho_bar`` (value targets), ``c_bar`` (trace cutting) and ``pg_rho_bar`` (policy gradient),
correct for the lag between actor and learner weights. Under ``trainer=sequential`` the rollout was
collected by these very weights, so rho = 1 and V-trace reduces to n-step returns: the on-policy
correctness check (``train/rho_mean`` is logged and stays at 1 there). The real use is with lagging
actors (``trainer=subprocess_actors``).

Loss (paper, section 4.2): -rho_pg * A_vtrace * log pi + baseline_coef * 0.5 (v_s - V)^2 - ent_coef * H.
The network comes from the model family (``models.factory.build(..., "actor_critic")``); checkpoints share PPO's layout
(``ActorCriticState``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rltrain.algos.a2c import make_optimizer
from rltrain.algos.base import ActorCriticState, Algorithm, RewardScaler, Sync, positive
from rltrain.algos.sequences import evaluate_rollout
from rltrain.data.returns import vtrace
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.layers import RunningNorm


class IMPALA(ActorCriticState, Algorithm):
    name = "impala"
    on_policy = True  # learns from (nearly) current-policy data; V-trace absorbs bounded lag

    def __init__(
        self,
        spec: EnvSpec,
        *,
        num_envs: int,
        device: torch.device,
        sync: Sync | None = None,
        model: ModelSettings | None = None,  # the model group: encoder by observation space (cli/build.py)
        rollout_len: int = 20,  # unroll length per env
        lr: float = 6e-4,
        optimizer: str = "rmsprop",  # rmsprop (paper) | adam
        optimizer_eps: float = 0.01,  # paper, torchbeast
        anneal_lr: bool = True,  # linear decay to 0 over total_env_steps (paper)
        gamma: float = 0.99,
        rho_bar: float = 1.0,  # clip of the importance weights in the value targets
        c_bar: float = 1.0,  # clip of the trace-cutting coefficients
        pg_rho_bar: float = 1.0,  # clip of the importance weights in the policy gradient
        ent_coef: float = 0.01,  # the paper's entropy cost
        vf_coef: float = 0.5,  # "baseline cost"
        max_grad_norm: float = 40.0,  # the paper's (torchbeast's) clip
        norm_adv: bool = False,  # normalise the V-trace policy-gradient advantages over the batch
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        norm_obs: bool = False,
        norm_reward: bool = False,
        init_log_std: float = 0.0,
    ):
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        for key, value in [("algo.rollout_len", rollout_len), ("algo.lr", lr), ("algo.max_grad_norm", max_grad_norm),
                           ("algo.rho_bar", rho_bar), ("algo.c_bar", c_bar), ("algo.pg_rho_bar", pg_rho_bar),
                           ("algo.optimizer_eps", optimizer_eps)]:
            positive(key, value)
        if not 0 <= gamma <= 1:
            raise ConfigError(f"algo.gamma={gamma} must lie in [0, 1]")
        if c_bar > rho_bar:
            # the paper assumes c_bar <= rho_bar (its fixed point analysis)
            raise ConfigError(f"algo.c_bar={c_bar} must not exceed algo.rho_bar={rho_bar}")
        self.rollout_len, self.lr, self.anneal_lr, self.gamma = rollout_len, lr, anneal_lr, gamma
        self.rho_bar, self.c_bar, self.pg_rho_bar = rho_bar, c_bar, pg_rho_bar
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

        # 1. The learner's log pi(a|x), entropy and V(x) (with grad), and V(next_obs) (without).
        logp, entropy, value, values, next_values = evaluate_rollout(pol, rollout, actions, dev,
                                                                     recurrent=self.recurrent)
        log_rhos = logp.detach().cpu().numpy().reshape(T, N) - rollout.log_probs

        # 2. V-trace targets v_s and policy-gradient advantages rho_pg (r + gamma v_{s+1} - V).
        vs, pg_adv = vtrace(log_rhos, rewards, values, next_values, rollout.terminated, rollout.truncated,
                            gamma=self.gamma, rho_bar=self.rho_bar, c_bar=self.c_bar, pg_rho_bar=self.pg_rho_bar)
        b_vs = torch.from_numpy(vs.reshape(-1)).to(dev)
        b_adv = torch.from_numpy(pg_adv.reshape(-1)).to(dev)
        if self.norm_adv:
            b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)

        # 3. One gradient step.
        pg_loss = -(b_adv * logp).mean()
        v_loss = 0.5 * ((b_vs - value) ** 2).mean()
        ent = entropy.mean()
        loss = pg_loss + self.vf_coef * v_loss - self.ent_coef * ent
        lr = self.lr * max(1.0 - progress, 0.0) if self.anneal_lr else self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()

        if pol.obs_norm.enabled:
            pol.obs_norm.update_from_moments(self.sync.sum(RunningNorm.moments(rollout.obs, len(shape))))
        rhos = np.exp(log_rhos)
        lag = rollout.policy_version.max() - rollout.policy_version.min()
        s = self.sync.mean(np.array([pg_loss.item(), v_loss.item(), ent.item(), rhos.mean(),
                                     float(np.mean(log_rhos > np.log(self.rho_bar) + 1e-6)), float(lag)]))
        return {"loss/policy": float(s[0]), "loss/value": float(s[1]), "loss/entropy": float(s[2]),
                "train/rho_mean": float(s[3]), "train/rho_clip_frac": float(s[4]),
                "train/policy_version_spread": float(s[5]), "train/lr": lr}
