"""``pick_device``: a device spec (auto, cpu, cuda, cuda:N) -> a ``torch.device``, or one line naming the fix."""

from __future__ import annotations

import torch

from rltrain.errors import ConfigError


def pick_device(spec: str, *, local_rank: int = 0) -> torch.device:
    spec = str(spec)
    if spec == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device={spec}: CUDA is not available (torch {torch.__version__}, "
                              f"torch.cuda.is_available() is False); use device=cpu or device=auto")
        index = local_rank if spec == "cuda" else int(spec.split(":", 1)[1])
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device={spec}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device(f"cuda:{index}")
    raise ConfigError(f"device={spec!r} is not one of: auto, cpu, cuda, cuda:N")
