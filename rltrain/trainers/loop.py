"""The one training loop: collect -> learn until the budget, and the components it calls on its way.

``TrainLoop`` is one worker's loop: the sequential trainer runs one, a parallel agent runs one in its own
process, a distributed rank runs one with an all-reducing ``Sync`` (rank 0 alone writes), the
subprocess_actors learner runs one whose rollouts come from actor processes. Trainers never subclass it:
they say where it runs (``Placement``) and what they plug in (``TrainerParts``: the rollout source, the
progress display, ``LoopHooks``).

The loop only loops. What it calls:

- ``Checkpointing`` (trainers/checkpointing.py): resume once before the first step, checkpoints;
- ``Cadence`` (trainers/cadence.py): when to log, evaluate and checkpoint;
- ``Evaluation`` (trainers/evaluation.py): periodic and final evaluations, the best one;
- ``MetricRows`` (trainers/rows.py): the metrics rows and their sinks;
- ``FiniteGuard`` (trainers/finite.py): the first NaN / inf stops the run in one line;
- ``LoopSummary`` (trainers/summary.py): the summary the run ends with.
"""

from __future__ import annotations

import functools
import math
import time
import traceback
from pathlib import Path

import numpy as np

from rltrain.algos.base import Algorithm
from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import Metrics
from rltrain.envs.deadline import EnvCallAbandoned, EnvFault
from rltrain.errors import ConfigError
from rltrain.run.seeding import seed_process
from rltrain.run.signals import StopFlag, StopRequested, during
from rltrain.trainers.cadence import Cadence
from rltrain.trainers.checkpointing import Checkpointing
from rltrain.trainers.collector import RolloutCollector
from rltrain.trainers.evaluation import Evaluation
from rltrain.trainers.finite import FiniteGuard
from rltrain.trainers.hooks import Placement, TrainerParts
from rltrain.trainers.matches import AgentsEvaluation
from rltrain.trainers.multiagent import MultiAgentCollector
from rltrain.trainers.rows import RECENT_EPISODES, EpisodeWindows, MetricRows
from rltrain.trainers.settings import RunSettings
from rltrain.trainers.state import LoopState
from rltrain.trainers.summary import LoopSummary


