"""The parts of DQN's family of Q-networks beyond one Linear per action: dueling streams, distributional
outputs (C51's atom logits, QR-DQN's quantiles), factorised noisy layers and a LayerNorm MLP (PQN's).

``QHeadOptions`` says which; ``QNetwork`` (q_networks.py) assembles them on the model family's encoder. Every
head returns the raw outputs ``[B, A, K]`` (K = 1: plain Q-values; K atoms: C51's logits; K quantiles: QR-DQN's
values) and ``q_values`` turns them into Q [B, A] (the atoms' expectation, the quantiles' mean), which is what
acting, evaluation and export act greedily on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrain.data.structs import ObsSpace
from rltrain.errors import ConfigError
from rltrain.models.encoders import Encoder, FlatInput
from rltrain.models.layers import ACTIVATIONS, layer_init

DISTRIBUTIONAL = ("none", "c51", "qr")


@dataclass(frozen=True, kw_only=True)
class QHeadOptions:
    """What the Q-network outputs (DQN's ``algo.dueling``, ``algo.distributional``, ``algo.noisy``; PQN's
    ``layer_norm``). The defaults are DQN's plain head."""

    dueling: bool = False  # value + advantage streams (Wang et al. 2016)
    distributional: str = "none"  # none | c51 (Bellemare et al. 2017) | qr (Dabney et al. 2018)
    atoms: int = 51  # C51's atoms or QR-DQN's quantiles
    v_min: float = -10.0  # C51's support [v_min, v_max]
    v_max: float = 10.0
    noisy: bool = False  # factorised Gaussian noisy layers in the head (Fortunato et al. 2018)
    noisy_sigma0: float = 0.5  # their initial sigma scale (Fortunato et al. 2018, factorised)
    layer_norm: bool = False  # LayerNorm after every hidden Linear of the MLP (PQN, Gallici et al. 2024)

    def __post_init__(self) -> None:
        if self.distributional not in DISTRIBUTIONAL:
            raise ConfigError(f"algo.distributional={self.distributional}: choose none, c51 or qr")
        if self.distributional != "none" and self.atoms < 2:
            raise ConfigError(f"algo.distributional={self.distributional} needs at least 2 atoms / quantiles, "
                              f"got {self.atoms}")
        if self.distributional == "c51" and not self.v_min < self.v_max:
            raise ConfigError(f"algo.v_min={self.v_min}, algo.v_max={self.v_max}: C51's support needs v_min < v_max")

    @property
    def one_linear(self) -> bool:
        """The head is one Linear per action (whatever the encoder)."""
        return not self.dueling and not self.noisy and self.distributional == "none"

    @property
    def outputs(self) -> int:
        """K: outputs per action."""
        return 1 if self.distributional == "none" else self.atoms


class NoisyLinear(nn.Module):
    """y = (mu_w + sigma_w * eps_w) x + mu_b + sigma_b * eps_b with factorised Gaussian noise (Fortunato et al.
    2018, section 3.2): eps_w = f(eps_out) f(eps_in)^T, eps_b = f(eps_out), f(x) = sgn(x) sqrt(|x|). Fresh noise
    at every forward in training mode (one draw per batch, from torch's seeded global generator); in eval mode
    (evaluation, export) the mean weights alone, so the greedy policy is deterministic."""

    def __init__(self, in_dim: int, out_dim: int, *, sigma0: float):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)  # mu ~ U(-1/sqrt(p), 1/sqrt(p)), sigma = sigma0 / sqrt(p) (the paper's)
        self.weight_mu = nn.Parameter(torch.empty(out_dim, in_dim).uniform_(-bound, bound))
        self.bias_mu = nn.Parameter(torch.empty(out_dim).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_dim, in_dim), sigma0 * bound))
        self.bias_sigma = nn.Parameter(torch.full((out_dim,), sigma0 * bound))

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        def f(n: int) -> Tensor:
            e = torch.randn(n, device=x.device)
            return e.sign() * e.abs().sqrt()
        eps_in, eps_out = f(self.weight_mu.shape[1]), f(self.weight_mu.shape[0])
        weight = self.weight_mu + self.weight_sigma * torch.outer(eps_out, eps_in)
        return F.linear(x, weight, self.bias_mu + self.bias_sigma * eps_out)


class LayerNormMLP(Encoder):
    """Flattened (or one-hot) observation -> (Linear -> LayerNorm -> activation) per hidden width: PQN's network
    (Gallici et al. 2024 show LayerNorm keeps TD learning stable without a target network or replay; CleanRL's
    pqn.py: 120, 84 with ReLU)."""

    def __init__(self, obs: ObsSpace, *, hidden_sizes: Sequence[int], activation: str):
        super().__init__()
        self.inp = FlatInput(obs)
        layers: list[nn.Module] = []
        width = self.inp.out_dim
        for out in hidden_sizes:
            layers += [layer_init(nn.Linear(width, out)), nn.LayerNorm(out), ACTIVATIONS[activation]()]
            width = out
        self.mlp = nn.Sequential(*layers)
        self.out_dim = width

    def encode(self, obs: Tensor) -> Tensor:  # type: ignore[override]
        return self.mlp(self.inp.encode(obs))


class NormedFeatures(Encoder):
    """Another encoder's features through a LayerNorm (PQN on images or Dicts: CleanRL's pqn_atari normalises
    every layer of its CNN; here the features the head reads)."""

    def __init__(self, inner: Encoder):
        super().__init__()
        self.inner, self.norm, self.out_dim = inner, nn.LayerNorm(inner.out_dim), inner.out_dim

    def forward(self, obs) -> Tensor:
        return self.norm(self.inner(obs))

    def encode(self, obs) -> Tensor:
        return self.norm(self.inner.encode(obs))


class QHeads(nn.Module):
    """features [B, F] -> raw outputs [B, A, K] (module docstring). Dueling: a value stream [B, 1, K] and an
    advantage stream [B, A, K] combined as V + A - mean_a A (Wang et al. 2016, eq. 9), per atom for C51 (the
    combination happens on the logits, as in Rainbow, Hessel et al. 2018). Each stream is one (noisy) Linear on
    the encoder's features."""

    def __init__(self, in_dim: int, n_actions: int, options: QHeadOptions):
        super().__init__()
        self.n_actions, self.k, self.options = n_actions, options.outputs, options

        def linear(out: int) -> nn.Module:
            if options.noisy:
                return NoisyLinear(in_dim, out, sigma0=options.noisy_sigma0)
            return layer_init(nn.Linear(in_dim, out), 1.0)
        self.advantage = linear(n_actions * self.k)
        self.value = linear(self.k) if options.dueling else None
        if options.distributional == "c51":  # the fixed support z_i (Bellemare et al. 2017, section 4)
            self.register_buffer("support", torch.linspace(options.v_min, options.v_max, options.atoms))

    def forward(self, features: Tensor) -> Tensor:
        out = self.advantage(features).view(-1, self.n_actions, self.k)
        if self.value is not None:
            out = self.value(features).view(-1, 1, self.k) + out - out.mean(1, keepdim=True)
        return out

    def q_values(self, raw: Tensor) -> Tensor:
        """raw [B, A, K] -> Q [B, A]: C51's E_z[p(z)], QR-DQN's mean quantile, else the single output."""
        if self.options.distributional == "c51":
            return (raw.softmax(-1) * self.support).sum(-1)
        if self.options.distributional == "qr":
            return raw.mean(-1)
        return raw.squeeze(-1)
