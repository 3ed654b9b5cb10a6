"""Parallelised Q-Network (PQN; Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning").

Q-learning without a replay buffer and without a target network: many vectorised envs act epsilon-greedily for
``rollout_len`` steps, the rollout's Peng's Q(lambda) returns are computed with the current network
(``data/returns.py`` ``q_lambda_returns``), and the network regresses Q(s, a) onto them for ``update_epochs``
epochs of ``num_minibatches`` shuffled minibatches, then the rollout is dropped. What keeps this stable, the
paper shows, is LayerNorm in the network (``models/q_heads.py`` ``LayerNormMLP``; on images a LayerNorm over the
encoder's features) and the decorrelation that many parallel envs give. Reads like CleanRL's pqn.py, whose
hyper-parameters are the defaults (RAdam, linearly annealed learning rate, epsilon annealed over half the
budget, lambda 0.65).

It is an on-policy learner in rltrain's sense (each rollout is learned from once, by the weights that acted), so
every trainer runs it; under ``trainer=distributed_simulator`` each worker collects ``env.num_envs`` x
``rollout_len`` steps and the minibatch gradients are all-reduced (``Sync.grads``), as PPO's are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rltrain.algos.base import (
    Q_NETWORK_UNREAD,
    Algorithm,
    AlgoSettings,
    Sync,
    check_epsilon_schedule,
    positive,
    refuse_recurrent,
    set_lr,
    within,
)
from rltrain.data.returns import q_lambda_returns
from rltrain.data.structs import EnvSpec, Metrics, Rollout, obs_map
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings, build
from rltrain.models.settings import MLP


@dataclass(frozen=True, kw_only=True)
class PQNSettings(AlgoSettings):
    """PQN's hyper-parameters (``algo=pqn``): CleanRL's pqn.py for every key unless said."""

    rollout_len: int = 128  # steps per env per update (CleanRL num_steps). Source: CleanRL pqn.py
    lr: float = 2.5e-4  # RAdam learning rate. Source: CleanRL pqn.py
    anneal_lr: bool = True  # decay the learning rate linearly to 0 over the budget. Source: CleanRL pqn.py
    gamma: float = 0.99  # discount. Source: CleanRL pqn.py
    q_lambda: float = 0.65  # lambda of the Q(lambda) returns. Source: CleanRL pqn.py
    update_epochs: int = 4  # passes over each rollout. Source: CleanRL pqn.py
    num_minibatches: int = 4  # minibatches per pass. Source: CleanRL pqn.py
    max_grad_norm: float = 10.0  # clip the global gradient norm. Source: CleanRL pqn.py
    start_e: float = 1.0  # epsilon at the start ... Source: CleanRL pqn.py
    end_e: float = 0.05  # ... and after exploration_fraction of the budget. Source: CleanRL pqn.py
    exploration_fraction: float = 0.5  # share of the budget over which epsilon decays. Source: CleanRL pqn.py
    layer_norm: bool = True  # LayerNorm in the network (the paper's key ingredient). Source: Gallici et al. 2024

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma
        for key in ("rollout_len", "lr", "update_epochs", "num_minibatches", "max_grad_norm"):
            positive(f"algo.{key}", getattr(self, key))
        within("algo.q_lambda", self.q_lambda, 0, 1)
        check_epsilon_schedule(self)


class PQN(Algorithm):
    """PQN's network (``build(..., "q", layer_norm=True)``: epsilon-greedy acting, greedy evaluation and export)
    and its update."""

    name = "pqn"
    action_kinds = ("discrete",)
    settings_class = PQNSettings
    mlp = MLP((120, 84), "relu")  # CleanRL's pqn.py: Linear -> LayerNorm -> ReLU per width
    model_keys_unread = Q_NETWORK_UNREAD
    settings: PQNSettings

    def __init__(self, spec: EnvSpec, settings: PQNSettings = PQNSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        model = model or ModelSettings()
        # PQN has no replay: its update regresses shuffled single steps, so a core would see no sequence
        refuse_recurrent("algo=pqn", model.core, why="its update learns from shuffled single steps, not sequences")
        s = self.settings = settings
        self.rollout_len = s.rollout_len
        if (num_envs * s.rollout_len) % s.num_minibatches:
            raise ConfigError(f"algo.num_minibatches={s.num_minibatches} must divide env.num_envs x algo.rollout_len"
                              f" = {num_envs} x {s.rollout_len}")
        self.policy = build(spec, model.with_mlp(*self.mlp), "q",
                            layer_norm=s.layer_norm).to(device)
        self.params = list(self.policy.parameters())
        # RAdam (Liu et al. 2020) as CleanRL's pqn.py: no warm-up schedule needed without a target network
        self.optimizer = torch.optim.RAdam(self.params, lr=s.lr)
        self.explore(0.0)

    def explore(self, progress: float) -> float:
        """Epsilon decays linearly over the first ``exploration_fraction`` of the budget (CleanRL); a buffer of the
        policy, so actors receive it with the weights."""
        s = self.settings
        frac = min(progress / s.exploration_fraction, 1.0)
        epsilon = float(np.float32(s.start_e + frac * (s.end_e - s.start_e)))
        self.policy.epsilon.fill_(epsilon)
        return epsilon

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        s, dev, pol = self.settings, self.device, self.policy
        T, N = rollout.shape
        flat = lambda x: torch.from_numpy(x.reshape(T * N, *x.shape[2:])).to(dev)  # noqa: E731
        obs, actions = obs_map(flat, rollout.obs), flat(rollout.actions).long()

        # 1. Targets: Q(lambda) returns from the current network's max_a Q(s', a) (masked to legal actions)
        with torch.no_grad():
            next_values = pol(obs_map(flat, rollout.next_obs)).max(-1).values.cpu().numpy().reshape(T, N)
        returns = q_lambda_returns(rollout.rewards, next_values, rollout.terminated, rollout.truncated,
                                   gamma=s.gamma, lam=s.q_lambda)
        b_ret = torch.from_numpy(returns.reshape(-1)).to(dev)

        # 2. Regress Q(s, a) onto them: update_epochs passes of shuffled minibatches (torch's seeded RNG)
        lr = set_lr(self.optimizer, s.lr, anneal=s.anneal_lr, progress=progress)
        size = T * N // s.num_minibatches
        losses, q_means = [], []
        for _ in range(s.update_epochs):
            order = torch.randperm(T * N).to(dev)
            for start in range(0, T * N, size):
                mb = order[start:start + size]
                q = pol(obs_map(lambda x, mb=mb: x[mb], obs)).gather(-1, actions[mb, None]).squeeze(-1)
                loss = F.mse_loss(q, b_ret[mb])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.sync.grads(self.params)
                nn.utils.clip_grad_norm_(self.params, s.max_grad_norm, foreach=True)
                self.optimizer.step()
                losses.append(loss.detach())
                q_means.append(q.detach().mean())

        # 3. Epsilon for the next rollout; metrics out (averaged over workers)
        epsilon = self.explore(progress)
        m = self.sync.mean(np.array([float(torch.stack(losses).mean()), float(torch.stack(q_means).mean())]))
        return {"loss/q": float(m[0]), "train/q_mean": float(m[1]), "train/epsilon": epsilon, "train/lr": lr}

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
