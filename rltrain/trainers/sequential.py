"""Trainer ``sequential``: one process, one vector env (sync or async), collect -> learn."""

from __future__ import annotations

from rltrain.algos.base import Algorithm
from rltrain.data.structs import EnvSpec
from rltrain.run.device import pick_device
from rltrain.run.seeding import SeedTree, derive, seed_process
from rltrain.run.signals import StopFlag
from rltrain.trainers.base import Trainer
from rltrain.trainers.hooks import Placement, TrainerParts
from rltrain.trainers.loop import TrainLoop
from rltrain.trainers.settings import SequentialSettings


class SequentialTrainer(Trainer):
    name = "sequential"
    settings_class = SequentialSettings
    _algo: Algorithm | None = None  # the loop's algorithm, built by the pre-flight checks (loop_algorithm)

    def describe(self) -> list[tuple[str, str]]:
        device = f"{self.settings.device} -> {pick_device(self.settings.device)}"
        return [("1 process (this one)", f"collect -> learn on {device}; envs {self.envs_text()}")]

    def seed_trees(self) -> dict[str, SeedTree]:
        return {"main": derive(self.settings.seed, self.settings.env.num_envs)}

    def placement(self) -> Placement:
        s = self.settings
        return Placement(self.run_dir, derive(s.seed, s.env.num_envs), pick_device(s.device))

    def loop_algorithm(self, spec: EnvSpec) -> Algorithm:
        """The loop's own algorithm, built as ``TrainLoop`` builds one: this process seeded first, so its
        weights are those any trainer draws from the same seed."""
        place = self.placement()
        seed_process(place.seeds.torch_seed)
        self._algo = self.settings.algo(spec, num_envs=self.settings.env.num_envs, device=place.device)
        return self._algo

    def train(self, stop: StopFlag) -> dict:
        algo, self._algo = self._algo, None  # handed over once: a second fit() builds (and seeds) its own
        parts = TrainerParts(ends_at=self.ends_at(), updates=self.budget_updates())
        loop = TrainLoop(self.settings, self.placement(), stop, parts, algo=algo)
        return loop.run()
