"""Encoders: one observation batch -> features [B, F], chosen by observation space.

- Box vectors, Discrete (one-hot) and MultiBinary observations -> an MLP (``hidden_sizes``, ``activation``).
- Box images (3-D, channels first or last) -> a CNN: ``nature`` (Mnih et al. 2015), ``impala`` (Espeholt
  et al. 2018) or ``minatar`` (Young & Tian 2019); ``auto`` picks nature for frames >= 36x36, minatar below.
- Dict -> one encoder per key (CNN for images, flattened / one-hot for the rest), concatenated, then the MLP;
  ``flat=True`` without an image: no MLP, for a network whose own MLP comes next (SAC's critics).

Observations arrive in their stored dtype (uint8 / bool pixels, int Discrete values, float vectors). Every encoder
moves them to its own device and converts there, so pixels cross to an accelerator as bytes: uint8 -> float / 255,
bool and ints -> float. Init: ``layers.layer_init`` (orthogonal, gain sqrt(2) in hidden layers, as CleanRL's).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrain.data.structs import MASK_KEY, ObsSpace
from rltrain.errors import ConfigError, close_matches
from rltrain.models.layers import hidden_mlp, layer_init

if TYPE_CHECKING:
    from rltrain.models.settings import ModelSettings

MAX_CHANNELS = 16  # an image's channel axis is its first or last one, and small (frame stacks, RGB, MinAtar)
Obs = Tensor | dict[str, "Obs"]


def to_float(x: Tensor) -> Tensor:
    """A stored observation -> float32 on its own device: uint8 pixels scaled to [0, 1], the rest cast."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    return x.float()


def batch_layout(x: Tensor) -> Tensor:
    """A stored batch laid out as the CNN encoders read it: CHW images [B, C, H, W] channels-last, copied
    once while still bytes (minibatches gathered from it by indexing stay channels-last, so ``encode`` copies
    no more); anything else as it is."""
    if x.dim() == 4 and image_layout(x.shape[1:]) == "chw":
        return x.contiguous(memory_format=torch.channels_last)
    return x


def image_layout(shape: Sequence[int]) -> Literal["chw", "hwc"] | None:
    """'hwc' or 'chw' for a 3-D observation with a channel-sized (<= 16) first or last axis, else None.

    The channel axis is the smaller of the two ends: 84x84x4 and 10x10x4 are HWC, 4x84x84 is CHW."""
    if len(shape) != 3 or min(shape[0], shape[-1]) > MAX_CHANNELS:
        return None
    return "hwc" if shape[-1] <= shape[0] else "chw"


def has_image(obs: ObsSpace) -> bool:
    """An image observation (3-D, channels first or last), or a Dict / Tuple holding one at any depth."""
    if obs.kind == "box":
        return image_layout(obs.shape) is not None
    return any(has_image(sub) for _, sub in obs.parts)


def shares_torso(shared: bool | str, obs: ObsSpace) -> bool:
    """``model.shared``: true / false as given; auto: one torso for image observations (top-level or a Dict key:
    SB3's PPO / A2C share their features extractor, CleanRL's Atari PPO its CNN), two otherwise."""
    return has_image(obs) if shared == "auto" else bool(shared)


def describe_shape(obs: ObsSpace) -> str:
    return "x".join(str(d) for d in obs.shape) + f" {obs.dtype}"


class Encoder(nn.Module, ABC):
    """Base: ``forward(obs)`` moves the batch to the encoder's device, then ``encode``s it to [B, out_dim]."""

    out_dim: int

    def __init__(self) -> None:
        super().__init__()
        # follows .to(device) and stays out of state_dict: where to move incoming observations
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    def forward(self, obs: Obs) -> Tensor:
        return self.encode(_to_device(obs, self._anchor.device))

    @abstractmethod
    def encode(self, obs: Obs) -> Tensor:
        """obs already on this encoder's device, in its stored dtype -> features [B, out_dim] float32."""


