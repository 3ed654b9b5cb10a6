"""``Evaluation``: the loop's evaluations, periodic (on ``eval.every_env_steps``) and final, in one place.

Each runs ``eval.episodes`` episodes on separate envs from the run's eval seed (trainers/episodes.py),
records the mean and standard deviation of their returns, keeps the best mean (a new best writes the
``best`` checkpoint) and the seconds spent, which the loop leaves out of its training steps/s. A non-finite
return is a failed run: the training guard sees only training rollouts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rltrain.algos.base import Algorithm
from rltrain.data.structs import Metrics
from rltrain.envs.vector import counted
from rltrain.trainers.episodes import evaluate
from rltrain.trainers.finite import NonFiniteError, non_finite_line
from rltrain.trainers.settings import RunSettings
from rltrain.trainers.state import LoopState


class Evaluation:
    def __init__(self, settings: RunSettings, state: LoopState, *, algo: Algorithm, eval_seed: int,
                 device: torch.device, run_dir: Path, save_best: Callable[[], object]):
        self.s, self.state, self.algo = settings, state, algo
        self.eval_seed, self.device, self.run_dir = eval_seed, device, run_dir
        self.save_best = save_best

    def __call__(self, *, final: bool = False) -> Metrics:
        """One evaluation now (``final``: the one at the end, which records the video); its metrics
        columns."""
        ev, t0 = self.s.eval, time.perf_counter()
        video = self.run_dir / "videos" if final and ev.video else None
        counters, row = self.state.counters, {}
        # the headline mode first (the one best_eval and the sweepers follow), then the other with
        # eval.both_modes: a greedy policy can score far below the stochastic one it was trained as
        for deterministic in (ev.deterministic, not ev.deterministic)[: 2 if ev.both_modes else 1]:
            rets = evaluate(self.algo.policy, counted(self.s.env.make), episodes=ev.episodes,
                            eval_seed=self.eval_seed, deterministic=deterministic, device=self.device,
                            video_dir=video if deterministic == ev.deterministic else None,
                            real_scores=self.s.env.real_scores)
            mean, std = float(rets.mean()), float(rets.std())
            # a NaN in evaluation only (the guard sees training rollouts) is a failure
            if not math.isfinite(mean):
                bad = int(np.flatnonzero(~np.isfinite(rets))[0])
                raise NonFiniteError(non_finite_line(f"evaluation return={rets[bad]} (eval episode {bad})",
                                                     counters["updates"], counters["env_steps"],
                                                     self.state.last_checkpoint))
            row.setdefault("eval/return_mean", mean)
            row.setdefault("eval/return_std", std)
            if ev.both_modes:
                row[f"eval/return_mean_{'deterministic' if deterministic else 'stochastic'}"] = mean
        mean = row["eval/return_mean"]
        self.state.last_eval = (mean, row["eval/return_std"])
        self.state.last_eval_modes = {k.rpartition("_")[2]: v for k, v in row.items()
                                      if k.startswith("eval/return_mean_")}
        self.state.eval_s += time.perf_counter() - t0
        if mean > self.state.best_eval:
            self.state.best_eval = mean
            self.save_best()
        return row
