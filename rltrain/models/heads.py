"""Heads: features [B, F] -> what an algorithm needs besides the action distribution (``distributions.py``):
state value, Q-values, SAC's squashed Gaussian; and the Ornstein-Uhlenbeck exploration noise."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrain.models.layers import layer_init

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # SAC's log-std range (CleanRL, SpinningUp)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)

# a small last-layer gain keeps the initial policy near uniform / zero-mean (Andrychowicz et al. 2021)
POLICY_GAIN = 0.01


class ValueHead(nn.Module):
    """features [B, F] -> V [B] (gain 1, as CleanRL's critic output)."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, 1), 1.0)

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features).squeeze(-1)


class QHead(nn.Module):
    """features [B, F] -> Q-values [B, n_actions] (one output per discrete action, Mnih et al. 2015)."""

    def __init__(self, in_dim: int, n_actions: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, n_actions), 1.0)

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features)


def squashed_gaussian_sample(mu: Tensor, raw_log_std: Tensor, scale: Tensor, bias: Tensor, *,
                             deterministic: bool = False,
                             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """SAC's policy (Haarnoja et al. 2018, appendix C): a = scale * tanh(u) + bias, u ~ N(mu, sigma).

    mu, raw_log_std [B, A] (the network's outputs), scale, bias [A] -> (action [B, A] in the env's bounds,
    log pi(a|s) [B] with the tanh Jacobian); reparameterised, so differentiable through mu and sigma."""
    # squash log-std smoothly into [LOG_STD_MIN, LOG_STD_MAX] (keeps gradients, unlike a clamp)
    log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw_log_std) + 1)
    eps = torch.zeros_like(mu) if deterministic else torch.randn(mu.shape, generator=generator, device=mu.device)
    u = mu + log_std.exp() * eps
    logp_u = (-0.5 * eps**2 - log_std - _LOG_SQRT_2PI).sum(-1)
    # log|d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|
    log_det = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1) + torch.log(scale).sum()
    return torch.tanh(u) * scale + bias, logp_u - log_det


class SquashedGaussianHead(nn.Module):
    """Box actions for SAC: features [B, F] -> a state-dependent mean and log-std [B, A] (two Linear layers
    with PyTorch's default init, as CleanRL's SAC actor), sampled by ``squashed_gaussian_sample``."""

    def __init__(self, in_dim: int, act_dim: int, low: Tensor, high: Tensor):
        super().__init__()
        self.mean = nn.Linear(in_dim, act_dim)
        self.log_std = nn.Linear(in_dim, act_dim)
        self.register_buffer("scale", (high - low) / 2.0)
        self.register_buffer("bias", (high + low) / 2.0)

    def forward(self, features: Tensor, *, deterministic: bool = False,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """features [B, F] -> (action [B, A], log_prob [B])."""
        return squashed_gaussian_sample(self.mean(features), self.log_std(features), self.scale, self.bias,
                                        deterministic=deterministic, generator=generator)


class OrnsteinUhlenbeckNoise:
    """Temporally correlated exploration noise added to continuous actions while collecting (never in
    evaluation): x <- x + theta * (0 - x) * dt + sigma * sqrt(dt) * N(0, 1), per env and action dimension,
    reset to 0 where an episode ended (Uhlenbeck & Ornstein 1930; used by DDPG, Lillicrap et al. 2016, and
    for SAC on MountainCarContinuous, whose reward is only found by sustained pushes). Draws come from the
    collector's seeded generator; the state is checkpointed with the collector.
    """

    def __init__(self, *, sigma: float, theta: float = 0.15, dt: float = 1e-2):
        self.sigma, self.theta, self.dt = sigma, theta, dt
        self.x: np.ndarray | None = None

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if self.x is None or self.x.shape != shape:
            self.x = np.zeros(shape, np.float64)
        self.x += -self.theta * self.x * self.dt + self.sigma * math.sqrt(self.dt) * rng.standard_normal(shape)
        return self.x.astype(np.float32)

    def reset(self, done: np.ndarray) -> None:
        if self.x is not None:
            self.x[done] = 0.0
