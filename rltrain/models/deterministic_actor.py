"""TD3's and DDPG's networks: a deterministic actor mu(s) = scale * tanh(f(s)) + bias and its critics.

The actor is CleanRL's ``td3_continuous_action`` / ``ddpg_continuous_action`` actor (and SB3's, which squashes
with tanh and rescales to the Box bounds): an MLP, a Linear to the action width, tanh, then the bounds. It
acts deterministically; exploration is Gaussian noise the collector adds to the actions it stores
(``GaussianActionNoise``: Fujimoto et al. 2018, sec. 6.1, N(0, 0.1) in half action ranges), never in evaluation.

Two layouts, as SAC's (models/sac_networks.py, whose critics these are):

- **Separate** (float vectors and Dicts of them): actor and each critic read the observation flattened into
  their own MLP (CleanRL's and SB3's layout).
- **Shared encoder** (observations holding an image, or ``model.shared=true``): one critic encoder read by the
  Q heads; the actor reads its features detached through an MLP trunk of its own (DrQ-v2, Yarats et al. 2021,
  "Mastering Visual Continuous Control": DDPG on images with the encoder trained by the critic only). The
  target networks are a second build whose actor reads the target critic's encoder.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.data.structs import ActOutput, EnvSpec, Policy
from rltrain.models.actor_critic import is_float_vector
from rltrain.models.encoders import Encoder, MLPEncoder, Obs, make_encoder
from rltrain.models.layers import ACTIVATIONS, NumpyActor, hidden_mlp
from rltrain.models.settings import ModelSettings
from rltrain.models.squashed_actor import check_box_actions


class GaussianActionNoise:
    """Exploration noise N(0, sigma) per action dimension, in half action ranges (sigma 0.1 moves an action by
    5% of its range): what the collector adds to a deterministic actor's actions while collecting (CleanRL's
    ``exploration_noise`` times ``action_scale``; SB3's ``NormalActionNoise`` in its [-1, 1] action space).
    Draws come from the collector's seeded generator; it has no state (``x`` is None), so resume stays exact."""

    x = None

    def __init__(self, *, sigma: float, half_range: np.ndarray):
        self.sigma, self.half_range = float(sigma), np.asarray(half_range, np.float32)

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        return (rng.standard_normal(shape).astype(np.float32) * self.sigma * self.half_range).astype(np.float32)

    def reset(self, done: np.ndarray) -> None:
        pass


class DeterministicHead(nn.Module):
    """features [B, F] -> scale * tanh(Linear(features)) + bias [B, A], the Box bounds kept as buffers."""

    def __init__(self, in_dim: int, spec: EnvSpec):
        super().__init__()
        act_dim = torch.Size(spec.action_shape).numel()
        low, high = torch.tensor(spec.action_low).reshape(-1), torch.tensor(spec.action_high).reshape(-1)
        self.mu = nn.Linear(in_dim, act_dim)  # PyTorch's default init, as CleanRL's fc_mu
        self.register_buffer("scale", (high - low) / 2.0)
        self.register_buffer("bias", (high + low) / 2.0)

    def forward(self, features: Tensor) -> Tensor:
        return torch.tanh(self.mu(features)) * self.scale + self.bias


