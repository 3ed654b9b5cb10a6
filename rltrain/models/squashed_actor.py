"""SAC's actor: encoder -> squashed Gaussian head (Haarnoja et al. 2018), over any observation the encoders read.

Checkpoints written before the model family built it (a float-vector ``torso.<i>`` MLP with ``mean`` /
``log_std`` Linears beside it) still load: ``load_state_dict`` renames their keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from rltrain.data.structs import ActOutput, EnvSpec, Policy
from rltrain.errors import ConfigError
from rltrain.models.encoders import Obs, make_encoder
from rltrain.models.heads import SquashedGaussianHead
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

    def export_module(self) -> nn.Module:
        return SquashedMeanActor(self)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(upgrade_flat_actor_keys(state_dict), strict=strict, assign=assign)


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