def _to_device(obs: Obs, device: torch.device) -> Obs:
    """Tensors (also inside dicts) to ``device``; anything else (an ignored Text key's strings) stays."""
    if isinstance(obs, dict):
        return {k: _to_device(v, device) for k, v in obs.items()}
    return obs.to(device, non_blocking=True) if isinstance(obs, Tensor) else obs


class FlatInput(Encoder):
    """Box / MultiBinary [B, *shape] -> float [B, prod(shape)]; Discrete [B] -> one-hot float [B, n];
    MultiDiscrete [B, *shape] -> each component one-hot, concatenated: float [B, sum(nvec)]."""

    def __init__(self, obs: ObsSpace):
        super().__init__()
        self.n = obs.n if obs.kind == "discrete" else 0
        self.start = obs.start  # gymnasium's Discrete(n, start=s) takes the values s .. s + n - 1
        self.nvec = obs.nvec if obs.kind == "multi_discrete" else ()
        self.out_dim = self.n or sum(self.nvec) or math.prod(obs.shape)

    def encode(self, obs: Tensor) -> Tensor:  # type: ignore[override]
        if self.n:
            return F.one_hot(obs.long().reshape(-1) - self.start, self.n).float()
        if self.nvec:
            x = obs.long().reshape(obs.shape[0], -1)
            return torch.cat([F.one_hot(x[:, i], n) for i, n in enumerate(self.nvec)], 1).float()
        return to_float(obs.reshape(obs.shape[0], -1))  # [B, ...] -> [B, F]; a scalar Box's [B] too


class MLPEncoder(Encoder):
    """Flattened (or one-hot) observation -> MLP features [B, hidden_sizes[-1]]."""

    def __init__(self, obs: ObsSpace, *, hidden_sizes: Sequence[int], activation: str,
                 last_gain: float = math.sqrt(2)):
        super().__init__()
        self.inp = FlatInput(obs)
        self.mlp, self.out_dim = hidden_mlp(self.inp.out_dim, hidden_sizes, activation, last_gain=last_gain)

    def encode(self, obs: Tensor) -> Tensor:  # type: ignore[override]
        return self.mlp(self.inp.encode(obs))


class ImageEncoder(Encoder):
    """Image [B, H, W, C] or [B, C, H, W] -> conv stack -> Linear(features) -> ReLU: [B, features]."""

    min_side = 1  # the smallest frame side the conv stack accepts

    def __init__(self, obs: ObsSpace, *, features: int):
        super().__init__()
        layout = image_layout(obs.shape)
        assert layout is not None, obs.shape
        self.hwc = layout == "hwc"
        c, h, w = (obs.shape[2], obs.shape[0], obs.shape[1]) if self.hwc else tuple(obs.shape)
        self.convs = self.conv_stack(c)
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, c, h, w)).flatten(1).shape[1]
        self.fc = layer_init(nn.Linear(flat, features))
        self.out_dim = features

    @abstractmethod
    def conv_stack(self, channels: int) -> nn.Sequential:
        """The convolutions (with their ReLUs) from ``channels`` input planes."""

    def encode(self, obs: Tensor) -> Tensor:  # type: ignore[override]
        # The convolutions see a channels-last batch: oneDNN's CPU kernels run forward and backward markedly
        # faster on it than on NCHW (scripts/bench_throughput.py --only pixels). An HWC observation permuted
        # to [B, C, H, W] already is one; a CHW one is re-laid while it is still bytes.
        if self.hwc:
            x = to_float(obs).permute(0, 3, 1, 2)
        else:
            x = to_float(obs.contiguous(memory_format=torch.channels_last))
        return torch.relu(self.fc(self.convs(x).flatten(1)))


