"""``ModelSettings``: the ``model`` config group, typed (the CLI builds it from ``conf/model/*.yaml``)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass

from rltrain.errors import ConfigError, close_matches
from rltrain.models.encoders import encoder_names

DEFAULT_MLP, DEFAULT_ACTIVATION = (64, 64), "tanh"  # when neither the model group nor the algorithm says
ACTIVATION_NAMES = ("tanh", "relu", "elu", "silu")
CORE_NAMES = ("identity", "lstm", "gru")


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The ``model`` config group.

    encoder:      auto | mlp | nature | impala | minatar | a name given to ``models.register_encoder``
                  (auto: by observation space and frame size)
    hidden_sizes: MLP widths for vector / Discrete / MultiBinary inputs and after a Dict's concatenation
    activation:   of the MLP layers (tanh, relu, elu, silu); CNNs use ReLU as their papers do
    cnn_features: width of a CNN's last Linear; None keeps the paper's (nature 512, impala 256, minatar 128)
    shared:       one torso for actor and critic instead of one each; auto: shared for image observations
                  (top-level or a Dict key: SB3's and CleanRL's Atari PPO share the CNN), separate otherwise;
                  for SAC: one critic encoder read by both Q heads and, detached, by the actor (sac_networks.py)
    ignore_keys:  Dict observation keys to drop (e.g. a Text key no encoder reads)
    key_encoders: Dict observation key -> encoder name for that key alone (``{image: nature}`` reads an
                  integer key as pixels, ``{board: grid}`` as an index grid), overriding ``encoder``
    core:         identity | lstm | gru: the memory between encoder and heads (models/cores.py)
    core_size:    the hidden width of an lstm / gru core
    imports:      modules imported (in every process) before a model is built: where your own
                  ``register_encoder`` / ``register_action_distribution`` calls live (README "Extending")
    critic_keys:  Dict observation keys that only the critic reads, never the actor (privileged information:
                  an asymmetric actor-critic, Pinto et al. 2018; MAPPO's global state, Yu et al. 2022)
    """

    encoder: str = "auto"
    hidden_sizes: tuple[int, ...] | None = None  # None: the algorithm's algo.hidden_sizes
    activation: str | None = None  # None: the algorithm's algo.activation
    cnn_features: int | None = None
    shared: bool | str = "auto"  # True | False | "auto" (resolved by the factory: ``resolve_shared``)
    ignore_keys: tuple[str, ...] = ()
    key_encoders: dict[str, str] | tuple[tuple[str, str], ...] = ()  # stored as sorted (key, name) pairs
    core: str = "identity"
    core_size: int = 128
    imports: tuple[str, ...] = ()
    critic_keys: tuple[str, ...] = ()  # Dict keys only the critic reads (the actor never). Source: rltrain

    def __post_init__(self) -> None:
        # YAML lists arrive as lists: store tuples so the settings stay hashable and immutable
        if self.hidden_sizes is not None:
            object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        object.__setattr__(self, "ignore_keys", tuple(self.ignore_keys))
        object.__setattr__(self, "key_encoders", tuple(sorted(dict(self.key_encoders).items())))
        object.__setattr__(self, "imports", tuple(self.imports))
        object.__setattr__(self, "critic_keys", tuple(self.critic_keys))
        if self.critic_keys and self.shared is True:
            raise ConfigError(f"model.critic_keys={list(self.critic_keys)} needs separate actor and critic torsos "
                              "(the actor must not read them); set model.shared=false")
        self.load_imports()
        one_of("model.encoder", self.encoder, encoder_names())
        for key, name in dict(self.key_encoders).items():
            one_of(f"model.key_encoders.{key}", name, encoder_names())
        if self.activation is not None:
            one_of("model.activation", self.activation, ACTIVATION_NAMES)
        if any(not isinstance(h, int) or isinstance(h, bool) or h <= 0 for h in self.hidden_sizes or ()):
            raise ConfigError(f"model.hidden_sizes={list(self.hidden_sizes)}: every width must be a positive "
                              "integer (e.g. model.hidden_sizes=[64,64])")
        if self.cnn_features is not None and (isinstance(self.cnn_features, bool) or self.cnn_features <= 0):
            raise ConfigError(f"model.cnn_features={self.cnn_features}: must be a positive integer or null")
        if self.shared not in (True, False, "auto"):
            raise ConfigError(f"model.shared={self.shared!r}: true, false or auto")
        one_of("model.core", self.core, CORE_NAMES)
        if isinstance(self.core_size, bool) or not isinstance(self.core_size, int) or self.core_size <= 0:
            raise ConfigError(f"model.core_size={self.core_size}: must be a positive integer")

    def encoder_for(self, key: str) -> str | None:
        """``model.key_encoders``' choice for a Dict key (``outer.inner`` when nested), or None."""
        return dict(self.key_encoders).get(key)  # type: ignore[arg-type]

    def load_imports(self) -> None:
        """Import ``model.imports`` (idempotent): their registrations must exist in every process that builds
        a model, including spawned workers, which receive these settings pickled."""
        for name in self.imports:
            try:
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as err:
                    # a module beside the user: the console script does not put the launch directory on
                    # sys.path (python -m does); Hydra does not change it (hydra.job.chdir=false)
                    if err.name != name.split(".")[0] or os.getcwd() in sys.path:
                        raise
                    sys.path.append(os.getcwd())
                    importlib.import_module(name)
            except ImportError as err:
                raise ConfigError(f"model.imports: cannot import {name!r} ({err}); it must be importable from "
                                  "the directory you run from or installed") from None

    def with_mlp(self, hidden_sizes, activation: str) -> ModelSettings:
        """These settings with the MLP widths / activation filled in where the model group leaves them null:
        an algorithm passes its own ``algo.hidden_sizes`` / ``algo.activation``, so the presets and command
        lines that set them there keep working; ``model.hidden_sizes`` / ``model.activation`` win when set."""
        return dataclasses.replace(self, hidden_sizes=tuple(self.hidden_sizes or hidden_sizes),
                                   activation=self.activation or activation)


def one_of(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value}: unknown{close_matches(str(value), valid)} (valid: {', '.join(valid)})")
