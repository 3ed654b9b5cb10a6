"""The training loop every trainer shares: budget, target return, eval / checkpoint / log cadence, resume.

``TrainLoop`` is one worker's loop: the sequential trainer runs one, a parallel agent runs one in its own
process, a distributed rank runs one with an all-reducing ``Sync`` (rank 0 alone writes).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import torch

from rltrain.algos.base import Algorithm, Sync
from rltrain.data.structs import Metrics
from rltrain.envs.make import env_spec, make_env, make_vector_env
from rltrain.run.checkpoint import TRUST_KEY, CheckpointManager, load_checkpoint, sweep_temp_files
from rltrain.run.metrics import CSVLogger, MetricLogger, TensorBoardLogger
from rltrain.run.progress import ProgressDisplay
from rltrain.run.seeding import SeedTree, capture_rng, restore_rng, seed_process
from rltrain.run.signals import StopFlag
from rltrain.run.summary import resume_command, write_summary
from rltrain.trainers.collector import RolloutCollector
from rltrain.trainers.episodes import evaluate


class Trainer(ABC):
    @abstractmethod
    def fit(self) -> dict:
        """Train; returns the run summary (also written to ``summary.json``)."""


class TrainLoop:
    """Collect -> learn until ``total_env_steps``; logs, evaluates and checkpoints on its cadence."""

    def __init__(self, cfg: dict, run_dir: Path, *, seeds: SeedTree, device: torch.device, algo_factory,
                 stop: StopFlag, sync: Sync | None = None, is_main: bool = True, title: str = "training",
                 progress_factory=ProgressDisplay):
        self.cfg, self.run_dir, self.seeds, self.device, self.stop = cfg, Path(run_dir), seeds, device, stop
        self.progress_factory = progress_factory  # the parallel trainer's agents send progress to their parent
        self.sync = sync or Sync()
        self.is_main, self.title = is_main, title
        env_cfg = cfg["env"]
        self.env_kwargs = dict(env_cfg.get("kwargs") or {})
        self.max_episode_steps = env_cfg.get("max_episode_steps")
        seed_process(seeds.torch_seed)
        self.spec = env_spec(make_env(env_cfg["id"], self.env_kwargs, max_episode_steps=self.max_episode_steps),
                             env_cfg["id"])
        self.algo: Algorithm = algo_factory(self.spec, num_envs=env_cfg["num_envs"], device=device, sync=self.sync)
        self.venv, self.collector = self._make_collector(env_cfg)
        self.counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_time": 0.0}
        self.best_eval = -math.inf
        self.last_eval: tuple[float, float] | None = None
        self.solved: dict | None = None
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep_last=cfg["checkpoint"]["keep_last"])
        self.loggers: list[MetricLogger] = []
        self.last_learn: Metrics = {}
        self._sps = math.nan

    def _make_collector(self, env_cfg: dict):
        """This worker's envs and collector (the subprocess_actors learner has neither: actors collect)."""
        venv = make_vector_env(env_cfg["id"], env_cfg["num_envs"], self.seeds.env_seeds, kwargs=self.env_kwargs,
                               max_episode_steps=self.max_episode_steps,
                               vectorization=env_cfg.get("vectorization", "sync"))
        return venv, RolloutCollector(venv, self.algo.policy, self.spec, device=self.device)

    # -- resume -------------------------------------------------------------------------------------------
    def maybe_resume(self) -> Path | None:
        if self.is_main:
            sweep_temp_files(self.run_dir)  # a killed earlier run's temp files and uncommitted sidecars
        spec = self.cfg.get("resume") or "never"
        if spec == "never":
            return None
        if spec == "auto":
            # corrupt ones are skipped out loud; all corrupt refuses rather than restart over the run
            path = self.ckpt.latest(refuse_if_all_corrupt=True)
            if path is None:
                return None
        else:
            path = Path(spec)
        # the envs sidecar is unpickled only if this run dir's run wrote it, or the user opted in
        state, envs_blob = load_checkpoint(path, run_dir=self.run_dir, trust_envs=bool(self.cfg.get(TRUST_KEY)))
        self.algo.load_state_dict(state["algo"])
        self.counters.update(state["counters"])
        self.best_eval = float(state.get("best_eval", -math.inf))
        self.solved = state.get("solved")
        self.collector.load_state_dict(state["collector"], envs_blob)
        restore_rng(state["rng"])  # last: building the objects above consumed RNG draws
        return path

    def checkpoint_state(self) -> dict:
        return {
            "algo": self.algo.state_dict(),
            "counters": dict(self.counters),
            "best_eval": self.best_eval,
            "solved": self.solved,
            "collector": self.collector.state_dict(),
            "rng": capture_rng(),
            "meta": {"algo": self.algo.name, "config": self.cfg, "eval_seed": self.seeds.eval_seed,
                     "env_id": self.spec.env_id},
        }

    def save(self, kind: str = "step") -> Path | None:
        if not self.is_main:
            return None
        envs = self.venv.get_state() if self.venv is not None else None
        return self.ckpt.save(self.checkpoint_state(), self.counters["env_steps"], envs=envs, kind=kind)

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        resumed_from = self.maybe_resume()
        start_steps = self.counters["env_steps"]
        if self.is_main:
            self._open_loggers(resumed=resumed_from is not None)
        total = int(cfg["total_env_steps"])
        every = {k: int(cfg[k]["every_env_steps"] or 0) for k in ("log", "eval", "checkpoint")}
        nxt = {k: _next_multiple(start_steps, e) for k, e in every.items()}
        target = cfg.get("target_return")
        max_wall = cfg.get("max_wall_time_s")
        progress = self._make_progress(total, start_steps)
        t0, wall0 = time.perf_counter(), self.counters["wall_time"]
        sps_t, sps_steps = t0, start_steps
        learn_metrics: Metrics = {}
        status = "completed"
        try:
            while self.counters["env_steps"] < total:
                over_wall = bool(max_wall and time.perf_counter() - t0 >= max_wall)
                # agreed over workers (one tiny all-reduce when distributed): every rank stops at the same update
                if self.sync.any(self.stop.requested or over_wall):
                    if not self.stop.requested:
                        self.stop.request("max_wall_time" if over_wall else "peer_stopped")
                    status = "interrupted"
                    break
                learn_metrics = self._iterate(total) or learn_metrics
                self.counters["wall_time"] = wall0 + time.perf_counter() - t0
                steps = self.counters["env_steps"]
                recent = self._recent_return()
                if target is not None and self.solved is None and recent is not None and recent >= target:
                    self.solved = {"env_steps": steps, "seconds": self.counters["wall_time"]}
                now = time.perf_counter()
                self.last_learn = learn_metrics
                if self.is_main and steps >= nxt["log"] and steps < total and not self.solved:
                    sps = (steps - sps_steps) / max(now - sps_t, 1e-9)
                    sps_t, sps_steps = now, steps
                    self._sps = sps
                    row = self._row(learn_metrics, sps)
                    if recent is not None:  # pooled over workers; min/max/length stay this worker's
                        row["rollout/episode_return"] = recent
                    if every["eval"] and steps >= nxt["eval"]:
                        row.update(self._evaluate())
                        nxt["eval"] = _next_multiple(steps, every["eval"])
                    self._log(steps, row)
                    nxt["log"] = _next_multiple(steps, every["log"])
                if self.is_main:
                    progress.update(steps, sps=(steps - start_steps) / max(now - t0, 1e-9), episode_return=recent)
                if every["checkpoint"] and steps >= nxt["checkpoint"]:
                    self.save()
                    nxt["checkpoint"] = _next_multiple(steps, every["checkpoint"])
                if self.solved:
                    break
        except BaseException as err:
            progress.close()
            self._finish("failed", error=f"{type(err).__name__}: {err}")
            raise
        summary = self._finish(status, start_steps=start_steps, t0=t0)
        progress.close(summary if self.is_main else None)
        return summary

    # -- pieces of the loop -------------------------------------------------------------------------------
    def _iterate(self, total: int) -> Metrics:
        """One collect -> learn step; advances the counters. Returns the learner's metrics."""
        steps = self.counters["env_steps"]
        rollout = self.collector.collect(self.algo.rollout_len, policy_version=self.counters["updates"],
                                         random_actions=self.algo.wants_random_actions(steps))
        learn_metrics = self.algo.learn(rollout, progress=steps / total)
        self.counters["env_steps"] += rollout.num_steps * self.sync.world_size
        self.counters["updates"] += 1
        self.counters["episodes"] = self.collector.episodes
        return learn_metrics

    def _make_progress(self, total: int, start_steps: int) -> ProgressDisplay:
        return self.progress_factory(total, mode=self.cfg["logger"]["progress"] if self.is_main else "off",
                                     interval_s=self.cfg["logger"]["progress_interval_s"], initial=start_steps,
                                     title=self.title)

    def _recent_return(self) -> float | None:
        """Mean of the recent episode returns, pooled over workers (so ranks agree on ``target_return``)."""
        window = self.collector.recent_returns
        total, count = self.sync.sum(np.array([sum(window), len(window)], np.float64))
        return float(total / count) if count else None

    def _row(self, learn_metrics: Metrics, sps: float) -> Metrics:
        rets = list(self.collector.recent_returns)
        row: Metrics = {
            "time/wall": self.counters["wall_time"], "time/sps": sps,
            "rollout/episodes": float(self.counters["episodes"]), "train/updates": float(self.counters["updates"]),
            "rollout/episode_return": float(np.mean(rets)) if rets else math.nan,
            "rollout/episode_return_min": float(np.min(rets)) if rets else math.nan,
            "rollout/episode_return_max": float(np.max(rets)) if rets else math.nan,
            "rollout/episode_length": float(np.mean(self.collector.recent_lengths)) if rets else math.nan,
        }
        row.update(learn_metrics)
        return row

    def _evaluate(self, *, final: bool = False) -> Metrics:
        ecfg = self.cfg["eval"]
        video = self.run_dir / "videos" if final and ecfg.get("video") else None
        rets = evaluate(self.algo.policy, self.spec.env_id, episodes=int(ecfg["episodes"]),
                        eval_seed=self.seeds.eval_seed, deterministic=bool(ecfg["deterministic"]),
                        env_kwargs=self.env_kwargs, max_episode_steps=self.max_episode_steps, device=self.device,
                        video_dir=video)
        mean, std = float(rets.mean()), float(rets.std())
        self.last_eval = (mean, std)
        if mean > self.best_eval:
            self.best_eval = mean
            self.save(kind="best")
        return {"eval/return_mean": mean, "eval/return_std": std}

    def _open_loggers(self, *, resumed: bool) -> None:
        steps = self.counters["env_steps"]
        csv_logger = CSVLogger(self.run_dir / "metrics.csv", resume=resumed)
        if resumed:
            csv_logger.truncate_after(steps)
        self.loggers = [csv_logger]
        if "tensorboard" in self.cfg["logger"]["sinks"]:
            self.loggers.append(TensorBoardLogger(self.run_dir / "tensorboard", purge_step=steps + 1 if resumed else None))

    def _log(self, steps: int, row: Metrics) -> None:
        for lg in self.loggers:
            lg.log(steps, row)

    def _finish(self, status: str, *, start_steps: int = 0, t0: float | None = None, error: str | None = None) -> dict:
        steps = self.counters["env_steps"]
        final: tuple[float, float] | None = None
        elapsed = (time.perf_counter() - t0) if t0 is not None else math.nan
        sps = (steps - start_steps) / elapsed if elapsed and elapsed > 0 else math.nan
        if status == "completed" and self.is_main:
            # the final evaluation always runs (also after an early stop at target_return); its row is the last
            row = self._evaluate(final=True)
            final = (row["eval/return_mean"], row["eval/return_std"])
            self._log(steps, {**self._row(self.last_learn, sps), **row})
        else:
            if self.is_main and status == "interrupted" and self.last_learn:
                self._log(steps, self._row(self.last_learn, sps))
            final = self.last_eval
        ckpt = None
        if self.is_main and status in ("completed", "interrupted"):
            ckpt = self.save(kind="final" if status == "completed" else "step")
        summary = {
            "status": status,
            "algo": self.algo.name,
            "env_id": self.spec.env_id,
            "seed": self.seeds.root,
            "final_eval_return": final[0] if final else None,
            "final_eval_return_std": final[1] if final else None,
            "best_eval_return": self.best_eval if math.isfinite(self.best_eval) else None,
            "total_env_steps": steps,
            "updates": self.counters["updates"],
            "episodes": self.counters["episodes"],
            "wall_time_s": self.counters["wall_time"],
            "sps": sps if math.isfinite(sps) else None,
            "solved_at_env_steps": self.solved["env_steps"] if self.solved else None,
            "solved_at_seconds": self.solved["seconds"] if self.solved else None,
            "world_size": self.sync.world_size,
            "resumed_from_env_steps": start_steps or None,
            "checkpoint": str(ckpt) if ckpt else None,
        }
        if status == "interrupted":
            summary["stop_reason"] = self.stop.reason
            summary["resume_command"] = resume_command(self.run_dir)
        if error:
            summary["error"] = error
        if self.is_main:
            write_summary(self.run_dir, summary)
            for lg in self.loggers:
                lg.close()
        if self.venv is not None:
            self.venv.close()
        return summary


def _next_multiple(steps: int, every: int) -> int:
    return (steps // every + 1) * every if every > 0 else 1 << 62
