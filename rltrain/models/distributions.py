"""Action distributions: a policy's raw outputs [B, P] -> actions, log-probs, entropies, one class per
action-space kind, registered by that kind.

A policy's torso ends in a Linear of width ``param_dim``; the distribution turns those parameters into
actions. Only here does the action space matter, so a new action space is one registered class
(Sample Factory's ``action_distributions`` is the reference idea):

    sample(params, deterministic, generator) -> (action, log_prob [B])
    log_prob_entropy(params, action)         -> (log_prob [B], entropy [B])
    mode(params)                             -> the deterministic action (evaluation, export)

They sample without ``torch.distributions`` objects (building one per step costs more than a small
forward): Gumbel-max for categorical actions, ``mean + std * eps`` for Gaussian ones; ``layers`` holds the
maths, shared with the numpy fast path (``layers.NumpyActor`` draws the same actions from the same noise).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from rltrain.data.structs import EnvSpec
from rltrain.errors import ConfigError
from rltrain.models.layers import (
    categorical_logp_entropy,
    categorical_sample,
    gaussian_logp_entropy,
    gaussian_sample,
)


class ActionDistribution(nn.Module):
    """Base: ``param_dim`` raw parameters per sample; ``numpy_kind`` names the ``layers.NumpyActor`` branch
    that samples it in numpy on CPU (None: the numpy fast path does not cover it)."""

    kind: ClassVar[str]
    numpy_kind: ClassVar[str | None] = None
    param_dim: int

    def sample(self, params: Tensor, deterministic: bool,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def log_prob_entropy(self, params: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def mode(self, params: Tensor) -> Tensor:
        raise NotImplementedError


class Categorical(ActionDistribution):
    """Discrete(n): params are logits [B, n]; action [B] int64."""

    kind = "discrete"
    numpy_kind = "categorical"

    def __init__(self, spec: EnvSpec, *, init_log_std: float = 0.0):
        super().__init__()
        self.param_dim = spec.n_actions

    def sample(self, params, deterministic, generator=None):
        return categorical_sample(params, deterministic, generator)

    def log_prob_entropy(self, params, action):
        return categorical_logp_entropy(params, action)

    def mode(self, params):
        return params.argmax(-1)


class DiagGaussian(ActionDistribution):
    """Box(shape): params are means [B, A] (A = prod(shape)) of a diagonal Gaussian whose log-std [A] is a
    free parameter, independent of the state (Schulman et al. 2017, PPO's continuous-control policy). The
    sample is unclipped (its log-prob is exact); the env steps with it clipped to the bounds."""

    kind = "box"
    numpy_kind = "gaussian"

    def __init__(self, spec: EnvSpec, *, init_log_std: float = 0.0):
        super().__init__()
        self.param_dim = int(torch.Size(spec.action_shape).numel())
        self.log_std = nn.Parameter(torch.full((self.param_dim,), float(init_log_std)))

    def sample(self, params, deterministic, generator=None):
        return gaussian_sample(params, self.log_std, deterministic, generator)

    def log_prob_entropy(self, params, action):
        return gaussian_logp_entropy(params, self.log_std, action.reshape(params.shape))

    def mode(self, params):
        return params


ACTION_DISTRIBUTIONS: dict[str, type[ActionDistribution]] = {}


def register_action_distribution(cls: type[ActionDistribution]) -> type[ActionDistribution]:
    """Make ``cls`` the distribution for action spaces of kind ``cls.kind`` (usable as a class decorator)."""
    ACTION_DISTRIBUTIONS[cls.kind] = cls
    return cls


for _cls in (Categorical, DiagGaussian):
    register_action_distribution(_cls)


def make_action_distribution(spec: EnvSpec, *, init_log_std: float = 0.0) -> ActionDistribution:
    """The registered distribution for ``spec``'s action space."""
    cls = ACTION_DISTRIBUTIONS.get(spec.action_kind)
    if cls is None:
        raise ConfigError(f"env.id={spec.env_id}: no policy head for {spec.describe()} actions "
                          f"(registered: {', '.join(ACTION_DISTRIBUTIONS)})")
    return cls(spec, init_log_std=init_log_std)
