"""Trainer ``sequential``: one process, one vector env (sync or async), collect -> learn."""

from __future__ import annotations

from rltrain.run.device import pick_device
from rltrain.run.seeding import SeedTree, derive
from rltrain.run.signals import StopFlag
from rltrain.trainers.base import Trainer
from rltrain.trainers.hooks import Placement
from rltrain.trainers.loop import TrainLoop
from rltrain.trainers.settings import SequentialSettings


class SequentialTrainer(Trainer):
    name = "sequential"
    settings_class = SequentialSettings

    def describe(self) -> list[tuple[str, str]]:
        device = f"{self.settings.device} -> {pick_device(self.settings.device)}"
        return [("1 process (this one)", f"collect -> learn on {device}; envs {self.envs_text()}")]

    def seed_trees(self) -> dict[str, SeedTree]:
        return {"main": derive(self.settings.seed, self.settings.env.num_envs)}

    def train(self, stop: StopFlag) -> dict:
        s = self.settings
        place = Placement(self.run_dir, derive(s.seed, s.env.num_envs), pick_device(s.device))
        loop = TrainLoop(s, place, stop)
        return loop.run()
