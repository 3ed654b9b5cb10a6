"""SAC's actor: encoder -> squashed Gaussian head (Haarnoja et al. 2018), over any observation the encoders read.

Checkpoints written before the model family built it (a float-vector ``torso.<i>`` MLP with ``mean`` /
``log_std`` Linears beside it) still load: ``load_state_dict`` renames their keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.data.structs import ActOutput, EnvSpec, Policy
from rltrain.errors import ConfigError
from rltrain.models.actor_critic import is_float_vector
from rltrain.models.encoders import MLPEncoder, Obs, make_encoder
from rltrain.models.heads import LOG_STD_HALF_RANGE, LOG_STD_MID, SquashedGaussianHead, squashed_log_prob_const
from rltrain.models.layers import ACTIVATIONS, NumpyActor
from rltrain.models.settings import ModelSettings


class SquashedGaussianActor(Policy):
    """pi(a|s) = scale * tanh(u) + bias with u ~ N(mu(s), sigma(s)); log-probs include the tanh Jacobian.

    ``flat_input``: vectors (or a Dict of them, concatenated) through an MLP whose last hidden layer has gain 1
    (the init of CleanRL's and our first SAC actor); otherwise the encoder the observation space calls for."""

    detached_encoder = False  # its encoder is its own (models/sac_networks.py: one that reads the critic's)

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, flat_input: bool):
        super().__init__()
        check_box_actions(spec)
        self.spec = spec
        # flat: the MLP reads the flattened observation (a Dict's keys concatenated); its last hidden layer has
        # gain 1, as CleanRL's SAC actor
        self.encoder = make_encoder(spec.observation, settings, last_gain=1.0 if flat_input else math.sqrt(2))
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        self.head = SquashedGaussianHead(self.encoder.out_dim, torch.Size(spec.action_shape).numel(),
                                         low.reshape(-1), high.reshape(-1))

    def sample(self, obs: Obs, *, deterministic: bool = False,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """obs [B, ...] (or a dict of them, stored dtype) -> (action [B, A] in bounds, log_prob [B]);
        differentiable (reparameterised)."""
        return self.head(self.encoder(obs), deterministic=deterministic, generator=generator)

    def sample_from(self, features: Obs, *, deterministic: bool = False,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``sample`` on what the critic's ``features`` returned: with separate encoders, the observation."""
        return self.sample(features, deterministic=deterministic, generator=generator)

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        """What the actor's loss trains: all of this network."""
        return self.parameters()

    def act(self, obs: Obs, state=None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        return ActOutput(*self.sample(obs, deterministic=deterministic, generator=generator))

    def numpy_actor(self) -> SquashedNumpyActor | None:
        """This actor in numpy over float vectors on CPU, for the collector's fast path (a torch forward on one
        observation is mostly per-op overhead); None for anything else (an encoder before the MLP, an
        accelerator, action noise, which the torch path adds)."""
        enc = self.encoder
        if not isinstance(enc, MLPEncoder) or not is_float_vector(self.spec.observation) or \
                self.action_noise is not None or self.head.scale.device.type != "cpu":
            return None
        hidden = [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in enc.mlp if isinstance(m, nn.Linear)]
        activation = next((n for n, cls in ACTIVATIONS.items() for m in enc.mlp if isinstance(m, cls)), "relu")
        return SquashedNumpyActor(hidden, self.head, activation=activation)

    def export_module(self) -> nn.Module:
        return SquashedMeanActor(self)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(upgrade_flat_actor_keys(state_dict), strict=strict, assign=assign)


class SquashedNumpyActor(NumpyActor):
    """``squashed_gaussian_sample`` in numpy (``SquashedGaussianActor.numpy_actor``), in ``NumpyActor``'s protocol:
    ``forward`` gives [N, 2A] (the mean, then the raw log-std), the collector's standard-normal noise [..., 2A]
    moves the action by its first A columns. Views of the weights: one collect, while nothing updates."""

    def __init__(self, hidden: list[tuple[np.ndarray, np.ndarray]], head: SquashedGaussianHead, *, activation: str):
        mean, log_std = head.mean, head.log_std
        out = (np.concatenate([mean.weight.detach().numpy(), log_std.weight.detach().numpy()]).T,
               np.concatenate([mean.bias.detach().numpy(), log_std.bias.detach().numpy()]))
        super().__init__([*hidden, out], activation=activation, discrete=False)
        self.act_dim = mean.out_features
        self.scale, self.bias = head.scale.numpy(), head.bias.numpy()
        self.log_prob_const = squashed_log_prob_const(self.act_dim, head.log_scale_sum)

    def forward(self, obs: np.ndarray) -> np.ndarray:
        return super().forward(obs.astype(np.float32, copy=False))  # as the torch path, which casts first

    def perturb(self, noise: np.ndarray) -> np.ndarray:
        return noise[..., : self.act_dim]

    def _u(self, out: np.ndarray, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu, raw = out[..., : self.act_dim], out[..., self.act_dim:]
        log_std = np.tanh(raw) * LOG_STD_HALF_RANGE + LOG_STD_MID
        return mu + np.exp(log_std) * eps, log_std

    def action(self, out: np.ndarray, perturbation: np.ndarray) -> np.ndarray:
        return (np.tanh(self._u(out, perturbation)[0]) * self.scale + self.bias).astype(np.float32)

    def log_prob(self, out: np.ndarray, action: np.ndarray, noise: np.ndarray) -> np.ndarray:
        eps = self.perturb(noise)
        u, log_std = self._u(out, eps)
        # softplus(x) = logaddexp(0, x)
        logp = (2.0 * (u + np.logaddexp(0.0, -2.0 * u)) - 0.5 * np.square(eps) - log_std).sum(-1) - self.log_prob_const
        return logp.astype(np.float32)


def check_box_actions(spec: EnvSpec) -> None:
    if spec.action_kind != "box":
        raise ConfigError(f"a squashed Gaussian actor needs Box actions; env.id={spec.env_id} has "
                          f"{spec.describe()}: algo=ppo, a2c or impala take any action space, algo=dqn "
                          "Discrete ones")


class SquashedMeanActor(nn.Module):
    """obs [B, ...] -> scale * tanh(mu(obs)) + bias [B, *action_shape] (what ``rltrain-export`` traces)."""

    state_names: list[str] = []

    def __init__(self, policy: SquashedGaussianActor):
        super().__init__()
        self.policy = policy
        self.action_shape = tuple(policy.spec.action_shape)

    def forward(self, obs: Obs) -> Tensor:
        action = self.policy.sample(obs, deterministic=True)[0]
        return action.reshape(action.shape[0], *self.action_shape)


def upgrade_flat_actor_keys(state: dict) -> dict:
    """SAC actor keys from before the model family (``torso.<i>``, ``mean``, ``log_std``, ``scale``, ``bias``)
    -> ``encoder.mlp.<i>`` and ``head.*``."""
    if "torso.0.weight" not in state:
        return state
    out = type(state)()
    for key, value in state.items():
        if key.startswith("torso."):
            key = "encoder.mlp." + key[len("torso."):]
        elif key.split(".")[0] in ("mean", "log_std", "scale", "bias"):
            key = "head." + key
        out[key] = value
    return out
