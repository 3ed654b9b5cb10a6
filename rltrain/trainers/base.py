"""``Trainer.fit()``: the one template every trainer runs; a trainer supplies placement only.

``fit`` owns what must be the same everywhere: the stop flag (SIGINT / SIGTERM / SIGUSR2 -> checkpoint and
stop at the next safe point), ``seeds.json`` (every seed tree the run uses, written before training starts),
the final ``summary.json`` and the exit code (0 completed, 1 failed, 130/143/140 interrupted by a signal, 3
interrupted for another reason). A trainer fills in two public hooks:

- ``seed_trees()``: the seed trees to record (``{}`` when this process records none, e.g. a rank > 0);
- ``train(stop)``: run the components where they belong (one process, K agents, W ranks, a learner and
  actors) and return the summary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from rltrain.run.seeding import SeedTree, write_seeds
from rltrain.run.signals import StopFlag
from rltrain.run.summary import write_summary
from rltrain.trainers.settings import RunSettings


class Trainer(ABC):
    """Base of every trainer. Subclasses take ``(*, settings, run_dir, **their typed keyword arguments)``."""

    def __init__(self, *, settings: RunSettings, run_dir: Path):
        self.settings, self.run_dir = settings, Path(run_dir)

    def fit(self) -> dict:
        """Train; returns the run summary (also written to ``summary.json`` by the process that owns the run)."""
        stop = StopFlag().install()
        try:
            trees = self.seed_trees()
            if trees:
                self.record_seeds(trees)
            summary = self.train(stop)
        finally:
            stop.uninstall()
        if "exit_code" not in summary:
            status = summary.get("status")
            summary["exit_code"] = stop.exit_code if status == "interrupted" else 1 if status == "failed" else 0
        if self.writes_summary():
            write_summary(self.run_dir, summary)
        return summary

    def record_seeds(self, trees: dict[str, SeedTree]) -> None:
        """(Re)write ``seeds.json`` with ``trees`` (a trainer calls it again when it starts a new worker)."""
        write_seeds(self.run_dir / "seeds.json", self.settings.seed, trees, drawn=self.settings.seed_drawn)

    def writes_summary(self) -> bool:
        """Whether this process writes the run's ``summary.json`` (False on distributed ranks > 0)."""
        return True

    @abstractmethod
    def seed_trees(self) -> dict[str, SeedTree]:
        """The seed trees this run uses, by worker name (recorded in ``seeds.json``)."""

    @abstractmethod
    def train(self, stop: StopFlag) -> dict:
        """Place and run the components; return the summary (``status`` at least)."""