class NatureCNN(ImageEncoder):
    """Mnih et al. 2015 (DQN): 32 8x8/4, 64 4x4/2, 64 3x3/1, then Linear 512. Needs frames >= 36x36."""

    min_side = 36
    default_features = 512

    def conv_stack(self, channels: int) -> nn.Sequential:
        return nn.Sequential(layer_init(nn.Conv2d(channels, 32, 8, stride=4)), nn.ReLU(),
                             layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                             layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU())


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convs keeping the shape (Espeholt et al. 2018, fig. 3)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = layer_init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = layer_init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ImageEncoder):
    """Espeholt et al. 2018 (IMPALA, the deep residual encoder): 3 stages of conv 3x3 -> max-pool 3x3/2 ->
    2 residual blocks, with 16, 32, 32 channels; ReLU, then Linear 256. Padded, so any frame size fits."""

    default_features = 256

    def conv_stack(self, channels: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for out in (16, 32, 32):
            layers += [layer_init(nn.Conv2d(channels, out, 3, padding=1)), nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out), ResidualBlock(out)]
            channels = out
        return nn.Sequential(*layers, nn.ReLU())


class MinAtarCNN(ImageEncoder):
    """Young & Tian 2019 (MinAtar): one conv 16 3x3/1, then Linear 128. Needs frames >= 3x3."""

    min_side = 3
    default_features = 128

    def conv_stack(self, channels: int) -> nn.Sequential:
        return nn.Sequential(layer_init(nn.Conv2d(channels, 16, 3, stride=1)), nn.ReLU())


CNNS: dict[str, type[ImageEncoder]] = {"nature": NatureCNN, "impala": ImpalaCNN, "minatar": MinAtarCNN}


@dataclass(frozen=True)
class RegisteredEncoder:
    """A user's encoder: ``factory(obs_space, settings) -> Encoder``, for every image in the observation
    (top-level or a Dict key) with ``images_only``, else for the whole observation space."""

    factory: Callable[[ObsSpace, ModelSettings], Encoder]
    images_only: bool
    auto_when: Callable[[ObsSpace], bool] | None = None  # model.encoder=auto picks it for the images this accepts


REGISTERED: dict[str, RegisteredEncoder] = {}


def register_encoder(name: str, factory: Callable[[ObsSpace, ModelSettings], Encoder], *,
                     images_only: bool = True, auto_when: Callable[[ObsSpace], bool] | None = None) -> None:
    """Make ``model.encoder=<name>`` build ``factory(obs_space, settings)``: an ``Encoder`` subclass (or a
    function returning one) whose ``out_dim`` is its feature width. With ``images_only`` (the default) it
    encodes each image (3-D, channels first or last) as the built-in CNNs do, Dict keys included, and
    everything else keeps its default encoder; otherwise it receives the whole observation space, Dict or
    not. Every algorithm and trainer then uses it; call it from a module listed in ``model.imports`` so
    that worker processes register it too (README "Extending"). ``auto_when(obs_space) -> bool``: also pick it
    under ``model.encoder=auto`` for the images it accepts (models/grid.py: integer index grids)."""
    if name in ("auto", "mlp", *CNNS) or (name in REGISTERED and REGISTERED[name].auto_when is not None):
        raise ValueError(f"register_encoder: {name!r} is a built-in encoder name")
    REGISTERED[name] = RegisteredEncoder(factory, images_only, auto_when)


def encoder_names() -> tuple[str, ...]:
    """Every valid ``model.encoder``: auto, mlp, the built-in CNNs and the registered encoders."""
    return ("auto", "mlp", *CNNS, *REGISTERED)


