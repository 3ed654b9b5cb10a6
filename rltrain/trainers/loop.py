"""The one training loop: budget, target return, eval / checkpoint / log cadence, resume, summary.

``TrainLoop`` is one worker's loop: the sequential trainer runs one, a parallel agent runs one in its own
process, a distributed rank runs one with an all-reducing ``Sync`` (rank 0 alone writes), the
subprocess_actors learner runs one whose rollouts come from actor processes. Trainers never subclass it:
they differ only in where rollouts come from (``source_factory``) and in ``LoopHooks``, a small set of public
hooks around the fixed loop (after each update, extra log columns, extra checkpoint and summary entries,
a resume check).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rltrain.algos.base import Algorithm, Sync
from rltrain.data.structs import Metrics
from rltrain.envs.vector import EnvCallAbandoned, EnvFault, counted
from rltrain.errors import ConfigError
from rltrain.run.checkpoint import (
    CheckpointManager,
    config_changes,
    load_checkpoint,
    resume_mismatch,
    sweep_temp_files,
)
from rltrain.run.metrics import CSVLogger, MetricLogger, TensorBoardLogger
from rltrain.run.progress import ProgressDisplay
from rltrain.run.seeding import SeedTree, capture_rng, derive, restore_rng, seed_process
from rltrain.run.signals import StopFlag
from rltrain.run.summary import resume_command, write_summary
from rltrain.trainers.collector import RolloutCollector
from rltrain.trainers.episodes import evaluate
from rltrain.trainers.finite import (
    NonFiniteError,
    metrics_problem,
    named_tensors,
    non_finite_line,
    rollout_problem,
    tensors_problem,
)
from rltrain.trainers.hooks import LoopHooks, to_cpu
from rltrain.trainers.settings import RunSettings

# Sources keep the last 100 episodes (the summary's train_return_last100); the live display, metrics rows and
# target_return use the last 20 so they follow learning closely.
RECENT_EPISODES = 20

SourceFactory = Callable[[Algorithm], Any]  # -> RolloutCollector-like: collect(), episodes, recent_returns...


class TrainLoop:
    """Collect -> learn until ``total_env_steps``; logs, evaluates and checkpoints on its cadence."""

    def __init__(self, settings: RunSettings, run_dir: Path, *, seeds: SeedTree, device: torch.device,
                 stop: StopFlag, sync: Sync | None = None, is_main: bool = True, title: str = "training",
                 progress_factory=ProgressDisplay, hooks: LoopHooks | None = None,
                 source_factory: SourceFactory | None = None, num_envs: int | None = None):
        self.s, self.run_dir, self.seeds, self.device, self.stop = settings, Path(run_dir), seeds, device, stop
        self.progress_factory = progress_factory  # the parallel trainer's agents send progress to their parent
        self.sync = sync or Sync()
        self.is_main, self.title = is_main, title
        seed_process(seeds.torch_seed)
        self.spec = settings.env.spec()
        self.algo: Algorithm = settings.algo(self.spec, num_envs=num_envs or settings.env.num_envs, device=device,
                                             sync=self.sync)
        self.source = (source_factory or self._collector)(self.algo)
        self.counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_time": 0.0}
        self.best_eval = -math.inf
        self.last_eval: tuple[float, float] | None = None
        self.last_eval_modes: dict[str, float] = {}  # deterministic / stochastic mean returns (eval.both_modes)
        self.eval_s = 0.0  # seconds in evaluations this session: reported apart, left out of steps/s
        self.solved: dict | None = None
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep_last=settings.checkpoint.keep_last)
        self.loggers: list[MetricLogger] = []
        self.last_learn: Metrics = {}
        self.resumed_from: Path | None = None
        self.resume_changes: list[str] = []  # settings resume_allow_changes let differ from the checkpoint's
        self.last_checkpoint: Path | None = None  # the newest checkpoint written or resumed from: finite weights
        self._tensors = named_tensors(self.algo)  # checked after every update (trainers/finite.py)
        self._checked_writes: int | None = None  # the algorithm's weight_writes when last found finite
        self._resume_done = False
        self._last_logged = -1  # the highest step any sink has a row for: no step is ever logged twice
        self.hooks = hooks or LoopHooks()
        self.hooks.bind(self)
        watch = getattr(getattr(self.source, "venv", None), "watch", None)
        if watch is not None:  # a stop signal abandons an env call that is stuck (trainers/../envs/vector.py)
            stop.on_stop(watch.abandon)

    def _collector(self, algo: Algorithm) -> RolloutCollector:
        venv = self.s.env.vector(self.seeds.env_seeds)
        return RolloutCollector(venv, algo.policy, self.spec, device=self.device, record_values=True)

    # -- resume -------------------------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Restore ``settings.resume`` once (idempotent; ``run`` calls it). The main process loads; with
        several workers every replica then starts from its weights, optimiser and counters, so all replicas are
        identical (also on a fresh start: rank 0's initial weights are everyone's)."""
        if self._resume_done:
            return self.resumed_from
        self._resume_done = True
        path, error = None, None
        if self.is_main:
            try:
                path = self._restore()
            except ConfigError as err:
                if self.sync.world_size == 1:
                    raise
                error = str(err)  # every rank must hear it, or the others wait in the broadcast forever
        if self.sync.world_size > 1:
            payload = self.sync.broadcast_object(
                {"error": error, "path": str(path) if path else None, "algo": to_cpu(self.algo.state_dict()),
                 "counters": dict(self.counters), "best_eval": self.best_eval, "solved": self.solved}
                if self.is_main else None)
            if payload["error"]:
                raise ConfigError(payload["error"])
            if not self.is_main:
                self.algo.load_state_dict(payload["algo"])
                self.counters.update(payload["counters"])
                self.best_eval, self.solved = payload["best_eval"], payload["solved"]
                if payload["path"]:  # fresh, distinct random streams after a resume
                    seed_process(derive(self.seeds.root, 0, path=(self.sync.rank, self.counters["env_steps"])).torch_seed)
            path = Path(payload["path"]) if payload["path"] else None
        self.resumed_from = self.last_checkpoint = path
        return path

    def _restore(self) -> Path | None:
        sweep_temp_files(self.run_dir)  # a killed earlier run's temp files and uncommitted sidecars
        spec = self.s.resume
        if spec == "never":
            return None
        # corrupt ones are skipped out loud; all corrupt refuses rather than restart over the run
        path = self.ckpt.latest(refuse_if_all_corrupt=True) if spec == "auto" else Path(spec)
        if path is None:
            return None
        # the envs sidecar is unpickled only if this user's key signed it, or the user opted in
        state, envs_blob = load_checkpoint(path, run_dir=self.run_dir, trust_envs=self.s.resume_trust_envs)
        saved = state["meta"].get("config") or {}
        error = resume_mismatch(path, saved, self.s.config) or self.hooks.check_resume(state["meta"], path)
        if error:
            raise ConfigError(error)
        _, self.resume_changes = config_changes(saved, self.s.config, self.s.resume_allow_changes)
        if any(c.startswith("env.") for c in self.resume_changes):
            envs_blob = None  # the pickled envs carry the old settings: build fresh ones with the new
        try:
            self.algo.load_state_dict(state["algo"])
        except (RuntimeError, KeyError, ValueError) as err:  # what the config comparison could not see
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [type(err).__name__]
            detail = next((ln for ln in lines if ln.startswith(("size mismatch", "Missing", "Unexpected"))), lines[0])
            raise ConfigError(f"resume={path}: its weights do not fit this run's networks ({detail}); resume with "
                              "the checkpoint's algo, env and model settings") from None
        self.counters.update(state["counters"])
        self.best_eval = float(state.get("best_eval", -math.inf))
        self.solved = state.get("solved")
        self.source.load_state_dict(state["collector"], envs_blob)
        self.hooks.on_resume(state)
        restore_rng(state["rng"])  # last: building the objects above consumed RNG draws
        return path

    def checkpoint_state(self) -> dict:
        state = {
            "algo": self.algo.state_dict(),
            "counters": dict(self.counters),
            "best_eval": self.best_eval,
            "solved": self.solved,
            "collector": self.source.state_dict(),
            "rng": capture_rng(),
            "meta": {"algo": self.algo.name, "config": self.s.config, "eval_seed": self.seeds.eval_seed,
                     "env_id": self.spec.env_id},
        }
        self.hooks.extend_checkpoint(state)
        return state

    def save(self, kind: str = "step") -> Path | None:
        if not self.is_main:
            return None
        # never write NaN weights over the last finite checkpoint (the loop checks every update; this is the gate)
        problem = tensors_problem(self._tensors)
        if problem:
            raise NonFiniteError(non_finite_line(problem, self.counters["updates"], self.counters["env_steps"],
                                                       self.last_checkpoint))
        path = self.ckpt.save(self.checkpoint_state(), self.counters["env_steps"], envs=self.source.env_state(),
                              kind=kind)
        self.last_checkpoint = path
        return path

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> dict:
        s = self.s
        resumed_from = self.resume()
        start_steps = self.counters["env_steps"]
        if self.is_main:
            self._open_loggers(resumed=resumed_from is not None)
        total = s.total_env_steps
        every = {"log": s.log.every_env_steps, "eval": s.eval.every_env_steps,
                 "checkpoint": s.checkpoint.every_env_steps}
        nxt = {k: _next_multiple(start_steps, e) for k, e in every.items()}
        progress = self.progress_factory(total, mode=s.logger.progress if self.is_main else "off",
                                         interval_s=s.logger.progress_interval_s, initial=start_steps,
                                         title=self.title, rate_from=getattr(self.algo, "learning_starts", 0))
        t0, wall0 = time.perf_counter(), self.counters["wall_time"]
        sps_t, sps_steps = t0, start_steps
        learn_metrics: Metrics = {}
        status = "completed"
        try:
            while self.counters["env_steps"] < total:
                over_wall = bool(s.max_wall_time_s and time.perf_counter() - t0 >= s.max_wall_time_s)
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
                if s.target_return is not None and self.solved is None and recent is not None and \
                        recent >= s.target_return:
                    self.solved = {"env_steps": steps, "seconds": self.counters["wall_time"]}
                now = time.perf_counter()
                self.last_learn = learn_metrics
                if self.is_main and steps >= nxt["log"] and steps < total and not self.solved:
                    row = self._row(learn_metrics, (steps - sps_steps) / max(now - sps_t - self.eval_s, 1e-9))
                    sps_t, sps_steps = now - self.eval_s, steps  # an evaluation below is not training time
                    if recent is not None:  # pooled over workers; min/max/length stay this worker's
                        row["rollout/episode_return"] = recent
                    if every["eval"] and steps >= nxt["eval"]:
                        row.update(self._evaluate())
                        nxt["eval"] = _next_multiple(steps, every["eval"])
                    self._log(steps, row)
                    nxt["log"] = _next_multiple(steps, every["log"])
                if self.is_main:
                    progress.update(steps, sps=(steps - start_steps) / max(now - t0 - self.eval_s, 1e-9),
                                    episode_return=recent)
                if every["checkpoint"] and steps >= nxt["checkpoint"]:
                    self.save()
                    nxt["checkpoint"] = _next_multiple(steps, every["checkpoint"])
                if self.solved:
                    break
        except EnvCallAbandoned as err:
            # a stop came while an env call was stuck: the envs are unusable, the last checkpoint is the way on
            progress.close()
            self.stop.reason = f"{self.stop.reason or 'stop'}: {err}"
            summary = self._finish("interrupted", start_steps=start_steps, t0=t0, checkpoint=False)
            return summary
        except BaseException as err:
            progress.close()
            error = str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
            if isinstance(err, EnvFault):  # where in the run, and where the user's traceback is
                error += f" (run at env step {self.counters['env_steps']})"
                error += self._write_traceback(err)
            self._finish("failed", error=error)
            if isinstance(err, EnvFault):
                raise EnvFault(error, env_index=err.env_index, env_step=err.env_step) from err
            raise
        try:
            summary = self._finish(status, start_steps=start_steps, t0=t0)
        except BaseException as err:  # the final evaluation (a NaN return) or the final checkpoint failed
            progress.close()
            self._finish("failed", error=str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}")
            raise
        progress.close(summary if self.is_main else None)
        return summary

    def _write_traceback(self, err: BaseException) -> str:
        """Write the full traceback to ``error.txt`` (main process); the note that points to it."""
        if not self.is_main:
            return ""
        path = self.run_dir / "error.txt"
        try:
            path.write_text("".join(traceback.format_exception(err)))
        except OSError:
            return ""
        return f"; traceback in {path}"

    # -- pieces of the loop -------------------------------------------------------------------------------
    def _iterate(self, total: int) -> Metrics:
        """One collect -> learn step; advances the counters. Returns the learner's metrics."""
        steps = self.counters["env_steps"]
        rollout = self.source.collect(self.algo.rollout_len, policy_version=self.counters["updates"],
                                      random_actions=self.algo.wants_random_actions(steps))
        if rollout is None:  # the source stopped (e.g. an actor failure requested the stop)
            return {}
        update, at_step = self.counters["updates"] + 1, steps + rollout.num_steps * self.sync.world_size
        # before learn(): a NaN observation or reward would reach the weights (and every rank must agree first,
        # or the healthy ones wait in learn()'s all-reduce forever)
        self._guard(rollout_problem(rollout), update, at_step)
        t0 = time.perf_counter()
        with np.errstate(all="ignore"):  # an overflow is reported by the guard below, in one line, not as warnings
            learn_metrics = self.algo.learn(rollout, progress=steps / total)
        learn_s = time.perf_counter() - t0
        # the weights are checked only when they changed: an algorithm that counts its weight writes
        # (off-policy learners update on a fraction of the env steps) says so; others are checked every time
        writes = getattr(self.algo, "weight_writes", None)
        stale = writes is None or writes != self._checked_writes
        self._guard(metrics_problem(learn_metrics) or (tensors_problem(self._tensors) if stale else None), update,
                    at_step)
        self._checked_writes = writes
        self.counters["env_steps"] += rollout.num_steps * self.sync.world_size
        self.counters["updates"] += 1
        self.counters["episodes"] = self.source.episodes
        self.hooks.after_learn(rollout, learn_s)
        return learn_metrics

    def _guard(self, problem: str | None, update: int, env_step: int) -> None:
        """Stop the run (``NonFiniteError``: status failed, one line) when ``problem`` is set on any worker."""
        if not self.sync.any(problem is not None):
            return
        # every rank raises the same line: the first rank's problem, rank 0's last checkpoint
        found = self.sync.gather_object((problem, str(self.last_checkpoint) if self.last_checkpoint else None))
        rank, first = next((r, p) for r, (p, _) in enumerate(found) if p is not None)
        if self.sync.world_size > 1:
            first = f"{first} on rank {rank}"
        ckpt = found[0][1]
        raise NonFiniteError(non_finite_line(first, update, env_step, Path(ckpt) if ckpt else None))

    def _recent_return(self) -> float | None:
        """Mean of the recent episode returns, pooled over workers (so ranks agree on ``target_return``)."""
        window = list(self.source.recent_returns)[-RECENT_EPISODES:]
        total, count = self.sync.sum(np.array([sum(window), len(window)], np.float64))
        return float(total / count) if count else None

    def _row(self, learn_metrics: Metrics, sps: float) -> Metrics:
        rets = list(self.source.recent_returns)[-RECENT_EPISODES:]
        row: Metrics = {
            "time/wall": self.counters["wall_time"], "time/sps": sps,
            "rollout/episodes": float(self.counters["episodes"]), "train/updates": float(self.counters["updates"]),
            "rollout/episode_return": float(np.mean(rets)) if rets else math.nan,
            "rollout/episode_return_min": float(np.min(rets)) if rets else math.nan,
            "rollout/episode_return_max": float(np.max(rets)) if rets else math.nan,
            "rollout/episode_length": float(np.mean(list(self.source.recent_lengths)[-RECENT_EPISODES:]))
            if rets else math.nan,
        }
        row.update(learn_metrics)
        row.update(self.hooks.log_row())
        return row

    def _evaluate(self, *, final: bool = False) -> Metrics:
        ev, t0 = self.s.eval, time.perf_counter()
        video = self.run_dir / "videos" if final and ev.video else None
        row: Metrics = {}
        # the headline mode first (the one best_eval and the sweepers follow), then the other with eval.both_modes
        for deterministic in (ev.deterministic, not ev.deterministic)[: 2 if ev.both_modes else 1]:
            rets = evaluate(self.algo.policy, counted(self.s.env.make), episodes=ev.episodes,
                            eval_seed=self.seeds.eval_seed, deterministic=deterministic, device=self.device,
                            video_dir=video if deterministic == ev.deterministic else None,
                            real_scores=self.s.env.real_scores)
            mean, std = float(rets.mean()), float(rets.std())
            if not math.isfinite(mean):  # a NaN in evaluation only (the guard sees training rollouts) is a failure
                bad = int(np.flatnonzero(~np.isfinite(rets))[0])
                raise NonFiniteError(non_finite_line(f"evaluation return={rets[bad]} (eval episode {bad})",
                                                     self.counters["updates"], self.counters["env_steps"],
                                                     self.last_checkpoint))
            row.setdefault("eval/return_mean", mean)
            row.setdefault("eval/return_std", std)
            if ev.both_modes:
                row[f"eval/return_mean_{'deterministic' if deterministic else 'stochastic'}"] = mean
        mean = row["eval/return_mean"]
        self.last_eval = (mean, row["eval/return_std"])
        self.last_eval_modes = {k.rpartition("_")[2]: v for k, v in row.items() if k.startswith("eval/return_mean_")}
        self.eval_s += time.perf_counter() - t0
        if mean > self.best_eval:
            self.best_eval = mean
            self.save(kind="best")
        return row

    def _open_loggers(self, *, resumed: bool) -> None:
        steps = self.counters["env_steps"]
        csv_logger = CSVLogger(self.run_dir / "metrics.csv", resume=resumed)
        if resumed:
            csv_logger.truncate_after(steps)
            self._last_logged = csv_logger.last_step()
        self.loggers = [csv_logger]
        lg = self.s.logger
        if "tensorboard" in lg.sinks:
            self.loggers.append(TensorBoardLogger(self.run_dir / "tensorboard", purge_step=steps + 1 if resumed else None))
        # trackers: one run per process that logs (rank 0; each agent of trainer=parallel opens its own)
        if "wandb" in lg.sinks:
            from rltrain.run.trackers import WandbLogger

            self.loggers.append(WandbLogger(self.run_dir, config=self.s.config, project=lg.project, entity=lg.entity,
                                            group=lg.group, name=lg.name, tags=lg.tags, mode=lg.mode,
                                            seeds=self.seeds.to_dict(), device=str(self.device)))
        if "mlflow" in lg.sinks:
            from rltrain.run.trackers import MLflowLogger

            self.loggers.append(MLflowLogger(self.run_dir, config=self.s.config, project=lg.project, group=lg.group,
                                             name=lg.name, tags=lg.tags, tracking_uri=lg.tracking_uri,
                                             seeds=self.seeds.to_dict(), device=str(self.device)))

    def _log(self, steps: int, row: Metrics) -> None:
        # a resumed run that had already finished (or stopped right after its last row) has this row already
        if steps <= self._last_logged:
            return
        self._last_logged = steps
        for lg in self.loggers:
            lg.log(steps, row)

    def _finish(self, status: str, *, start_steps: int = 0, t0: float | None = None, error: str | None = None,
                checkpoint: bool = True) -> dict:
        steps = self.counters["env_steps"]
        final: tuple[float, float] | None = None
        # training steps per second: the evaluations' time (periodic ones; the final one runs below) is not in it
        elapsed = (time.perf_counter() - t0 - self.eval_s) if t0 is not None else math.nan
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
        if self.is_main and status in ("completed", "interrupted") and checkpoint:
            ckpt = self.save(kind="final" if status == "completed" else "step")
        elif self.is_main and status == "interrupted":
            ckpt = self.last_checkpoint  # what a resume continues from (none written now: the envs were stuck)
        summary = {
            "status": status,
            "algo": self.algo.name,
            "env_id": self.spec.env_id,
            "seed": self.seeds.root,
            "final_eval_return": final[0] if final else None,
            "final_eval_return_std": final[1] if final else None,
            # which mode final_eval_return is (eval.deterministic), and both modes' means (eval.both_modes)
            "final_eval_mode": "deterministic" if self.s.eval.deterministic else "stochastic",
            "final_eval_return_deterministic": self.last_eval_modes.get("deterministic") if final else None,
            "final_eval_return_stochastic": self.last_eval_modes.get("stochastic") if final else None,
            "best_eval_return": self.best_eval if math.isfinite(self.best_eval) else None,
            # CleanRL's and rl-zoo3's published metric: the mean of the last 100 training episodes (this worker's)
            "train_return_last100": float(np.mean(self.source.recent_returns)) if self.source.recent_returns else None,
            "total_env_steps": steps,
            "updates": self.counters["updates"],
            "episodes": self.counters["episodes"],
            "wall_time_s": self.counters["wall_time"],
            "sps": sps if math.isfinite(sps) else None,
            "eval_time_s": self.eval_s,  # every evaluation of this session, the final one included
            "solved_at_env_steps": self.solved["env_steps"] if self.solved else None,
            "solved_at_seconds": self.solved["seconds"] if self.solved else None,
            "world_size": self.sync.world_size,
            "resumed_from_env_steps": start_steps or None,
            "checkpoint": str(ckpt) if ckpt else None,
        }
        if self.resume_changes:
            summary["resume_changes"] = self.resume_changes
        if status == "interrupted":
            summary["stop_reason"] = self.stop.reason
            summary["resume_command"] = resume_command(self.run_dir)
        if error:
            summary["error"] = error
        if status == "failed":
            summary["last_checkpoint"] = str(self.last_checkpoint) if self.last_checkpoint else None
        self.hooks.extend_summary(summary, status)
        if self.is_main:
            write_summary(self.run_dir, summary)
            for lg in self.loggers:
                lg.close(summary)  # trackers record the summary's numbers as final metrics
        self.source.close()
        return summary


def _next_multiple(steps: int, every: int) -> int:
    return (steps // every + 1) * every if every > 0 else 1 << 62
