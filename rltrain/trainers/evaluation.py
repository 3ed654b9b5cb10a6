"""``Evaluation``: the loop's evaluations, periodic (on ``eval.every_env_steps``) and final, in one place.

Each runs ``eval.episodes`` episodes on separate envs from the run's eval seed (trainers/episodes.py), each
cut at ``eval.max_episode_steps`` (or the env's time limit, or ``episodes.NO_LIMIT_CAP`` steps: a run never
sits in an evaluation that cannot end; the first cut episode is one warning line),
records the mean and standard deviation of their returns, keeps the best mean (a new best writes the
``best`` checkpoint) and the seconds spent, which the loop leaves out of its training steps/s. A non-finite
return is a failed run: the training guard sees only training rollouts.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from rltrain.algos.base import Algorithm
from rltrain.data.structs import Metrics
from rltrain.envs.vector import counted
from rltrain.run.signals import StopFlag, StopRequested
from rltrain.trainers.episodes import NO_LIMIT_CAP, evaluate
from rltrain.trainers.finite import NonFiniteError, non_finite_line
from rltrain.trainers.settings import RunSettings
from rltrain.trainers.state import LoopState


class Evaluation:
    def __init__(self, settings: RunSettings, state: LoopState, *, algo: Algorithm, eval_seed: int,
                 device: torch.device, run_dir: Path, save_best: Callable[[], object], stop: StopFlag | None = None):
        self.s, self.state, self.algo = settings, state, algo
        self.eval_seed, self.device, self.run_dir = eval_seed, device, run_dir
        self.save_best, self.stop = save_best, stop
        self._warned_cap = False

    def __call__(self, *, final: bool = False) -> Metrics:
        """One evaluation now (``final``: the one at the end, which records the video); its metrics
        columns. A stop request ends it at once: a periodic one returns no columns (the loop then stops at its
        next safe point and checkpoints), the final one raises ``StopRequested``."""
        try:
            with self.stop.raising("the final evaluation" if final else "an evaluation") if self.stop else \
                    contextlib.nullcontext():
                row = self._evaluate(final)
        except StopRequested as err:
            if final or err.now:
                raise
            # owed: the loop checkpoints at this step, and a resume from there runs it before training on
            self.state.eval_owed = self.state.counters["env_steps"]
            return {}
        self.state.eval_owed = None
        mean = row["eval/return_mean"]
        if mean > self.state.best_eval:  # written outside the evaluation: a stop never cuts a checkpoint short
            self.state.best_eval = mean
            self.save_best()
        return row

    def _evaluate(self, final: bool) -> Metrics:
        ev, t0 = self.s.eval, time.perf_counter()
        video = self.run_dir / "videos" if final and ev.video else None
        counters, row = self.state.counters, {}
        # the headline mode first (the one best_eval and the sweepers follow), then the other with
        # eval.both_modes: a greedy policy can score far below the stochastic one it was trained as
        successes: list[bool] = []  # the headline mode's (goal tasks)
        # a policy that draws nothing (TD3's, DDPG's mu(s)) is one mode: evaluated once, its mean is both modes'
        both = ev.both_modes and getattr(self.algo.policy, "samples", True)
        for deterministic in (ev.deterministic, not ev.deterministic)[: 2 if both else 1]:
            capped: list[int] = []
            rets = evaluate(self.algo.policy, counted(self.s.env.make), episodes=ev.episodes,
                            eval_seed=self.eval_seed, deterministic=deterministic, device=self.device,
                            video_dir=video if deterministic == ev.deterministic else None,
                            real_scores=self.s.env.real_scores, max_episode_steps=ev.max_episode_steps,
                            stop=self.stop, capped=capped,
                            successes=successes if deterministic == ev.deterministic else None)
            if capped and not self._warned_cap and ev.max_episode_steps is None:
                self._warned_cap = True
                print(f"rltrain: warning: evaluation episode {capped[0]} reached {NO_LIMIT_CAP} steps and was "
                      f"cut there: env.id={self.s.env.id} has no time limit of its own; set eval.max_episode_steps "
                      "(or env.max_episode_steps for training too)", file=sys.stderr, flush=True)
            mean, std = float(rets.mean()), float(rets.std())
            # a NaN in evaluation only (the guard sees training rollouts) is a failure
            if not math.isfinite(mean):
                bad = int(np.flatnonzero(~np.isfinite(rets))[0])
                raise NonFiniteError(non_finite_line(f"evaluation return={rets[bad]} (eval episode {bad})",
                                                     counters["updates"], counters["env_steps"],
                                                     self.state.last_checkpoint))
            row.setdefault("eval/return_mean", mean)
            row.setdefault("eval/return_std", std)
            if both:
                row[f"eval/return_mean_{'deterministic' if deterministic else 'stochastic'}"] = mean
            elif ev.both_modes:
                row["eval/return_mean_deterministic"] = row["eval/return_mean_stochastic"] = mean
        if successes:
            row["eval/success_rate"] = float(np.mean(successes))
        self.state.last_eval_success = row.get("eval/success_rate")
        mean = row["eval/return_mean"]
        self.state.last_eval = (mean, row["eval/return_std"])
        self.state.last_eval_modes = {k.rpartition("_")[2]: v for k, v in row.items()
                                      if k.startswith("eval/return_mean_")}
        self.state.eval_s += time.perf_counter() - t0
        return row