class MultiInputEncoder(Encoder):
    """Dict observation -> one encoder per key (CNN for images, flattened or one-hot for the rest),
    concatenated in the space's key order, then the MLP over the concatenation (SB3's CombinedExtractor
    layout). Nested Dicts are encoded the same way, their keys named ``outer.inner``; a Tuple arrives as a
    Dict keyed "0", "1", ... (``envs/spaces.py``). The top-level action mask key (``MASK_KEY``) is no input:
    the policy applies it to its logits."""

    def __init__(self, obs: ObsSpace, settings: ModelSettings, *, warn: bool, prefix: str = "",
                 last_gain: float = math.sqrt(2)):
        super().__init__()
        keys, parts = [], []
        for key, sub in obs.parts:
            path = prefix + key
            if path not in settings.ignore_keys and path != MASK_KEY:
                keys.append(key)
                parts.append(_part_encoder(path, sub, settings, warn))
        if not parts:
            raise ConfigError(f"model.ignore_keys={list(settings.ignore_keys)}: drops every observation key "
                              f"({', '.join(k for k, _ in obs.parts)}); keep at least one")
        self.keys = tuple(keys)
        self.parts = nn.ModuleList(parts)
        width = sum(p.out_dim for p in parts)
        hidden = () if prefix else settings.hidden_sizes  # a nested Dict feeds its parent's MLP
        self.mlp, self.out_dim = hidden_mlp(width, hidden, settings.activation, last_gain=last_gain)

    def encode(self, obs: dict[str, Obs]) -> Tensor:  # type: ignore[override]
        return self.mlp(torch.cat([p.encode(obs[k]) for k, p in zip(self.keys, self.parts, strict=True)], 1))


def _part_encoder(path: str, sub: ObsSpace, settings: ModelSettings, warn: bool) -> Encoder:
    if settings.encoder_for(path):  # model.key_encoders={key: name}: this key's encoder, whatever the rule
        settings = dataclasses.replace(settings, encoder=settings.encoder_for(path))
    if sub.kind == "unsupported":
        raise ConfigError(f"model: observation key {path!r} is {sub.name}, which no encoder reads; "
                          f"drop it with model.ignore_keys=[{path}], or wrap the env so that it becomes a Box "
                          "(e.g. env.wrappers=[FlattenObservation] flattens a whole space of fixed size)")
    if sub.kind == "dict":
        return MultiInputEncoder(sub, settings, warn=warn, prefix=path + ".")
    if sub.kind == "box" and image_layout(sub.shape) is not None:
        cnn = _image_encoder(sub, settings, warn=warn, where=f" (observation key {path!r})")
        if cnn is not None:
            return cnn
    return FlatInput(sub)


def image_encoder_name(obs: ObsSpace, encoder: str) -> str:
    """The encoder ``model.encoder`` picks for an image: a registered one, a built-in CNN or mlp (auto: a
    registered rule first, models/grid.py's index grids are not pixels; then by frame size)."""
    if encoder == "auto":
        encoder = next((n for n, r in REGISTERED.items() if r.auto_when is not None and r.auto_when(obs)), "auto")
    if encoder != "auto":
        return encoder
    side = _side(obs)
    return "nature" if side >= NatureCNN.min_side else "minatar" if side >= MinAtarCNN.min_side else "mlp"


def _side(obs: ObsSpace) -> int:
    return min(obs.shape[:2]) if image_layout(obs.shape) == "hwc" else min(obs.shape[1:])


def _image_encoder(obs: ObsSpace, settings: ModelSettings, *, warn: bool, where: str = "") -> Encoder | None:
    """The CNN ``settings.encoder`` names (``auto``: by frame size) for an image, or None for ``mlp``."""
    name = image_encoder_name(obs, settings.encoder)
    if name in REGISTERED:
        return REGISTERED[name].factory(obs, dataclasses.replace(settings, encoder=name))  # type: ignore[return-value]
    side = _side(obs)
    if name == "mlp":
        if warn and side >= NatureCNN.min_side and settings.hidden_sizes:
            pixels = math.prod(obs.shape)
            warnings.warn(f"model.encoder=mlp on {describe_shape(obs)} frames{where}: its first layer alone has "
                          f"{pixels * settings.hidden_sizes[0] + settings.hidden_sizes[0]:,} parameters; "
                          "model.encoder=auto would use a CNN", stacklevel=3)
        return None
    cls = CNNS[name]
    if side < cls.min_side:
        fit = "minatar" if side >= MinAtarCNN.min_side else "mlp"
        raise ConfigError(f"model.encoder={name} needs frames >= {cls.min_side}x{cls.min_side}; got "
                          f"{describe_shape(obs)}{where}: use model.encoder={fit}")
    return cls(obs, features=settings.cnn_features or cls.default_features)


