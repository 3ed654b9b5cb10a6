"""SAC's networks: a twin critic Q1, Q2 over (obs, action) and the squashed Gaussian actor, in one of two layouts.

- **Shared encoder** (``model.shared: auto`` on observations holding an image, top-level or a Dict key; or
  ``model.shared=true``): as SAC-AE (Yarats et al. 2019, "Improving Sample Efficiency in Model-free RL from
  Images", sec. 6) and DrQ (Kostrikov et al. 2020, "Image Augmentation Is All You Need", sec. 3): ONE encoder
  in the critic, read by both Q heads from one forward per batch and trained by the critic's loss only; the
  actor reads its features detached (no actor gradient reaches the encoder) through its own MLP trunk. The
  target critic holds one copy of the encoder, Polyak-averaged with the rest of it. Two CNNs in all (online
  and target) instead of five (actor, both critics, both targets).
- **Separate** (float vectors and Dicts without an image under ``auto``, or ``model.shared=false``): the actor
  and each critic own their encoder, CleanRL's ``sac_continuous_action`` layout (the MLP is the whole network
  for float vectors). Checkpoints keep their ``qf1`` / ``qf2`` names.

The papers tie the convolutions only and give the actor its own projection Linear (+ LayerNorm); here the
actor reads the whole encoder's output (its Linear included) and its trunk is the projection, so one encoder
forward serves both.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from rltrain.data.structs import EnvSpec
from rltrain.errors import ConfigError
from rltrain.models.encoders import Encoder, Obs, make_encoder
from rltrain.models.heads import SquashedGaussianHead
from rltrain.models.layers import hidden_mlp, mlp
from rltrain.models.min_q import fits, on_cpu, twin_min
from rltrain.models.q_networks import ContinuousQNetwork
from rltrain.models.settings import ModelSettings
from rltrain.models.squashed_actor import SquashedGaussianActor, check_box_actions

# the last commit whose SAC on images built one encoder per network (model.shared=false builds that layout)
SEPARATE_ENCODERS_UNTIL = "30d8480"


def holds_separate_encoders(algo_state: dict) -> bool:
    """A SAC checkpoint's ``algo`` state whose critics each own an encoder with weights: written by rltrain up
    to commit ``SEPARATE_ENCODERS_UNTIL`` on images, or with ``model.shared=false``. Float-vector critics
    (``FlatInput``, no weights) and shared-encoder ones (``critic``) are not."""
    return any(k.startswith("encoder.") for k in algo_state.get("qf1") or {})


class SeparateTwinQ(nn.Module):
    """Two ``ContinuousQNetwork``s (``n_critics=1``: one, DDPG's), each with its own encoder: ``features`` is the
    observation itself."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, flat_input: bool, n_critics: int = 2):
        super().__init__()
        self.qf1 = ContinuousQNetwork(spec, settings, flat_input=flat_input)
        if n_critics == 2:
            self.qf2 = ContinuousQNetwork(spec, settings, flat_input=flat_input)
        self.n_critics = n_critics
        # flat encoders have no weights and do the same in both critics: encode obs ++ action once for both MLPs,
        # as SB3's ContinuousCritic does (the same bits, and the same gradient into the action: a sum of two)
        self.one_input = flat_input

    def features(self, obs: Obs) -> Obs:
        return obs  # each Q network encodes the observation itself

    def heads(self, features: Obs, action: Tensor, *, first_only: bool = False) -> tuple[Tensor, ...]:
        """features (here the observation [B, ...]), action [B, A] -> (Q1 [B], Q2 [B]) (or (Q1,): one critic, or
        ``first_only`` for a loss that reads Q1 alone, TD3's actor's: no Q2 forward to throw away)."""
        if self.n_critics == 1 or first_only:
            return (self.qf1(features, action),)
        if self.one_input:
            x = self.qf1.mlp_input(features, action)
            return self.qf1.value(x), self.qf2.value(x)
        return self.qf1(features, action), self.qf2(features, action)

    def min_q(self, features: Obs, action: Tensor) -> Tensor:
        """min(Q1, Q2) [B] with a gradient into the action only (SAC's actor loss): ``models/min_q.py`` on CPU where
        both critics read one input through MLPs it takes, else autograd through both."""
        if self.one_input and self.n_critics == 2 and fits(self.qf1.q) and fits(self.qf2.q) and on_cpu(action):
            return twin_min(self.qf1.mlp_input(features, action), self.qf1.q, self.qf2.q)
        return torch.min(*self.heads(features, action))

    def forward(self, obs: Obs, action: Tensor) -> tuple[Tensor, ...]:
        return self.heads(self.features(obs), action)

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"qf1": self.qf1, "qf2": self.qf2} if self.n_critics == 2 else {"qf1": self.qf1}


