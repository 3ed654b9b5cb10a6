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
SUMMARY_EPISODES = 100


class EpisodeWindows:
    """The recent training episodes that the rows, the live return, ``target_return`` and the summary read: this
    worker's rollout source's own; under ``trainer=distributed_simulator`` every rank's, pooled by ``pool`` in the
    all-reduce the loop already makes each iteration, so that a row's mean, min, max and length, and the summary's
    last-100 return, describe the same episodes on every rank (each rank's last n, rank after rank: up to
    n x world_size episodes, as one process's vector envs pool theirs)."""

    def __init__(self, source: Any):
        self.source = source
        self.ranks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None  # per rank, after ``pool``

    def last(self, n: int) -> tuple[list[float], list[float], list[float]]:
        """(returns, lengths, successes) of the last ``n`` episodes (of each rank, once pooled)."""
        if self.ranks is None:
            s = self.source
            return (list(s.recent_returns)[-n:], list(s.recent_lengths)[-n:],
                    list(getattr(s, "recent_successes", ()))[-n:])
        pooled: tuple[list[float], list[float], list[float]] = ([], [], [])
        for windows in self.ranks:
            for out, window in zip(pooled, windows[:3], strict=True):  # then each agent's (``agents``)
                out.extend(window[-n:].tolist())
        return pooled

    def returns(self, n: int) -> list[float]:
        """The returns of ``last(n)`` alone (read every iteration: the live return, ``target_return``)."""
        if self.ranks is None:
            return list(self.source.recent_returns)[-n:]
        return [r for windows in self.ranks for r in windows[0][-n:].tolist()]

    def agents(self, n: int) -> dict[str, list[float]]:
        """A multi-agent env's returns of each agent in ``last(n)``'s episodes ({} else): each agent has an entry
        per episode (self-play: NaN in the seat the learner did not play), so the windows are the same episodes."""
        recent = getattr(self.source, "agent_returns", None) or {}
        if self.ranks is None:
            return {a: list(r)[-n:] for a, r in recent.items()}
        return {a: [x for windows in self.ranks for x in windows[3 + k][-n:].tolist()] for k, a in enumerate(recent)}

    def pool(self, sync: Any, new_episodes: int) -> int:
        """Every rank's last ``SUMMARY_EPISODES`` episodes (and each agent's returns in them), gathered through one
        element-wise sum (each rank writes its own slots); returns ``new_episodes`` summed over the ranks. Every
        rank must call it."""
        size, rank, cap, s = sync.world_size, sync.rank, SUMMARY_EPISODES, self.source
        agents = list((getattr(s, "agent_returns", None) or {}).values())
        windows = (s.recent_returns, s.recent_lengths, getattr(s, "recent_successes", ()), *agents)
        slots = np.zeros((len(windows), size, cap + 1))  # [returns / lengths / successes / agents, rank, (n, ...)]
        for k, window in enumerate(windows):
            values = list(window)[-cap:]
            slots[k, rank, 0] = len(values)
            slots[k, rank, 1:1 + len(values)] = values
        total = sync.sum(np.concatenate([[float(new_episodes)], slots.ravel()]))
        slots = total[1:].reshape(slots.shape)
        self.ranks = [tuple(slots[k, r, 1:1 + int(slots[k, r, 0])] for k in range(len(windows)))  # type: ignore[misc]
                      for r in range(size)]
        return int(total[0])


class MetricRows:
    def __init__(self, settings: RunSettings, place: Placement, *, counters: dict, source: Any,
                 windows: EpisodeWindows, hooks: LoopHooks):
        self.s, self.place, self.counters, self.source, self.hooks = settings, place, counters, source, hooks
        self.windows = windows
        self.loggers: list[MetricLogger] = []
        self._last_logged = -1  # the highest step any sink has a row for: no step is ever logged twice

    def open(self, *, resumed: bool, redo_last: bool = False) -> None:
        """``redo_last``: the resumed checkpoint's own row is written again (its evaluation was cut short)."""
        run_dir, steps = self.place.run_dir, self.counters["env_steps"]
        keep = steps - 1 if redo_last else steps
        csv_logger = CSVLogger(run_dir / "metrics.csv", resume=resumed)
        if resumed:
            csv_logger.truncate_after(keep)
            self._last_logged = csv_logger.last_step()
        self.loggers = [csv_logger]
        lg, seeds, device = self.s.logger, self.place.seeds.to_dict(), str(self.place.device)
        if "tensorboard" in lg.sinks:
            purge = keep + 1 if resumed else None
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
        """The columns of one row: time, the recent episodes' statistics (``EpisodeWindows``: every rank's under
        distributed_simulator), the learner's, the trainer's."""
        rets, lengths, successes = self.windows.last(RECENT_EPISODES)
        c = self.counters
        row: Metrics = {
            "time/wall": c["wall_time"], "time/sps": sps,
            "rollout/episodes": float(c["episodes"]), "train/updates": float(c["updates"]),
            "rollout/episode_return": float(np.mean(rets)) if rets else math.nan,
            "rollout/episode_return_min": float(np.min(rets)) if rets else math.nan,
            "rollout/episode_return_max": float(np.max(rets)) if rets else math.nan,
            "rollout/episode_length": float(np.mean(lengths)) if rets else math.nan,
        }
        if successes:  # goal tasks: the share of recent episodes that ended with info["is_success"]
            row["rollout/success_rate"] = float(np.mean(successes))
        row.update({f"rollout/episode_return/{a}": v for a, v in self.agent_recent().items()})
        row.update(learn_metrics)
        row.update(self.hooks.log_row())
        return row

    def agent_recent(self) -> dict[str, float]:
        """A multi-agent env's recent training return of each agent over the episodes of the headline return (the
        last ``RECENT_EPISODES``; with self-play, the learner's in that seat: the headline is their mean weighted by
        the episodes in each seat); {} else."""
        return {a: float(np.nanmean(w)) for a, w in self.windows.agents(RECENT_EPISODES).items()
                if not np.isnan(w).all()}

    def log(self, steps: int, row: Metrics, *, again: bool = False) -> None:
        """``again``: the resumed step's row, its evaluation (owed after a stop) now run (``open(redo_last)``)."""
        # a resumed run that had already finished (or stopped right after its last row) has this row already
        if steps <= self._last_logged:
            return
        self._last_logged = steps
        for lg in self.loggers:
            lg.log(steps, row, again=again)

    def close(self, summary: dict) -> None:
        for lg in self.loggers:
            lg.close(summary)  # trackers record the summary's numbers as final metrics
