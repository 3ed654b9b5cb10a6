"""The model factory: every network any algorithm uses comes from ``build(spec, settings, role)``.

    observations -> encoder (by observation space: encoders.py) -> core (cores.py) -> heads (by role and
    action space: distributions.py, heads.py)

Roles:
    actor_critic    PPO, A2C, IMPALA: ``ActorCritic`` (policy distribution by action space + value head)
    q               DQN, Rainbow, PQN: ``QPolicy`` (Q-values per discrete action, epsilon-greedy acting; the head's
                    options, ``q_heads.QHeadOptions``: dueling, C51 / QR-DQN outputs, noisy layers, LayerNorm)
    sac             SAC's actor and twin critic together: ``SACNetworks`` (``.actor``, ``.critic``); on
                    observations holding an image one critic encoder read by both Q heads and, detached, by
                    the actor (SAC-AE / DrQ: models/sac_networks.py); vectors and Dicts of them go flattened
                    into each network's own MLP (``_sac_flat``)
    twin_q          a twin critic alone in the layout ``sac`` picks (SAC's target critic)
    squashed_actor  SAC's actor with its own encoder: ``SquashedGaussianActor``
    deterministic   TD3's and DDPG's actor and critic (``n_critics`` Q heads: 2 for TD3, 1 for DDPG) together:
                    ``DeterministicNetworks``, in the layouts ``sac`` picks (models/deterministic_actor.py)

Every policy it builds is a ``data.structs.Policy``: ``act``, ``initial_state``, ``export_module``, so
evaluation, export and the Python API never ask which class they hold. New parts are registered, not
written into this file: ``encoders.register_encoder`` for an encoder, ``distributions.
register_action_distribution`` for an action space (README "Extending").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import nn

from rltrain.data.structs import EnvSpec
from rltrain.errors import ConfigError
from rltrain.models.actor_critic import ActorCritic, EncoderTorso, TwinMLPTorso, is_float_vector
from rltrain.models.deterministic_actor import (
    CriticEncoderDeterministicActor,
    DeterministicActor,
    DeterministicNetworks,
)
from rltrain.models.encoders import reads_flat, shares_torso
from rltrain.models.q_heads import QHeadOptions
from rltrain.models.q_networks import QPolicy
from rltrain.models.sac_networks import CriticEncoderActor, SACNetworks, SeparateTwinQ, SharedEncoderTwinQ
from rltrain.models.settings import SB3_MLP, ModelSettings
from rltrain.models.squashed_actor import SquashedGaussianActor

__all__ = ["ModelSettings", "build", "is_float_vector", "ROLES"]


def _plain_vector(spec: EnvSpec, settings: ModelSettings) -> bool:
    """Float vectors with the default MLP encoder: the case the fused / flat executions cover."""
    return is_float_vector(spec.observation) and settings.encoder in ("auto", "mlp") and not settings.ignore_keys


def _actor_critic(spec: EnvSpec, settings: ModelSettings, *, norm_obs: bool = False,
                  init_log_std: float = 0.0) -> ActorCritic:
    """Float vectors with separate MLP torsos run as one ``TwinMLPTorso`` (the numpy backend's); anything
    else (images, Dicts, a shared torso, a recurrent core) as ``EncoderTorso``. Same maths either way."""
    # a critic reading keys the actor must not (model.critic_keys) has a torso of its own
    shared = shares_torso(settings.shared, spec.observation) and not settings.critic_keys
    settings = dataclasses.replace(settings, shared=shared)
    twin = _plain_vector(spec, settings) and not settings.shared and settings.core == "identity" and \
        not settings.critic_keys
    return ActorCritic(spec, settings, norm_obs=norm_obs, init_log_std=init_log_std,
                       torso=TwinMLPTorso if twin else EncoderTorso)


def _q(spec: EnvSpec, settings: ModelSettings, **options) -> QPolicy:
    """``options``: the head's (``QHeadOptions``: dueling, distributional, noisy, layer_norm); none: DQN's."""
    return QPolicy(spec, settings, QHeadOptions(**options))


def _sac_flat(spec: EnvSpec, settings: ModelSettings) -> bool:
    """SAC's actor and critics read the observation flattened straight into their MLPs wherever the encoders have
    no weights before the MLP (``reads_flat``: CleanRL's networks on float vectors, SB3's on Dicts of vectors,
    which concatenates them) under ``model.shared=auto``; ``model.shared=false`` keeps one encoder with its MLP
    per network on Dict and Discrete observations (the layout of rltrain up to ``SEPARATE_ENCODERS_UNTIL``)."""
    return reads_flat(spec.observation, settings) if settings.shared == "auto" else _plain_vector(spec, settings)


def _squashed_actor(spec: EnvSpec, settings: ModelSettings) -> SquashedGaussianActor:
    return SquashedGaussianActor(spec, settings, flat_input=_sac_flat(spec, settings))


def _twin_q(spec: EnvSpec, settings: ModelSettings, *, n_critics: int = 2) -> SeparateTwinQ | SharedEncoderTwinQ:
    """``model.shared`` as for an actor-critic (auto: shared for observations holding an image)."""
    if shares_torso(settings.shared, spec.observation):
        return SharedEncoderTwinQ(spec, settings, n_critics=n_critics)
    return SeparateTwinQ(spec, settings, flat_input=_sac_flat(spec, settings), n_critics=n_critics)


def _sac(spec: EnvSpec, settings: ModelSettings) -> SACNetworks:
    if shares_torso(settings.shared, spec.observation):
        critic = _twin_q(spec, settings)
        return SACNetworks(CriticEncoderActor(spec, settings, encoder=critic.encoder), critic)
    # actor first, then the critics: the construction (and RNG) order of the float-vector SAC before the layouts
    actor = _squashed_actor(spec, settings)
    return SACNetworks(actor, _twin_q(spec, settings))


def _deterministic(spec: EnvSpec, settings: ModelSettings, *, n_critics: int = 2) -> DeterministicNetworks:
    if n_critics not in (1, 2):
        raise ConfigError(f"n_critics={n_critics}: 1 (DDPG) or 2 (TD3)")
    if shares_torso(settings.shared, spec.observation):
        critic = _twin_q(spec, settings, n_critics=n_critics)
        return DeterministicNetworks(CriticEncoderDeterministicActor(spec, settings, encoder=critic.encoder), critic)
    actor = DeterministicActor(spec, settings, flat_input=_sac_flat(spec, settings))
    return DeterministicNetworks(actor, _twin_q(spec, settings, n_critics=n_critics))


ROLES: dict[str, Callable[..., nn.Module]] = {
    "actor_critic": _actor_critic, "q": _q, "sac": _sac, "twin_q": _twin_q, "squashed_actor": _squashed_actor,
    "deterministic": _deterministic,
}


def build(spec: EnvSpec, settings: ModelSettings, role: str, **options) -> nn.Module:
    """The network ``role`` needs for ``spec`` (see the module docstring); ``options`` are the role's own
    algorithm hyper-parameters (``norm_obs``, ``init_log_std`` for an actor-critic). An algorithm fills null
    MLP widths / activation with its published ``mlp`` first; called without them, this builds SB3's MLP."""
    make = ROLES.get(role)
    if make is None:
        raise ConfigError(f"model role {role!r}: unknown (roles: {', '.join(ROLES)})")
    settings = settings.with_mlp(*SB3_MLP)
    settings.load_imports()  # a spawned worker receives the settings pickled: register its parts here too
    return make(spec, settings, **options)
