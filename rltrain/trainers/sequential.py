"""Trainer ``sequential``: one process, one vector env (sync or async), collect -> learn."""

from __future__ import annotations

from pathlib import Path

from rltrain.cli.build import algo_factory, pick_device
from rltrain.run.seeding import derive, write_seeds
from rltrain.run.signals import StopFlag
from rltrain.trainers.loop import Trainer, TrainLoop


class SequentialTrainer(Trainer):
    def __init__(self, *, cfg: dict, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)

    def fit(self) -> dict:
        cfg = self.cfg
        device = pick_device(cfg["device"])
        seeds = derive(cfg["seed"], cfg["env"]["num_envs"])
        write_seeds(self.run_dir / "seeds.json", cfg["seed"], {"main": seeds}, drawn=cfg["seed_drawn"])
        stop = StopFlag().install()
        try:
            loop = TrainLoop(cfg, self.run_dir, seeds=seeds, device=device, algo_factory=algo_factory(cfg), stop=stop)
            summary = loop.run()
        finally:
            stop.uninstall()
        summary["exit_code"] = stop.exit_code if summary["status"] == "interrupted" else 0
        return summary
