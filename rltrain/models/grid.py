"""The ``grid`` encoder: integer grids of object indices (MiniGrid's 7x7x3 ``(object, colour, state)`` view,
board games, gridworlds), embedded per cell instead of scaled as pixels.

Dividing an index by 255 as if it were brightness makes neighbouring indices (a wall and a door) nearly equal
inputs and squeezes every index into [0, 0.03]. Each channel's value instead selects a learned vector (an
embedding: a one-hot times a matrix, as BabyAI's "bag of words" cell encoding, Chevalier-Boisvert et al. 2019),
the cells' vectors form a feature map, and two 3x3 convolutions (16 and 32 channels, padded: any grid size) and
a Linear follow.

The rule ``model.encoder=auto`` applies (``is_index_grid``): an image-shaped Box (3-D, channels <= 16 first or
last) of an integer dtype (not bool) whose largest value is at most ``MAX_INDEX`` (32), or whose sides are at
most ``MAX_SIDE`` (16) cells: pixels are larger than that and take values up to 255. Override it for the
whole observation with ``model.encoder=nature|minatar|impala|mlp|grid``, per Dict key with
``model.key_encoders={image: nature}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from rltrain.data.structs import ObsSpace
from rltrain.models.encoders import Encoder, image_layout, register_encoder
from rltrain.models.layers import layer_init

if TYPE_CHECKING:
    from rltrain.models.settings import ModelSettings

MAX_INDEX = 32  # an integer image whose values stay <= this holds indices, not brightness
MAX_SIDE = 16  # ... or whose sides are this small (MiniGrid's view is 7x7 with a uint8 high of 255)
EMBED_DIM = 8  # per channel: BabyAI uses 128 for a whole cell over 3 channels; 8 each suffices for small vocabularies
CONV_CHANNELS = (16, 32)
DEFAULT_FEATURES = 128


def is_index_grid(obs: ObsSpace) -> bool:
    """The ``auto`` rule (module docstring): integer, image-shaped, and small in values or in size."""
    layout = image_layout(obs.shape) if obs.kind == "box" else None
    if layout is None or obs.dtype == "bool" or not obs.dtype.startswith(("uint", "int")):
        return False
    h, w = (obs.shape[0], obs.shape[1]) if layout == "hwc" else (obs.shape[1], obs.shape[2])
    return (obs.high is not None and obs.high <= MAX_INDEX) or max(h, w) <= MAX_SIDE


class GridEncoder(Encoder):
    """Integer grid [B, H, W, C] or [B, C, H, W] -> per-channel embeddings [B, C*E, H, W] -> conv 3x3 (16),
    conv 3x3 (32), ReLUs -> Linear(features) -> ReLU: [B, features]. Values outside [0, vocabulary) are clipped
    (a Box's bounds are a promise an env may break)."""

    def __init__(self, obs: ObsSpace, *, features: int = DEFAULT_FEATURES):
        super().__init__()
        layout = image_layout(obs.shape)
        if layout is None:
            raise ValueError(f"GridEncoder needs an image-shaped observation, got {obs.shape}")
        self.hwc = layout == "hwc"
        c, h, w = (obs.shape[2], obs.shape[0], obs.shape[1]) if self.hwc else tuple(obs.shape)
        self.vocab = 256 if obs.high is None or obs.high > 255 else obs.high + 1
        self.embed = nn.Embedding(c * self.vocab, EMBED_DIM)  # one table, channel k's values offset by k * vocab
        self.register_buffer("offsets", torch.arange(c) * self.vocab, persistent=False)
        layers: list[nn.Module] = []
        last = c * EMBED_DIM
        for width in CONV_CHANNELS:
            layers += [layer_init(nn.Conv2d(last, width, 3, padding=1)), nn.ReLU()]
            last = width
        self.convs = nn.Sequential(*layers)
        self.fc = layer_init(nn.Linear(last * h * w, features))
        self.out_dim = features

    def encode(self, obs: Tensor) -> Tensor:  # type: ignore[override]
        x = obs if self.hwc else obs.permute(0, 2, 3, 1)  # [B, H, W, C]
        idx = x.long().clamp_(0, self.vocab - 1) + self.offsets
        cells = self.embed(idx).flatten(3)  # [B, H, W, C * E]
        return torch.relu(self.fc(self.convs(cells.permute(0, 3, 1, 2)).flatten(1)))


def grid_encoder(obs: ObsSpace, settings: ModelSettings) -> GridEncoder:
    return GridEncoder(obs, features=settings.cnn_features or DEFAULT_FEATURES)


register_encoder("grid", grid_encoder, auto_when=is_index_grid)
