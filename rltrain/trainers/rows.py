"""``MetricRows``: the loop's metrics rows and the sinks they go to (CSV always; TensorBoard, W&B, MLflow
as ``logger.sinks`` says). Only the main worker opens sinks.

A resumed run truncates ``metrics.csv`` back to its checkpoint's step, and no step is ever logged twice (a
resumed run that had already finished has its last row already).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rltrain.data.structs import Metrics
from rltrain.run.metrics import CSVLogger, MetricLogger, TensorBoardLogger
from rltrain.trainers.hooks import LoopHooks, Placement
from rltrain.trainers.settings import RunSettings

# Sources keep the last 100 episodes (the summary's train_return_last100); the live display, metrics rows and
# target_return use the last 20 so they follow learning closely.
RECENT_EPISODES = 20


class MetricRows:
    def __init__(self, settings: RunSettings, place: Placement, *, counters: dict, source: Any,
                 hooks: LoopHooks):
        self.s, self.place, self.counters, self.source, self.hooks = settings, place, counters, source, hooks
        self.loggers: list[MetricLogger] = []
        self._last_logged = -1  # the highest step any sink has a row for: no step is ever logged twice

    def open(self, *, resumed: bool) -> None:
        run_dir, steps = self.place.run_dir, self.counters["env_steps"]
        csv_logger = CSVLogger(run_dir / "metrics.csv", resume=resumed)
        if resumed:
            csv_logger.truncate_after(steps)
            self._last_logged = csv_logger.last_step()
        self.loggers = [csv_logger]
        lg, seeds, device = self.s.logger, self.place.seeds.to_dict(), str(self.place.device)
        if "tensorboard" in lg.sinks:
            purge = steps + 1 if resumed else None
            self.loggers.append(TensorBoardLogger(run_dir / "tensorboard", purge_step=purge))
        # trackers: one run per process that logs (rank 0; each agent of trainer=parallel opens its own)
        if "wandb" in lg.sinks:
            from rltrain.run.trackers import WandbLogger

            self.loggers.append(WandbLogger(run_dir, config=self.s.config, project=lg.project,
                                            entity=lg.entity, group=lg.group, name=lg.name, tags=lg.tags,
                                            mode=lg.mode, seeds=seeds, device=device, resumed=resumed))
        if "mlflow" in lg.sinks:
            from rltrain.run.trackers import MLflowLogger

            self.loggers.append(MLflowLogger(run_dir, config=self.s.config, project=lg.project,
                                             group=lg.group, name=lg.name, tags=lg.tags,
                                             tracking_uri=lg.tracking_uri, seeds=seeds, device=device,
                                             resumed=resumed))

    def row(self, learn_metrics: Metrics, sps: float) -> Metrics:
        """The columns of one row: time, episode statistics of this worker, the learner's, the trainer's."""
        rets = list(self.source.recent_returns)[-RECENT_EPISODES:]
        lengths = list(self.source.recent_lengths)[-RECENT_EPISODES:]
        c = self.counters
        row: Metrics = {
            "time/wall": c["wall_time"], "time/sps": sps,
            "rollout/episodes": float(c["episodes"]), "train/updates": float(c["updates"]),
            "rollout/episode_return": float(np.mean(rets)) if rets else math.nan,
            "rollout/episode_return_min": float(np.min(rets)) if rets else math.nan,
            "rollout/episode_return_max": float(np.max(rets)) if rets else math.nan,
            "rollout/episode_length": float(np.mean(lengths)) if rets else math.nan,
        }
        successes = list(getattr(self.source, "recent_successes", ()))[-RECENT_EPISODES:]
        if successes:  # goal tasks: the share of recent episodes that ended with info["is_success"]
            row["rollout/success_rate"] = float(np.mean(successes))
        row.update({f"rollout/episode_return/{a}": v for a, v in self.agent_recent().items()})
        row.update(learn_metrics)
        row.update(self.hooks.log_row())
        return row

    def agent_recent(self) -> dict[str, float]:
        """A multi-agent env's recent training return of each agent (the last ``RECENT_EPISODES``); {} else."""
        recent = getattr(self.source, "agent_returns", None) or {}
        return {a: float(np.mean(list(r)[-RECENT_EPISODES:])) for a, r in recent.items() if len(r)}

    def log(self, steps: int, row: Metrics) -> None:
        # a resumed run that had already finished (or stopped right after its last row) has this row already
        if steps <= self._last_logged:
            return
        self._last_logged = steps
        for lg in self.loggers:
            lg.log(steps, row)

    def close(self, summary: dict) -> None:
        for lg in self.loggers:
            lg.close(summary)  # trackers record the summary's numbers as final metrics
