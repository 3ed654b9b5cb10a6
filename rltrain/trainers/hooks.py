"""``LoopHooks``: the public hooks a trainer plugs into ``TrainLoop`` (trainers/loop.py), and ``to_cpu``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rltrain.data.structs import Metrics, Rollout

if TYPE_CHECKING:
    from rltrain.trainers.loop import TrainLoop


class LoopHooks:
    """Public hooks a trainer plugs into ``TrainLoop``; each default does nothing."""

    loop: TrainLoop

    def bind(self, loop: TrainLoop) -> None:
        """Called once by the loop, after the algorithm and the source exist."""
        self.loop = loop

    def check_resume(self, meta: dict, path: Path) -> str | None:
        """An error line when the checkpoint at ``path`` cannot continue this run, else None."""
        return None

    def on_resume(self, state: dict) -> None:
        """The checkpoint was restored (main process only): take what the trainer stored in it."""

    def after_learn(self, rollout: Rollout, learn_s: float) -> None:
        """One update happened on ``rollout`` (counters already advanced)."""

    def log_row(self) -> Metrics:
        """Extra columns for this metrics row."""
        return {}

    def extend_checkpoint(self, state: dict) -> None:
        """Add the trainer's own entries to a checkpoint before it is written."""

    def extend_summary(self, summary: dict, status: str) -> None:
        """Add the trainer's own entries to the summary before it is written."""


def to_cpu(obj):
    """Tensors (also inside dicts, lists, tuples) moved to the CPU: what crosses a broadcast."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
