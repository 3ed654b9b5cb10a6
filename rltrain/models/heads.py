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
LOG_STD_HALF_RANGE = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)
LOG_STD_MID = LOG_STD_MIN + LOG_STD_HALF_RANGE
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
                             log_scale_sum: float | None = None, deterministic: bool = False,
                             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """SAC's policy (Haarnoja et al. 2018, appendix C): a = scale * tanh(u) + bias, u ~ N(mu, sigma).

    mu, raw_log_std [B, A] (the network's outputs), scale, bias [A] -> (action [B, A] in the env's bounds,
    log pi(a|s) [B] with the tanh Jacobian); reparameterised, so differentiable through mu and sigma.
    ``log_scale_sum``: sum(log(scale)), a constant of the log-probability (``SquashedGaussianHead`` keeps it;
    None: computed here)."""
    # squash log-std smoothly into [LOG_STD_MIN, LOG_STD_MAX] (keeps gradients, unlike a clamp):
    # LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) (tanh(raw) + 1) / 2
    log_std = torch.tanh(raw_log_std) * LOG_STD_HALF_RANGE + LOG_STD_MID
    eps = torch.zeros_like(mu) if deterministic else torch.randn(mu.shape, generator=generator, device=mu.device)
    u = mu + log_std.exp() * eps
    # log pi(a|s) = sum_i log N(u_i; mu_i, sigma_i) - log|da_i/du_i|, with
    #   log N(u; mu, sigma) = -eps^2 / 2 - log sigma - log sqrt(2 pi)
    #   log|da/du| = log scale + log(1 - tanh(u)^2) = log scale + 2 (log 2 - u - softplus(-2u))  (stable for large |u|)
    # the terms that do not depend on the sample summed once, outside the batch (a SAC update samples twice)
    if log_scale_sum is None:
        log_scale_sum = sum_log_scale(scale)
    const = squashed_log_prob_const(mu.shape[-1], log_scale_sum)
    logp = (2.0 * (u + F.softplus(-2.0 * u)) - 0.5 * eps.square() - log_std).sum(-1) - const
    return torch.tanh(u) * scale + bias, logp


def sum_log_scale(scale: Tensor) -> float:
    """sum(log scale) over the dimensions whose bounds differ. A Box dimension with low == high (a fixed joint,
    a reserved slot) holds one action, and log(0) = -inf made every log-probability +inf and SAC's losses NaN;
    its density is taken in the squashed [-1, 1] space instead (scale 1, as SB3 measures every dimension), a
    constant that moves no gradient."""
    return float(torch.log(scale[scale > 0]).sum())


def squashed_log_prob_const(act_dim: int, log_scale_sum: float) -> float:
    """What ``squashed_gaussian_sample``'s log pi(a|s) subtracts whatever the sample: A (log sqrt(2 pi) + 2 log 2)
    plus sum(log scale), for A action dimensions (the numpy actor, models/squashed_actor.py, subtracts the same)."""
    return act_dim * (_LOG_SQRT_2PI + 2.0 * math.log(2.0)) + log_scale_sum


class SquashedGaussianHead(nn.Module):
    """Box actions for SAC: features [B, F] -> a state-dependent mean and log-std [B, A] (two Linear layers
    with PyTorch's default init, as CleanRL's SAC actor), sampled by ``squashed_gaussian_sample``."""

    def __init__(self, in_dim: int, act_dim: int, low: Tensor, high: Tensor):
        super().__init__()
        self.mean = nn.Linear(in_dim, act_dim)
        self.log_std = nn.Linear(in_dim, act_dim)
        self.register_buffer("scale", (high - low) / 2.0)
        self.register_buffer("bias", (high + low) / 2.0)
        self.log_scale_sum = sum_log_scale(self.scale)  # kept in step with ``scale`` (loading below)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.log_scale_sum = sum_log_scale(self.scale)

    def forward(self, features: Tensor, *, deterministic: bool = False,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """features [B, F] -> (action [B, A], log_prob [B])."""
        return squashed_gaussian_sample(self.mean(features), self.log_std(features), self.scale, self.bias,
                                        log_scale_sum=self.log_scale_sum, deterministic=deterministic,
                                        generator=generator)


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
