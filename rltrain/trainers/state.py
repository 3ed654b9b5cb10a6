"""``LoopState``: what one training loop knows about its run so far, shared by the loop's components.

The counters, the best evaluation and the target-return record travel in every checkpoint (and are
broadcast to the other workers on resume); so do the last update's metrics and the training rate of the last
session that trained (the main worker's only): a resume that takes no step (a finished run, or one stopped in its
final evaluation) ends with the final row and ``sps`` the uninterrupted run ends with; and the step of a periodic
evaluation a stop cut short, which a resume at that step runs first. The rest lives for this session only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


def fresh_counters() -> dict:
    """A run's counters before its first step (a checkpoint stores this dict as it is)."""
    return {"env_steps": 0, "updates": 0, "episodes": 0, "wall_time": 0.0}


@dataclass
class LoopState:
    counters: dict = field(default_factory=fresh_counters)
    best_eval: float = -math.inf
    solved: dict | None = None  # {"env_steps", "seconds"} when the recent return first reached target_return
    last_learn: dict = field(default_factory=dict)  # the latest update's metrics (the final row's loss columns)
    train_sps: float | None = None  # env steps per training second of the last session that took steps
    eval_owed: int | None = None  # the env step of a periodic evaluation a stop cut short: a resume there runs it
    last_eval: tuple[float, float] | None = None  # (mean, std) of the latest evaluation this session
    last_eval_modes: dict = field(default_factory=dict)  # deterministic / stochastic means (eval.both_modes)
    last_eval_success: float | None = None  # goal tasks: the latest evaluation's share of info["is_success"]
    eval_summary: dict = field(default_factory=dict)  # multi-agent: per-agent returns, self-play outcomes
    eval_s: float = 0.0  # seconds in evaluations this session: reported apart, left out of steps/s
    last_checkpoint: Path | None = None  # the newest checkpoint written or resumed from: finite weights
    resumed_from: Path | None = None
    resume_changes: list[str] = field(default_factory=list)  # settings resume_allow_changes let differ