class DeterministicActor(Policy):
    """mu(s) over any observation: the encoder (flat MLP for vectors) then ``DeterministicHead``."""

    samples = False  # act() returns mu(s) in either mode (exploration noise is the collector's)

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, flat_input: bool):
        super().__init__()
        check_box_actions(spec)
        self.spec = spec
        self.encoder: Encoder = make_encoder(spec.observation, settings, last_gain=1.0 if flat_input else math.sqrt(2))
        self.head = DeterministicHead(self.encoder.out_dim, spec)

    def action(self, obs: Obs) -> Tensor:
        """obs [B, ...] (or a dict of them, stored dtype) -> action [B, A] in bounds; differentiable."""
        return self.action_from(obs)

    def action_from(self, features: Obs) -> Tensor:
        """``action`` on what the critic's ``features`` returned: with separate encoders, the observation."""
        return self.head(self.encoder(features))

    def policy_parts(self) -> nn.Module:
        """What the actor's loss trains and its target network follows: all of this network."""
        return self

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        return self.policy_parts().parameters()

    def act(self, obs: Obs, state=None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        """The deterministic action either way (as SB3's TD3 ``predict``): exploration noise is the collector's
        (``action_noise``), added to what it stores, never to what evaluation steps with."""
        action = self.action(obs)
        return ActOutput(action, torch.zeros(action.shape[0], device=action.device))

    def numpy_actor(self) -> DeterministicNumpyActor | None:
        """This actor and its exploration noise in numpy over float vectors on CPU (the collector's fast path);
        None for anything else (an encoder before the MLP, an accelerator)."""
        enc = self.encoder
        if not isinstance(enc, MLPEncoder) or not is_float_vector(self.spec.observation) or \
                self.head.scale.device.type != "cpu":
            return None
        hidden = [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in enc.mlp if isinstance(m, nn.Linear)]
        activation = next((n for n, cls in ACTIVATIONS.items() for m in enc.mlp if isinstance(m, cls)), "relu")
        return DeterministicNumpyActor(hidden, self.head, activation=activation, noise=self.action_noise)

    def export_module(self) -> nn.Module:
        return DeterministicExport(self)


class CriticEncoderDeterministicActor(DeterministicActor):
    """mu(s) on the critic's encoder: features.detach() -> MLP trunk -> ``DeterministicHead`` (DrQ-v2)."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, encoder: Encoder):
        Policy.__init__(self)
        check_box_actions(spec)
        self.spec = spec
        self.encoder = encoder  # the critic's module: one set of weights, in this state_dict too
        self.trunk, width = hidden_mlp(encoder.out_dim, settings.hidden_sizes, settings.activation, last_gain=1.0)
        self.head = DeterministicHead(width, spec)

    def action(self, obs: Obs) -> Tensor:
        return self.action_from(self.encoder(obs))

    def action_from(self, features: Tensor) -> Tensor:
        """The critic's features [B, F] -> action [B, A]; no actor gradient reaches the encoder."""
        return self.head(self.trunk(features.detach()))

    def policy_parts(self) -> nn.Module:
        return nn.ModuleList([self.trunk, self.head])


class DeterministicNumpyActor(NumpyActor):
    """``DeterministicActor`` in ``NumpyActor``'s protocol: ``forward`` gives the bounded action [N, A]; the
    collector's standard-normal noise [..., A] times sigma and the half range is the exploration added to it."""

    def __init__(self, hidden: list[tuple[np.ndarray, np.ndarray]], head: DeterministicHead, *, activation: str,
                 noise: GaussianActionNoise | None):
        mu = head.mu
        super().__init__([*hidden, (mu.weight.detach().numpy().T, mu.bias.detach().numpy())], activation=activation,
                         discrete=False)
        self.scale, self.bias = head.scale.numpy(), head.bias.numpy()
        self.noise_scale = np.float32(0.0) if noise is None else noise.sigma * noise.half_range

    def forward(self, obs: np.ndarray) -> np.ndarray:
        return np.tanh(super().forward(obs.astype(np.float32, copy=False))) * self.scale + self.bias

    def perturb(self, noise: np.ndarray) -> np.ndarray:
        return noise * self.noise_scale

    def action(self, out: np.ndarray, perturbation: np.ndarray) -> np.ndarray:
        return (out + perturbation).astype(np.float32)  # the collector clips it to the bounds

    def log_prob(self, out: np.ndarray, action: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return np.zeros(out.shape[:-1], np.float32)  # a deterministic policy: off-policy learners read none


class DeterministicExport(nn.Module):
    """obs [B, ...] -> mu(obs) [B, *action_shape] (what ``rltrain-export`` traces)."""

    state_names: list[str] = []

    def __init__(self, policy: DeterministicActor):
        super().__init__()
        self.policy = policy
        self.action_shape = tuple(policy.spec.action_shape)

    def forward(self, obs: Obs) -> Tensor:
        action = self.policy.action(obs)
        return action.reshape(action.shape[0], *self.action_shape)


class DeterministicNetworks(nn.Module):
    """The actor and the critic (one or two Q heads) of one TD3 / DDPG learner, built together so that they can
    share the critic's encoder."""

    def __init__(self, actor: DeterministicActor, critic: nn.Module):
        super().__init__()
        self.actor, self.critic = actor, critic
