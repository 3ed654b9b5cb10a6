"""Network pieces: MLP torsos, running normalisers, categorical and Gaussian heads.

The heads sample without ``torch.distributions`` objects: building a distribution object per step costs
more than the forward pass for small nets (it capped acting near 23k steps/s on 2 cores). Discrete
actions use the Gumbel-max trick, Gaussian ones ``mean + std * eps``; log-probs are written out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal init (Engstrom et al. 2020, "Implementation Matters"): a PPO detail that matters."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, activation: str = "tanh",
        out_std: float = 1.0) -> nn.Sequential:
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    last = in_dim
    for h in hidden:
        layers += [layer_init(nn.Linear(last, h)), act()]
        last = h
    layers.append(layer_init(nn.Linear(last, out_dim), std=out_std))
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Running mean/variance (Chan et al. parallel update) kept as buffers, so they travel with weights.

    ``update`` takes batch moments, so distributed ranks can all-reduce (count, sum, sum of squares)
    first and every rank applies the same update.
    """

    def __init__(self, shape: Sequence[int], *, clip: float = 10.0, eps: float = 1e-8, enabled: bool = True):
        super().__init__()
        self.enabled = enabled
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(tuple(shape), dtype=torch.float64))
        self.register_buffer("var", torch.ones(tuple(shape), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self._mean32 = torch.zeros(tuple(shape))
        self._std32 = torch.ones(tuple(shape))

    @staticmethod
    def moments(x: np.ndarray, feature_dims: int) -> np.ndarray:
        """Flat [count, sum..., sumsq...] of ``x`` over all leading dims (float64)."""
        flat = x.reshape(-1, *x.shape[x.ndim - feature_dims:]).astype(np.float64) if feature_dims else \
            x.reshape(-1).astype(np.float64)
        return np.concatenate([[flat.shape[0]], flat.sum(0).ravel(), (flat**2).sum(0).ravel()])

    def update_from_moments(self, m: np.ndarray) -> None:
        size = self.mean.numel()
        n, s, ss = float(m[0]), torch.from_numpy(m[1:1 + size]), torch.from_numpy(m[1 + size:])
        if n <= 0:
            return
        b_mean = (s / n).reshape(self.mean.shape)
        b_var = (ss / n).reshape(self.mean.shape) - b_mean**2
        delta = b_mean - self.mean
        tot = self.count + n
        self.mean += delta * n / tot
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / tot
        self.var.copy_(m2 / tot)
        self.count.fill_(tot)
        self.refresh()

    def refresh(self) -> None:
        """Cache float32 mean/std for the hot path (call after loading a state dict)."""
        self._mean32 = self.mean.float()
        self._std32 = torch.sqrt(self.var + self.eps).float()

    def _load_from_state_dict(self, *args, **kwargs):  # keep the float32 cache in step with loads
        super()._load_from_state_dict(*args, **kwargs)
        self.refresh()

    def forward(self, x: Tensor) -> Tensor:
        if not self.enabled:
            return x
        return torch.clamp((x - self._mean32) / self._std32, -self.clip, self.clip)


def categorical_sample(logits: Tensor, deterministic: bool,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """logits [B, A] -> (action [B] int64, log_prob [B]). Gumbel-max: argmax(logits + Gumbel noise)."""
    logp_all = torch.log_softmax(logits, dim=-1)
    if deterministic:
        action = logits.argmax(-1)
    else:
        u = torch.rand(logits.shape, generator=generator).clamp_(1e-10, 1.0)
        action = (logits - torch.log(-torch.log(u))).argmax(-1)
    return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_logp_entropy(logits: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """logits [B, A], action [B] -> (log_prob [B], entropy [B])."""
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), entropy


def gaussian_sample(mean: Tensor, log_std: Tensor, deterministic: bool,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """mean [B, A], log_std [A] or [B, A] -> (action [B, A], log_prob [B]) of a diagonal Gaussian."""
    if deterministic:
        action = mean
        eps = torch.zeros_like(mean)
    else:
        eps = torch.randn(mean.shape, generator=generator)
        action = mean + log_std.exp() * eps
    logp = (-0.5 * eps**2 - log_std - _LOG_SQRT_2PI).sum(-1)
    return action, logp


def gaussian_logp_entropy(mean: Tensor, log_std: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """Diagonal Gaussian log-prob [B] of ``action`` [B, A] and entropy [B]."""
    log_std = log_std.expand_as(mean)
    z = (action - mean) / log_std.exp()
    logp = (-0.5 * z**2 - log_std - _LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
    return logp, entropy