class TrainLoop:
    """Collect -> learn until ``total_env_steps``; logs, evaluates and checkpoints on its cadence."""

    def __init__(self, settings: RunSettings, place: Placement, stop: StopFlag,
                 parts: TrainerParts | None = None, *, algo: Algorithm | None = None):
        """``algo``: the loop's algorithm when its trainer built it already (``Trainer.loop_algorithm``: seeded
        and placed as here); None: built here. The env's spec is the one the run probed (``settings.env_spec``)."""
        self.s, self.place, self.stop = settings, place, stop
        parts = parts or TrainerParts()
        self.sync, self.is_main = place.sync, place.is_main
        self.progress_factory, self.hooks = parts.progress_factory, parts.hooks
        self.ends_at = parts.ends_at  # where the run of whole updates ends: the progress display's total
        self.updates = parts.updates  # a turn-based run's budget in updates (TrainerParts.updates)
        with stop.raising("env construction"):  # an env constructor that never returns must not hold a stop
            self.spec = settings.env_spec or settings.env.spec()  # probed here only when nobody handed it on
            if algo is None:
                seed_process(place.seeds.torch_seed)  # before the weights are drawn: same seed, same weights
                algo = settings.algo(self.spec, num_envs=parts.num_envs or settings.env.num_envs,
                                     device=place.device, sync=self.sync)
            self.algo: Algorithm = algo
            self.own_collector = parts.source_factory is None
            self.source = (parts.source_factory or self._collector)(self.algo)
        self.state = LoopState()
        self.counters = self.state.counters
        self.guard = FiniteGuard(self.algo, self.sync, self.state)  # checked after every update
        self.checkpoints = Checkpointing(settings, place, self.state, algo=self.algo, source=self.source,
                                         spec=self.spec, hooks=self.hooks, guard=self.guard)
        evaluation = AgentsEvaluation if isinstance(self.spec, AgentsSpec) else Evaluation
        # save_best holds the checkpointer, not this loop: no loop <-> evaluation cycle that only a collection frees
        self.evaluate = evaluation(settings, self.state, algo=self.algo, eval_seed=place.seeds.eval_seed,
                                   device=place.device, run_dir=place.run_dir,
                                   save_best=functools.partial(self.checkpoints.save, kind="best"), stop=stop)
        self.windows = EpisodeWindows(self.source)  # pooled over ranks by _recent_return where distributed
        self.rows = MetricRows(settings, place, counters=self.counters, source=self.source, windows=self.windows,
                               hooks=self.hooks)
        self.summary = LoopSummary(place, self.state, algo=self.algo, env_id=self.spec.env_id,
                                   source=self.source, stop=stop, hooks=self.hooks, rows=self.rows,
                                   windows=self.windows, deterministic=settings.eval.deterministic)
        watch = getattr(getattr(self.source, "venv", None), "watch", None)
        if watch is not None:  # a stop signal abandons an env call that is stuck (trainers/../envs/vector.py)
            stop.on_stop(watch.abandon)

    def _collector(self, algo: Algorithm) -> RolloutCollector | MultiAgentCollector:
        venv = self.s.env.vector(self.place.seeds.env_seeds)
        if isinstance(self.spec, AgentsSpec):  # a PettingZoo env: its agents' slots (trainers/multiagent.py)
            return MultiAgentCollector(venv, algo.policy, self.spec, device=self.place.device,  # type: ignore[arg-type]
                                       sampling=algo.settings.self_play_sampling)
        return RolloutCollector(venv, algo.policy, self.spec, device=self.place.device, record_values=True)

    def resume(self) -> Path | None:
        """Restore ``settings.resume`` once (``run`` calls it; a trainer may call it earlier)."""
        return self.checkpoints.resume()

    def save(self, kind: str = "step") -> Path | None:
        return self.checkpoints.save(kind)

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> dict:
        s, state = self.s, self.state
        try:
            with self.stop.raising("checkpoint loading"):
                resumed_from = self.resume()
        except StopRequested:
            self.source.close()
            raise
        start_steps = self.counters["env_steps"]
        # episodes are counted over all workers, as env steps are: the run's count at start plus every worker's
        # episodes since (a worker's own collector restarts its count where it was not restored)
        self._episodes_base = (self.counters["episodes"], self.source.episodes)
        # a periodic evaluation a stop cut short at this very step: run now, its row written again whole
        owed = resumed_from is not None and state.eval_owed == start_steps and self.is_main
        if self.is_main:
            self.rows.open(resumed=resumed_from is not None, redo_last=owed)
        total = s.total_env_steps
        cadence = Cadence({"log": s.log.every_env_steps, "eval": s.eval.every_env_steps,
                           "checkpoint": s.checkpoint.every_env_steps}, start_steps)
        progress = self.progress_factory(self.ends_at or total, mode=s.logger.progress if self.is_main else "off",
                                         interval_s=s.logger.progress_interval_s, initial=start_steps,
                                         title=self.place.title,
                                         rate_from=self.algo.learning_starts)
        t0, wall0 = time.perf_counter(), self.counters["wall_time"]
        sps_t, sps_steps = t0, start_steps
        learn_metrics: Metrics = {}
        status = "completed"
        # every rank reads the owed step from the one checkpoint (main clears it as it evaluates): whether the owed
        # evaluation may end the run at once, as it would have ended the uninterrupted one, is agreed by all
        owed_target = s.eval.target_return is not None and resumed_from is not None and \
            state.eval_owed == start_steps
        try:
            if owed:  # inside this session's clock and try: its time counts as an evaluation's, out of steps/s
                row = self.rows.row(state.last_learn, state.train_sps if state.train_sps is not None else math.nan)
                row.update(self.evaluate())
                self._eval_reached_target(row, start_steps)
                self.rows.log(start_steps, row, again=True)
            solved_at_start = owed_target and self.sync.any(state.solved is not None)
            while not solved_at_start and self._budget_left():
                over_wall = bool(s.max_wall_time_s and time.perf_counter() - t0 >= s.max_wall_time_s)
                # agreed over workers (one tiny all-reduce when distributed): every rank stops at the same
                # update
                if self.sync.any(self.stop.requested or over_wall):
                    if not self.stop.requested:
                        self.stop.request("max_wall_time" if over_wall else "peer_stopped")
                    status = "interrupted"
                    break
                # each column keeps its latest value: an off-policy learn() that took no gradient step reports its
                # exploration only, and the row shows the losses of the last one that did (as SB3 logs them)
                learn_metrics = {**learn_metrics, **self._iterate(total, until=min(total, *cadence.next.values()))}
                self.counters["wall_time"] = wall0 + time.perf_counter() - t0
                steps = self.counters["env_steps"]
                recent = self._recent_return()
                if s.target_return is not None and state.solved is None and recent is not None and \
                        recent >= s.target_return:
                    state.solved = {"env_steps": steps, "seconds": self.counters["wall_time"]}
                now = time.perf_counter()
                state.last_learn = learn_metrics
                # an evaluation is due on its own grid, not only where a log row falls (eval.every_env_steps below
                # log.every_env_steps, or log.every_env_steps=0, evaluated at the log rows only, or never): its
                # step gets a row, which is where its columns are written
                log_due = cadence.due("log", steps)
                if self.is_main and (log_due or cadence.due("eval", steps)) and self._budget_left() \
                        and not state.solved:
                    sps = (steps - sps_steps) / max(now - sps_t - state.eval_s, 1e-9)
                    row = self.rows.row(learn_metrics, sps)
                    sps_t, sps_steps = now - state.eval_s, steps  # an evaluation below is not training time
                    if cadence.due("eval", steps):
                        row.update(self.evaluate())
                        cadence.done("eval", steps)
                        self._eval_reached_target(row, steps)
                    self.rows.log(steps, row)
                    if log_due:
                        cadence.done("log", steps)
                # this session's training rate, in every checkpoint from here on: a resume that takes no step says it
                state.train_sps = (steps - start_steps) / max(now - t0 - state.eval_s, 1e-9)
                if self.is_main:
                    progress.update(steps, sps=state.train_sps, episode_return=recent,
                                    per_agent=self.rows.agent_recent() or None)
                if cadence.due("checkpoint", steps):
                    self.save()
                    cadence.done("checkpoint", steps)
                solved = state.solved is not None
                if s.eval.target_return is not None:  # only the main rank evaluates: all stop at the same update
                    solved = self.sync.any(solved)
                if solved:
                    break
        except EnvCallAbandoned as err:
            # a stop came while an env call was stuck: the envs are unusable, the last checkpoint is the way
            # on
            progress.close()
            self.stop.reason = f"{self.stop.reason or 'stop'}: {err}"
            return self._finish("interrupted", start_steps=start_steps, checkpoint=False)
        except StopRequested as err:  # a second Ctrl-C: now, mid-update (no checkpoint of a half-done state)
            progress.close()
            self.stop.reason = f"{err.reason}{during(err)}"
            return self._finish("interrupted", start_steps=start_steps, checkpoint=False)
        except BaseException as err:
            progress.close()
            error = _one_line(err)
            if isinstance(err, EnvFault):  # where in the run, and where the user's traceback is
                error += f" (run at env step {self.counters['env_steps']})"
                error += self._write_traceback(err)
            self._finish("failed", error=error)
            if isinstance(err, EnvFault):
                raise EnvFault(error, env_index=err.env_index, env_step=err.env_step) from err
            raise
        try:
            summary = self._finish(status, start_steps=start_steps)
        except BaseException as err:  # the final evaluation (a NaN return) or the final checkpoint failed
            progress.close()
            self._finish("failed", error=_one_line(err))
            raise
        progress.close(summary if self.is_main else None)
        return summary

    def _iterate(self, total: int, *, until: int) -> Metrics:
        """One collect -> learn step; advances the counters. Returns the learner's metrics. ``until``: the env
        step of the loop's next log / evaluation / checkpoint, or the budget's end."""
        steps = self.counters["env_steps"]
        # an off-policy learner may let the loop collect the rollouts up to its next update in one go, then learn
        # from them as from each in turn (Algorithm.rollouts_to_collect, learn_collected): only this loop's own
        # collector collects so, and not where a training return may end the run at any step (target_return)
        rollouts = 1 if self.s.target_return is not None or not self.own_collector else \
            self.algo.rollouts_to_collect(steps, until=until, total=total)
        rollout = self.source.collect(self.algo.rollout_len * rollouts, policy_version=self.counters["updates"],
                                      random_actions=self.algo.wants_random_actions(steps))
        if rollout is None:  # the source stopped (e.g. an actor failure requested the stop)
            return {}
        update, at_step = self.counters["updates"] + rollouts, steps + rollout.num_steps * self.sync.world_size
        self.guard.check_rollout(rollout, update, at_step)
        t0 = time.perf_counter()
        # an overflow is reported by the guard below, in one line, not as warnings
        with np.errstate(all="ignore"):
            if rollouts == 1:
                learn_metrics = self.algo.learn(rollout, progress=steps / total)
            else:  # at the progress of the last of them, where its own learn() would have been called
                last = steps + (at_step - steps) // rollouts * (rollouts - 1)
                learn_metrics = self.algo.learn_collected(rollout, rollouts=rollouts, progress=last / total)
        learn_s = time.perf_counter() - t0
        self.guard.check_update(learn_metrics, update, at_step)
        self.counters["env_steps"] += rollout.num_steps * self.sync.world_size
        self.counters["updates"] += rollouts  # rollouts learned from
        self.hooks.after_learn(rollout, learn_s, algo=self.algo, counters=self.counters)
        return learn_metrics

    def _budget_left(self) -> bool:
        """Whether the budget holds another update: its env steps, and a turn-based run's whole updates
        (``TrainerParts.updates``: its updates take fewer turns than announced, so its turns alone would add one)."""
        return self.counters["env_steps"] < self.s.total_env_steps and \
            (self.updates is None or self.counters["updates"] < self.updates)

    def _eval_reached_target(self, row: Metrics, steps: int) -> None:
        """``eval.target_return``: the first evaluation that reaches it ends the run (as ``target_return``
        does for the training return); the final evaluation repeats it (same weights, same eval seeds)."""
        target = self.s.eval.target_return
        if target is not None and self.state.solved is None and row.get("eval/return_mean", -math.inf) >= target:
            self.state.solved = {"env_steps": steps, "seconds": self.counters["wall_time"]}

    def _recent_return(self) -> float | None:
        """Mean of the recent episode returns, pooled over workers (so ranks agree on ``target_return``, and the
        rows and summary read the same episodes: ``EpisodeWindows.pool``); sets the episodes counter to the count
        over all workers in the same all-reduce."""
        run_base, own_base = self._episodes_base
        new_episodes = self.source.episodes - own_base
        if self.sync.world_size > 1:
            new_episodes = self.windows.pool(self.sync, new_episodes)
        self.counters["episodes"] = run_base + new_episodes
        window = self.windows.returns(RECENT_EPISODES)
        return float(sum(window) / len(window)) if window else None

    def _write_traceback(self, err: BaseException) -> str:
        """Write the full traceback to ``error.txt`` (main process); the note that points to it."""
        if not self.is_main:
            return ""
        path = self.place.run_dir / "error.txt"
        try:
            path.write_text("".join(traceback.format_exception(err)))
        except OSError:
            return ""
        return f"; traceback in {path}"

    def _finish(self, status: str, *, start_steps: int = 0, error: str | None = None,
                checkpoint: bool = True) -> dict:
        """The run's end: the final evaluation and row, the final checkpoint, the summary written."""
        state, steps = self.state, self.counters["env_steps"]
        # training steps per second as of this session's last step (the evaluations' time is not in it), the same
        # figure every checkpoint of that step holds; a session that took no step reports the rate of the one
        # that trained, restored from its checkpoint (unknown in a checkpoint older than that record)
        sps = state.train_sps if state.train_sps is not None else float("nan")
        ckpt = None
        if self.is_main and status in ("completed", "interrupted") and checkpoint:
            # before the final evaluation: a stop (or an env that never ends) there must not cost the training
            ckpt = self.save(kind="final" if status == "completed" else "step")
        elif self.is_main and status == "interrupted":
            # what a resume continues from (none written now: the envs were stuck)
            ckpt = state.last_checkpoint
        final = state.last_eval
        if status == "completed" and self.is_main:
            # the final evaluation always runs (also after an early stop at target_return); its row is the
            # last
            try:
                row = self.evaluate(final=True)
            except StopRequested as err:  # trained and checkpointed: a resume=auto evaluates it again
                status, final = "interrupted", None
                self.stop.reason = f"{err.reason}{during(err)}"
            else:
                final = (row["eval/return_mean"], row["eval/return_std"])
                # at the budget's end it stands in for the periodic evaluation due there (the loop runs none at
                # the last step): one that reaches eval.target_return says when, as that one would have
                self._eval_reached_target(row, steps)
                self.rows.log(steps, {**self.rows.row(state.last_learn, sps), **row})
        elif self.is_main and status == "interrupted" and state.last_learn:
            self.rows.log(steps, self.rows.row(state.last_learn, sps))
        summary = self.summary.build(status, sps=sps, final=final, start_steps=start_steps, checkpoint=ckpt,
                                     error=error)
        self.summary.write(summary)
        return summary


def _one_line(err: BaseException) -> str:
    """The summary's ``error``: a ConfigError says it all; anything else is named by its type."""
    return str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
