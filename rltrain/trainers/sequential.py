"""Trainer ``sequential``: one process, one vector env (sync or async), collect -> learn."""

from __future__ import annotations

from rltrain.run.device import pick_device
from rltrain.run.seeding import SeedTree, derive
from rltrain.run.signals import StopFlag
from rltrain.trainers.base import Trainer
from rltrain.trainers.loop import TrainLoop


class SequentialTrainer(Trainer):
    def seed_trees(self) -> dict[str, SeedTree]:
        return {"main": derive(self.settings.seed, self.settings.env.num_envs)}

    def train(self, stop: StopFlag) -> dict:
        s = self.settings
        loop = TrainLoop(s, self.run_dir, seeds=derive(s.seed, s.env.num_envs), device=pick_device(s.device),
                         stop=stop)
        return loop.run()