def _key_paths(obs: ObsSpace, prefix: str = "") -> list[str]:
    paths = []
    for key, sub in obs.parts:
        paths.append(prefix + key)
        if sub.kind == "dict":
            paths += _key_paths(sub, prefix + key + ".")
    return paths


def _check_ignore_keys(obs: ObsSpace, ignore_keys: Sequence[str]) -> None:
    if obs.kind != "dict":
        raise ConfigError(f"model.ignore_keys={list(ignore_keys)}: the observation space {obs.name} is not a Dict; "
                          "set model.ignore_keys=[]")
    paths = _key_paths(obs)
    for key in ignore_keys:
        if key not in paths:
            raise ConfigError(f"model.ignore_keys: {key!r} is not an observation key{close_matches(key, paths)} "
                              f"(keys: {', '.join(paths)})")


def reads_flat(obs: ObsSpace, settings: ModelSettings) -> bool:
    """Whether the default encoders read ``obs`` with no weights before the MLP (vectors, Discrete, MultiBinary,
    Dicts of them; no image, no per-key or registered encoder): then it can go flattened, a Dict's keys
    concatenated, straight into a network's own MLP (``make_encoder(flat=True)``), as SB3's CombinedExtractor."""
    return settings.encoder in ("auto", "mlp") and not settings.key_encoders and not has_image(obs)


def make_encoder(obs: ObsSpace, settings: ModelSettings, *, warn: bool = True, last_gain: float = math.sqrt(2),
                 flat: bool = False) -> Encoder:
    """The encoder for an observation space: obs [B, *shape] (or a dict of them) -> features [B, out_dim].

    ``settings.encoder``: auto (by space and frame size), mlp, nature, impala or minatar. A top-level image
    goes through the CNN alone (its Linear is the torso; ``hidden_sizes`` are unused); vectors, Discrete
    and MultiBinary observations through the MLP (``last_gain``: the init gain of its last layer); Dicts as
    ``MultiInputEncoder``. ``warn``: emit the MLP-on-frames warning (off for the second torso of an unshared
    actor-critic). ``flat`` (where ``reads_flat``): no MLP, the observation flattened, a Dict's keys
    concatenated: float [B, D], for a network whose own MLP comes next (SAC's critics over obs ++ action).
    """
    if settings.ignore_keys:
        _check_ignore_keys(obs, settings.ignore_keys)
    for key, _ in settings.key_encoders:
        if obs.kind != "dict" or key not in _key_paths(obs):
            raise ConfigError(f"model.key_encoders: {key!r} is not an observation key ({obs.name}); keys: "
                              f"{', '.join(_key_paths(obs)) if obs.kind == 'dict' else 'none (not a Dict)'}")
    if flat:
        if not reads_flat(obs, settings):
            raise ValueError(f"make_encoder(flat=True): {obs.name} is not read flat (see reads_flat)")
        return MultiInputEncoder(obs, dataclasses.replace(settings, hidden_sizes=()), warn=warn) \
            if obs.kind == "dict" else FlatInput(obs)
    custom = REGISTERED.get(settings.encoder)
    if custom is not None and not custom.images_only:
        return custom.factory(obs, settings)
    if obs.kind == "dict":
        return MultiInputEncoder(obs, settings, warn=warn, last_gain=last_gain)
    if obs.kind == "unsupported":
        raise ConfigError(f"model: observation space {obs.name} has no encoder (Box, Discrete, MultiBinary or Dict)")
    if obs.kind == "box" and image_layout(obs.shape) is not None:
        cnn = _image_encoder(obs, settings, warn=warn)
        if cnn is not None:
            return cnn
    elif settings.encoder in CNNS or settings.encoder in REGISTERED:
        raise ConfigError(f"model.encoder={settings.encoder} needs image observations (3-D, channels <= "
                          f"{MAX_CHANNELS} first or last); got {obs.name}: use model.encoder=mlp")
    return MLPEncoder(obs, hidden_sizes=settings.hidden_sizes, activation=settings.activation, last_gain=last_gain)
