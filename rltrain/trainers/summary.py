"""``LoopSummary``: what one loop reports when it ends (completed, interrupted or failed), the dict that
the main worker writes to ``summary.json`` (through ``run/summary.py``) and hands its trackers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from rltrain.algos.base import Algorithm
from rltrain.run.signals import StopFlag
from rltrain.run.summary import resume_command, write_summary
from rltrain.trainers.hooks import LoopHooks, Placement
from rltrain.trainers.rows import SUMMARY_EPISODES, EpisodeWindows, MetricRows
from rltrain.trainers.state import LoopState


class LoopSummary:
    def __init__(self, place: Placement, state: LoopState, *, algo: Algorithm, env_id: str, source: Any,
                 stop: StopFlag, hooks: LoopHooks, rows: MetricRows, windows: EpisodeWindows,
                 deterministic: bool = True):
        self.place, self.state, self.algo, self.env_id, self.windows = place, state, algo, env_id, windows
        self.deterministic = deterministic  # the headline evaluation mode (eval.deterministic)
        self.source, self.stop, self.hooks, self.rows = source, stop, hooks, rows

    def build(self, status: str, *, sps: float, final: tuple[float, float] | None, start_steps: int,
              checkpoint: Path | None, error: str | None) -> dict:
        state, c = self.state, self.state.counters
        recent, _, successes = self.windows.last(SUMMARY_EPISODES)  # every rank's under distributed_simulator
        summary = {
            "status": status,
            "algo": self.algo.name,
            "env_id": self.env_id,
            "seed": self.place.seeds.root,
            "final_eval_return": final[0] if final else None,
            "final_eval_return_std": final[1] if final else None,
            # which mode final_eval_return is (eval.deterministic), and both modes' means (eval.both_modes)
            "final_eval_mode": "deterministic" if self.deterministic else "stochastic",
            "final_eval_return_deterministic": state.last_eval_modes.get("deterministic") if final else None,
            "final_eval_return_stochastic": state.last_eval_modes.get("stochastic") if final else None,
            "best_eval_return": state.best_eval if math.isfinite(state.best_eval) else None,
            # CleanRL's and rl-zoo3's published metric: the mean of the last 100 training episodes (of each rank,
            # pooled, under distributed_simulator)
            "train_return_last100": float(np.mean(recent)) if recent else None,
            "total_env_steps": c["env_steps"],
            "updates": c["updates"],
            "episodes": c["episodes"],
            "wall_time_s": c["wall_time"],
            "sps": sps if math.isfinite(sps) else None,
            "eval_time_s": state.eval_s,  # every evaluation of this session, the final one included
            "solved_at_env_steps": state.solved["env_steps"] if state.solved else None,
            "solved_at_seconds": state.solved["seconds"] if state.solved else None,
            "world_size": self.place.sync.world_size,
            "resumed_from_env_steps": start_steps or None,
            "checkpoint": str(checkpoint) if checkpoint else None,
        }
        if successes:  # goal tasks (info["is_success"]): the success rates beside the returns
            summary["train_success_rate_last100"] = float(np.mean(successes))
        if final and state.last_eval_success is not None:
            summary["final_eval_success_rate"] = state.last_eval_success
        if final and state.eval_summary:  # multi-agent: each agent's return, self-play's win / draw / loss
            summary.update(state.eval_summary)
        if state.resume_changes:
            summary["resume_changes"] = state.resume_changes
        if status == "interrupted":
            summary["stop_reason"] = self.stop.reason
            summary["resume_command"] = resume_command(self.place.run_dir)
        if error:
            summary["error"] = error
        if status == "failed":
            summary["last_checkpoint"] = str(state.last_checkpoint) if state.last_checkpoint else None
        self.hooks.extend_summary(summary, status, algo=self.algo)
        return summary

    def write(self, summary: dict) -> None:
        """``summary.json`` and the trackers' final numbers (main worker); the rollout source is closed."""
        if self.place.is_main:
            write_summary(self.place.run_dir, summary)
            self.rows.close(summary)
        self.source.close()
