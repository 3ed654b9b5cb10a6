"""Action distributions: a policy's raw outputs [B, P] -> actions, log-probs, entropies, one class per
action-space kind, registered by that kind.

A policy's torso ends in a Linear of width ``param_dim``; the distribution turns those parameters into
actions. Only here does the action space matter, so a new action space is one registered class
(Sample Factory's ``action_distributions`` is the reference idea):

    sample(params, deterministic, generator) -> (action, log_prob [B])
    log_prob_entropy(params, action)         -> (log_prob [B], entropy [B])
    mode(params)                             -> the deterministic action (evaluation, export)

Actions are [B] (Discrete), [B, *action_shape] (MultiDiscrete, MultiBinary) or [B, A] (Box).

They sample without ``torch.distributions`` objects (building one per step costs more than a small
forward): Gumbel-max for categorical actions, ``mean + std * eps`` for Gaussian ones, ``u < sigmoid(l)`` for
Bernoulli ones; ``layers`` holds the maths, shared with the numpy fast path (``layers.NumpyActor`` draws the
same actions from the same noise). MultiDiscrete and MultiBinary have no numpy sampler: their policies act
and learn through torch (``numpy_kind`` None), with the same maths.

Invalid-action masking (Huang & Ontanon 2022, "A Closer Look at Invalid Action Masking in Policy Gradient
Algorithms"): ``mask_logits`` sets illegal logits to the dtype's minimum before any of the above, so an
illegal action has probability 0 when sampling, in the log-prob and in the entropy, and gets no gradient.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
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
    clips_to_bounds = True  # its samples reach the env clipped: bounds far from [-1, 1] want rescaling (preflight)

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


class MultiCategorical(ActionDistribution):
    """MultiDiscrete(nvec): a product of independent categoricals (SB3's MultiCategoricalDistribution, CleanRL's
    ppo_multidiscrete). params are the components' logits concatenated [B, sum(nvec)]; action [B, *nvec shape]
    int64 (offset by the space's ``start``); log-prob and entropy are sums over the components."""

    kind = "multi_discrete"

    def __init__(self, spec: EnvSpec, *, init_log_std: float = 0.0):
        super().__init__()
        self.nvec = tuple(int(n) for n in spec.nvec)
        self.param_dim = sum(self.nvec)
        self.action_shape = tuple(spec.action_shape)
        self.register_buffer("start", torch.tensor(spec.action_start or (0,) * len(self.nvec), dtype=torch.int64),
                             persistent=False)

    def _shape(self, index: Tensor) -> Tensor:
        return (index + self.start).reshape(index.shape[0], *self.action_shape)

    def sample(self, params, deterministic, generator=None):
        picks = [categorical_sample(logits, deterministic, generator) for logits in params.split(self.nvec, -1)]
        index = torch.stack([a for a, _ in picks], -1)
        return self._shape(index), torch.stack([lp for _, lp in picks], -1).sum(-1)

    def log_prob_entropy(self, params, action):
        index = action.reshape(action.shape[0], -1).long() - self.start
        parts = [categorical_logp_entropy(logits, index[:, i])
                 for i, logits in enumerate(params.split(self.nvec, -1))]
        return torch.stack([lp for lp, _ in parts], -1).sum(-1), torch.stack([e for _, e in parts], -1).sum(-1)

    def mode(self, params):
        return self._shape(torch.stack([logits.argmax(-1) for logits in params.split(self.nvec, -1)], -1))


class Bernoulli(ActionDistribution):
    """MultiBinary(shape): independent Bernoullis, one logit each: params [B, prod(shape)]; action
    [B, *shape] int8; log-prob and entropy summed over the bits. The logits start near 0 (p = 1/2)."""

    kind = "multi_binary"

    def __init__(self, spec: EnvSpec, *, init_log_std: float = 0.0):
        super().__init__()
        self.action_shape = tuple(spec.action_shape)
        self.param_dim = int(torch.Size(self.action_shape).numel())

    def _shape(self, bits: Tensor) -> Tensor:
        return bits.to(torch.int8).reshape(bits.shape[0], *self.action_shape)

    def sample(self, params, deterministic, generator=None):
        if deterministic:
            bits = params > 0
        else:
            bits = torch.rand(params.shape, generator=generator, device=params.device) < torch.sigmoid(params)
        logp, _ = self.log_prob_entropy(params, bits)
        return self._shape(bits), logp

    def log_prob_entropy(self, params, action):
        a = action.reshape(params.shape).to(params.dtype)
        # log p(a) = a l - softplus(l); H = softplus(l) - l sigmoid(l): stable for large |l|
        soft = F.softplus(params)
        return (a * params - soft).sum(-1), (soft - params * torch.sigmoid(params)).sum(-1)

    def mode(self, params):
        return self._shape(params > 0)


def mask_logits(params: Tensor, mask: Tensor | None) -> Tensor:
    """params [..., P] with the entries where ``mask`` [..., P] is 0 / False set to the dtype's minimum (a
    finite value: log-softmax stays finite, and 0 * log p = 0 keeps the entropy exact); None: unchanged."""
    if mask is None:
        return params
    legal = mask.to(device=params.device, dtype=torch.bool).reshape(params.shape)
    return params.masked_fill(~legal, torch.finfo(params.dtype).min)


ACTION_DISTRIBUTIONS: dict[str, type[ActionDistribution]] = {}


def register_action_distribution(cls: type[ActionDistribution]) -> type[ActionDistribution]:
    """Make ``cls`` the distribution for action spaces of kind ``cls.kind`` (usable as a class decorator)."""
    ACTION_DISTRIBUTIONS[cls.kind] = cls
    return cls


for _cls in (Categorical, DiagGaussian, MultiCategorical, Bernoulli):
    register_action_distribution(_cls)


def make_action_distribution(spec: EnvSpec, *, init_log_std: float = 0.0) -> ActionDistribution:
    """The registered distribution for ``spec``'s action space."""
    cls = ACTION_DISTRIBUTIONS.get(spec.action_kind)
    if cls is None:
        raise ConfigError(f"env.id={spec.env_id}: no policy head for {spec.describe()} actions "
                          f"(registered: {', '.join(ACTION_DISTRIBUTIONS)})")
    return cls(spec, init_log_std=init_log_std)