class SharedEncoderTwinQ(nn.Module):
    """One encoder, two Q MLPs (``n_critics=1``: one) over its features ++ the action: Q_i = MLP_i(encoder(obs)
    ++ a) [B]."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, n_critics: int = 2):
        super().__init__()
        check_box_actions(spec)
        self.encoder: Encoder = make_encoder(spec.observation, settings)
        width = self.encoder.out_dim + torch.Size(spec.action_shape).numel()
        self.q1 = mlp(width, settings.hidden_sizes, 1, activation=settings.activation)
        if n_critics == 2:
            self.q2 = mlp(width, settings.hidden_sizes, 1, activation=settings.activation)
        self.n_critics = n_critics

    def features(self, obs: Obs) -> Tensor:
        """obs [B, ...] (or a dict of them, stored dtype) -> features [B, F]: the one encoder forward."""
        return self.encoder(obs)

    def mlp_input(self, features: Tensor, action: Tensor) -> Tensor:
        """features [B, F], action [B, A] -> [B, F + A]: what both Q MLPs read."""
        return torch.cat([features, action.to(features.device)], -1)

    def heads(self, features: Tensor, action: Tensor, *, first_only: bool = False) -> tuple[Tensor, ...]:
        """features [B, F], action [B, A] -> (Q1 [B], Q2 [B]) (or (Q1,): one critic, or ``first_only``)."""
        x = self.mlp_input(features, action)
        if self.n_critics == 1 or first_only:
            return (self.q1(x).squeeze(-1),)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def min_q(self, features: Tensor, action: Tensor) -> Tensor:
        """min(Q1, Q2) [B] with a gradient into the action only (SAC's actor loss; ``models/min_q.py`` on CPU)."""
        if self.n_critics == 2 and fits(self.q1) and fits(self.q2) and on_cpu(features):
            return twin_min(self.mlp_input(features, action), self.q1, self.q2)
        return torch.min(*self.heads(features, action))

    def forward(self, obs: Obs, action: Tensor) -> tuple[Tensor, ...]:
        return self.heads(self.features(obs), action)

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        return {"critic": self}


class CriticEncoderActor(SquashedGaussianActor):
    """The squashed Gaussian actor on the critic's encoder: features.detach() -> MLP trunk -> squashed Gaussian.

    ``encoder`` is the critic's own module (one set of weights, shown once in ``model.txt``); the detach means
    the actor's loss trains the trunk and head only (SAC-AE sec. 6: the encoder is updated by the critic only).
    The encoder is part of this module's ``state_dict``, so a checkpoint's ``policy`` acts on its own."""

    detached_encoder = True

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, encoder: Encoder):
        nn.Module.__init__(self)
        check_box_actions(spec)
        self.spec = spec
        self.encoder = encoder
        # gain 1 on the last hidden layer, as the float-vector actor's (CleanRL)
        self.trunk, width = hidden_mlp(encoder.out_dim, settings.hidden_sizes, settings.activation, last_gain=1.0)
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        self.head = SquashedGaussianHead(width, torch.Size(spec.action_shape).numel(), low.reshape(-1),
                                         high.reshape(-1))

    def sample(self, obs: Obs, *, deterministic: bool = False,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        return self.sample_from(self.encoder(obs), deterministic=deterministic, generator=generator)

    def sample_from(self, features: Tensor, *, deterministic: bool = False,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """The critic's features [B, F] -> (action [B, A], log_prob [B]); no gradient flows into them."""
        return self.head(self.trunk(features.detach()), deterministic=deterministic, generator=generator)

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        """What the actor's loss trains: trunk and head, not the critic's encoder."""
        yield from self.trunk.parameters()
        yield from self.head.parameters()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if not any(k.startswith("trunk.") for k in state_dict):
            raise ConfigError(f"a SAC policy with one encoder per network (rltrain up to commit "
                              f"{SEPARATE_ENCODERS_UNTIL} on images) does not fit this run's shared critic "
                              "encoder: resume it with model.shared=false resume_allow_changes=[model.shared] "
                              "(rltrain-eval, rltrain-export and rltrain.load_policy load it as it is)")
        return nn.Module.load_state_dict(self, state_dict, strict=strict, assign=assign)


class SACNetworks(nn.Module):
    """The actor and the twin critic of one SAC learner, built together so that they can share the encoder."""

    def __init__(self, actor: SquashedGaussianActor, critic: SeparateTwinQ | SharedEncoderTwinQ):
        super().__init__()
        self.actor, self.critic = actor, critic
