"""``ModelSettings``: the ``model`` config group, typed; its fields are the group's schema (cli/schema.py)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import NamedTuple

from rltrain.data.structs import ObsSpace
from rltrain.errors import ConfigError, close_matches, only_with
from rltrain.models.encoders import (
    REGISTERED,
    describe_shape,
    encoder_names,
    has_image,
    image_encoder_name,
    image_layout,
)

ACTIVATION_NAMES = ("tanh", "relu", "elu", "silu")
CORE_NAMES = ("identity", "lstm", "gru")


class MLP(NamedTuple):
    """An algorithm's published MLP (its ``mlp`` class attribute, e.g. PPO's 64x64 tanh): what a null
    ``model.hidden_sizes`` / ``model.activation`` means for it (``ModelSettings.with_mlp``)."""

    hidden_sizes: tuple[int, ...]
    activation: str


SB3_MLP = MLP((64, 64), "tanh")  # SB3's MlpPolicy (net_arch [64, 64], tanh; Schulman et al. 2017's networks):
#                                  PPO's, A2C's and IMPALA's, and what build() uses when called without widths


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The ``model`` config group: the encoder follows the observation space (models/encoders.py).

    encoder auto: an MLP for vectors, Discrete (one-hot) and MultiBinary; for images (3-D, channels first or
    last) the Nature CNN (Mnih et al. 2015) on frames >= 36x36, the MinAtar CNN (Young & Tian 2019) below;
    integer grids of object indices (an integer image-shaped Box with values <= 32 or sides <= 16 cells, e.g.
    MiniGrid's 7x7x3) the grid encoder (models/grid.py); Dict: one encoder per key, concatenated.
    """

    encoder: str = "auto"  # auto | mlp | nature | impala | minatar | grid | a name given to register_encoder.
    #                        Source: rltrain (auto: by observation space, see above)
    hidden_sizes: tuple[int, ...] | None = None  # MLP widths (vector inputs; after a Dict's concatenation);
    #                        null: the algorithm's published width (its ``mlp``: PPO, A2C, IMPALA, IPPO, MAPPO,
    #                        DQN and Rainbow 64x64, SAC 256x256, TD3 and DDPG 400x300, PQN 120x84). Source: SB3
    #                        (MlpPolicy net_arch), Haarnoja et al. 2018 (SAC), Fujimoto et al. 2018 (TD3)
    activation: str | None = None  # tanh | relu | elu | silu, of the MLP layers (CNNs use ReLU as their
    #                        papers do); null: the algorithm's (PPO, A2C, IMPALA, IPPO tanh; DQN, Rainbow, PQN,
    #                        SAC, TD3, DDPG, MAPPO relu). Source: SB3
    cnn_features: int | None = None  # width of a CNN's last Linear; null: the paper's (nature 512, impala 256,
    #                        minatar 128). Source: Mnih et al. 2015, Espeholt et al. 2018, Young & Tian 2019
    shared: bool | str = "auto"  # one torso for actor and critic: auto = shared for images and Dicts holding
    #                        one, separate otherwise; true | false force it. SAC: one critic encoder for both Q
    #                        heads, read detached by the actor. Source: SB3 and CleanRL Atari PPO; SAC-AE, DrQ
    ignore_keys: tuple[str, ...] = ()  # Dict observation keys to drop, e.g. [mission] for a Text key.
    #                        Source: rltrain
    key_encoders: dict[str, str] | tuple[tuple[str, str], ...] = field(default_factory=dict)  # Dict key ->
    #                        the encoder for that key alone, e.g. {image: nature} (pixels) or {board: grid}.
    #                        Source: rltrain
    core: str = "identity"  # identity | lstm | gru: memory between encoder and heads (models/cores.py).
    #                        Source: rltrain
    core_size: int = 128  # hidden width of an lstm / gru core. Source: CleanRL ppo_atari_lstm (LSTM of 128)
    imports: tuple[str, ...] = ()  # modules imported first, in every process: your register_encoder /
    #                        register_action_distribution calls (docs/contributing.md). Source: rltrain
    critic_keys: tuple[str, ...] = ()  # Dict observation keys only the critic reads, never the actor
    #                        (privileged information: an asymmetric actor-critic, Pinto et al. 2018; MAPPO's
    #                        global state, Yu et al. 2022). Source: rltrain

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

    def unread_keys(self, obs: ObsSpace | None = None, *, mlp_after_image: bool = False) -> dict[str, str]:
        """The keys these values leave unread for the observation ``obs`` (None: not known) -> why: a run names
        the ones the user set in one line each at start (cli/unread.py). ``mlp_after_image``: the algorithm's
        networks put an MLP after a CNN's features (``Algorithm.mlp_after_image``: SAC's and TD3's critics)."""
        unread = {}
        if self.core == "identity":  # make_core builds no recurrent cell to size
            unread["core_size"] = only_with("model.core=lstm or gru", self.core)
        if obs is None:
            return unread
        image = obs.kind == "box" and image_layout(obs.shape) is not None
        name = image_encoder_name(obs, self.encoder) if image else self.encoder
        if name in REGISTERED and not REGISTERED[name].factory.__module__.startswith("rltrain."):
            return unread  # the user's own encoder reads whatever it reads
        if not has_image(obs) or (name == "mlp" and not self.key_encoders):
            unread["cnn_features"] = f"only a CNN uses it, and none encodes this observation ({obs.name or obs.kind})"
        elif image and not mlp_after_image:  # make_encoder: a top-level image goes through its CNN alone
            unread |= dict.fromkeys(("hidden_sizes", "activation"), (
                f"the {describe_shape(obs)} image goes through the {name} CNN alone (its width: "
                "model.cnn_features); only an MLP uses it (vector or Dict observations, model.encoder=mlp)"))
        return unread

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
        """These settings with the MLP widths / activation filled in where they are null: an algorithm passes
        its published ``mlp`` (``PPO.mlp``); ``model.hidden_sizes`` / ``model.activation`` win when set."""
        return dataclasses.replace(self, hidden_sizes=tuple(self.hidden_sizes or hidden_sizes),
                                   activation=self.activation or activation)


def one_of(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value}: unknown{close_matches(str(value), valid)} (valid: {', '.join(valid)})")
