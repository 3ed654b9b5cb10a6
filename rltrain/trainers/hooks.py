"""What a trainer hands ``TrainLoop`` (trainers/loop.py): where the loop runs (``Placement``), what it plugs
in around the fixed loop (``TrainerParts``: the rollout source, the progress display, ``LoopHooks``), and
``to_cpu``. Hooks are given what they need with each call (the algorithm, the counters), never the loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rltrain.algos.base import Algorithm, Sync
from rltrain.data.structs import Metrics, Rollout
from rltrain.run.progress import ProgressDisplay
from rltrain.run.seeding import SeedTree

SourceFactory = Callable[[Algorithm], Any]  # -> RolloutCollector-like: collect(), episodes, recent_returns...


@dataclass(frozen=True)
class Placement:
    """Where one loop runs: its run dir, seeds and device, and its place among its peers (``sync``: the
    all-reducing ``Sync`` of a distributed rank; ``is_main``: the worker that writes the run's files)."""

    run_dir: Path
    seeds: SeedTree
    device: torch.device
    sync: Sync = field(default_factory=Sync)
    is_main: bool = True
    title: str = "training"  # the progress display's name for this loop


class LoopHooks:
    """Public hooks a trainer plugs into ``TrainLoop``; each default does nothing."""

    def check_resume(self, meta: dict, path: Path, *, algo: Algorithm) -> str | None:
        """An error line when the checkpoint at ``path`` cannot continue this run, else None."""
        return None

    def on_resume(self, state: dict) -> None:
        """The checkpoint was restored (main process only): take what the trainer stored in it."""

    def after_learn(self, rollout: Rollout, learn_s: float, *, algo: Algorithm, counters: Mapping) -> None:
        """One update happened on ``rollout`` (``counters`` already advanced)."""

    def log_row(self) -> Metrics:
        """Extra columns for this metrics row."""
        return {}

    def extend_checkpoint(self, state: dict, *, algo: Algorithm) -> None:
        """Add the trainer's own entries to a checkpoint before it is written."""

    def extend_summary(self, summary: dict, status: str, *, algo: Algorithm) -> None:
        """Add the trainer's own entries to the summary before it is written."""


@dataclass
class TrainerParts:
    """What a trainer plugs into the loop. ``source_factory(algo)``: where rollouts come from (None: a
    ``RolloutCollector`` over this worker's vector env); ``progress_factory``: the live display (the
    parallel trainer's agents send theirs to the parent); ``num_envs``: the env columns of one update when
    they are not ``env.num_envs`` (the actors' learner merges several actors' rollouts); ``ends_at``: the env
    step the run ends at, its budget in whole updates (``Trainer.ends_at``), the progress display's total (None:
    ``total_env_steps``); ``updates``: the updates a turn-based run ends after (``Trainer.budget_updates``: its
    updates take fewer turns than ``ends_at`` counts on), None where the env steps end it."""

    hooks: LoopHooks = field(default_factory=LoopHooks)
    source_factory: SourceFactory | None = None
    progress_factory: Callable[..., ProgressDisplay] = ProgressDisplay
    num_envs: int | None = None
    ends_at: int | None = None
    updates: int | None = None


def to_cpu(obj):
    """Tensors (also inside dicts, lists, tuples) moved to the CPU: what crosses a broadcast."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
