"""Trainer ``subprocess_actors``: A actor processes collect, one learner learns (IMPALA / APPO style).

Actors (``actors/actor.py``) step their envs with a copy of the policy and send rollouts through their
pipes; the learner keeps a bounded queue of ``batch_rollouts x queue_out_of_sync_factor`` rollouts
(reading stops when it is full, so actors block: backpressure), concatenates ``batch_rollouts`` of them
along the env axis into one ``[T, batch_rollouts * envs_per_actor]`` rollout, runs the algorithm's
``learn()`` and publishes the new weights through shared memory (``actors/shared_weights.py``).

- async (default): actors never wait; data older than ``max_policy_lag`` versions is dropped (counted).
  IMPALA corrects the remaining lag with V-trace (Espeholt et al. 2018); PPO's clipped ratio against the
  carried behaviour log-prob is APPO's correction.
- sync: every actor delivers its share of the batch with the *current* weights, then waits for the next
  version. ``preemption.fraction_workers`` ends the wait once that share of actors has delivered all of
  its share, ``preemption.fraction_samples`` once that share of the batch is in (whichever comes first);
  late rollouts are stale by then and dropped (counted).

The budget loop, logging, eval cadence, checkpoints, summary and resume are ``TrainLoop``'s; this module
only replaces the "collect" half of each iteration. The policy version is the learner's update count, so
a resumed run continues it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rltrain.algos.base import Algorithm
from rltrain.data.structs import Metrics, Rollout
from rltrain.run.device import pick_device
from rltrain.run.progress import ProgressDisplay
from rltrain.run.seeding import SeedTree, derive
from rltrain.run.signals import StopFlag
from rltrain.trainers.actors.actor import ActorSpec, RolloutMsg
from rltrain.trainers.actors.backends import make_backend
from rltrain.trainers.actors.pool import ActorFailure, ActorPool
from rltrain.trainers.actors.rollouts import EpisodeStats, merge_rollouts
from rltrain.trainers.base import Capabilities, Trainer, UpdateSize
from rltrain.trainers.hooks import LoopHooks, Placement, TrainerParts
from rltrain.trainers.loop import TrainLoop
from rltrain.trainers.settings import RunSettings, SubprocessActorsSettings

log = logging.getLogger("rltrain.actors")
_ACTOR_BRANCH = 7  # actor seeds hang below spawn key (7, actor, generation): disjoint from the learner's


class ActorsProgress(ProgressDisplay):
    """The usual bar/line plus one row per actor and the lag / queue figures (under the bar on a terminal,
    every ``interval_s`` as plain lines elsewhere)."""

    def __init__(self, *args, rows, **kwargs):
        super().__init__(*args, **kwargs)
        self._rows_of, self._last_rows = rows, 0.0

    def update(self, env_steps: int, *, sps: float, episode_return: float | None) -> None:
        super().update(env_steps, sps=sps, episode_return=episode_return)
        if self.mode == "rich":
            self.set_rows(self._rows_of())  # rich redraws at most 4 times a second
            return
        now = time.monotonic()
        if self.mode == "off" or (now - self._last_rows < self.interval_s and env_steps < self.total):
            return
        self._last_rows = now
        print("\n".join("  " + r for r in self._rows_of()), flush=True)


class ActorBatches(LoopHooks):
    """The learner's side of ``subprocess_actors``: the loop's rollout source (batches from the actors'
    queue, merged along the env axis) and its hooks (publish the weights after each update, lag and queue
    columns in the log, actor generations in the checkpoint)."""

    def __init__(self, trainer: SubprocessActorsTrainer, stop: StopFlag):
        self.t, self.stop = trainer, stop
        self.version = 0  # the learner's update count: the policy version it last published
        self.stats_source = EpisodeStats()
        self.queue: deque[RolloutMsg] = deque()
        self.capacity = trainer.batch_rollouts * trainer.queue_out_of_sync_factor
        self.generations = [0] * trainer.num_actors
        self.failure: str | None = None
        self.weights: Any = None  # the backend's weights transport (SharedWeights or RayWeights)
        self.pool: ActorPool | None = None
        self.stats: dict[str, float] = {"dropped_steps": 0.0, "dropped_rollouts": 0.0, "preempted_batches": 0.0}
        self._window: dict[str, list[float]] = {}  # per-batch figures since the last log row
        self._received_steps, self._recv_t0 = 0, time.perf_counter()
        self._first_seen: dict[int, float] = {}  # progress rows: actor -> when it began its first rollout

    # -- the rollout source (what RolloutCollector is for the other trainers) --------------------------------
    @property
    def episodes(self) -> int:
        return self.stats_source.episodes

    @property
    def recent_returns(self) -> deque[float]:
        return self.stats_source.recent_returns

    @property
    def recent_lengths(self) -> deque[int]:
        return self.stats_source.recent_lengths

    def state_dict(self) -> dict:
        return self.stats_source.state_dict()

    def load_state_dict(self, state: dict, venv_blob: bytes | None) -> None:
        self.stats_source.load_state_dict(state, venv_blob)

    def env_state(self) -> bytes | None:
        return None  # the envs live in the actors; a resumed actor is a new generation with fresh episodes

    def close(self) -> None:
        pass  # the trainer stops the actors (shutdown) after the loop, also when it failed

    def collect(self, rollout_len: int, *, policy_version: int, random_actions: bool) -> Rollout | None:
        """The next batch from the actors, merged along the env axis; None when stopped or an actor failed."""
        try:
            batch = self._next_batch(policy_version)
        except ActorFailure as err:
            self.failure = str(err)
            log.error("%s", err)
            self.stop.request("actor_failure")
            return None
        if not batch:
            return None
        self._window.setdefault("lag", []).extend(policy_version - m.version for m in batch)
        self._window.setdefault("batch_rollouts", []).append(len(batch))
        rollout = merge_rollouts([m.rollout() for m in batch])
        self.stats_source.add(rollout)
        return rollout

    # -- hooks --------------------------------------------------------------------------------------------------
    def on_resume(self, state: dict) -> None:
        actors = state.get("actors", {})
        old = list(actors.get("generations", []))
        # a resumed actor is a new process: a fresh generation, so a fresh recorded seed
        self.generations = [(old[k] + 1 if k < len(old) else 0) for k in range(self.t.num_actors)]
        self.stats.update(actors.get("stats", {}))

    def extend_checkpoint(self, state: dict, *, algo: Algorithm) -> None:
        gens = [s.generation for s in self.pool.slots] if self.pool else self.generations
        state["actors"] = {"generations": gens, "stats": dict(self.stats)}

    def after_learn(self, rollout: Rollout, learn_s: float, *, algo: Algorithm, counters: Mapping) -> None:
        self.version = counters["updates"]
        self.weights.publish(algo.policy_state(), version=self.version,  # type: ignore[union-attr]
                             env_steps=counters["env_steps"])
        self._window.setdefault("learner_sps", []).append(rollout.num_steps / max(learn_s, 1e-9))

    def extend_summary(self, summary: dict, status: str, *, algo: Algorithm) -> None:
        summary.update({"num_actors": self.t.num_actors, "policy_version": summary["updates"],
                        "restarts": self.pool.total_restarts if self.pool else 0,
                        "dropped_rollouts": int(self.stats["dropped_rollouts"])})
        if self.pool and self.pool.placements:  # Ray backend: the node of every actor generation
            summary["actor_nodes"] = dict(self.pool.placements)
        if self.failure:  # the actors failed (abort policy, or out of restarts): the run failed, whatever stopped it
            summary.update(status="failed", error=self.failure)
            summary.pop("resume_command", None)
            summary["last_checkpoint"] = summary.get("checkpoint")

    def start_actors(self, make_spec, on_restart, *, algo: Algorithm, counters: Mapping) -> None:
        self.version = counters["updates"]
        t = self.t
        self.weights = t.backend.weights(algo.policy_state(), version=self.version,
                                         env_steps=counters["env_steps"])
        self.pool = ActorPool(functools.partial(make_spec, self.weights.handle), t.num_actors,
                              start_method=t.start_method, on_failure=t.on_actor_failure,
                              max_restarts=t.max_restarts, actor_timeout_s=t.actor_timeout_s, on_restart=on_restart,
                              group=t.backend.group(self.weights, actor_timeout_s=t.actor_timeout_s))
        self.pool.start(self.generations)

    def shutdown(self) -> None:
        if self.weights is not None:
            self.weights.mark_closing()
        if self.pool is not None:
            self.pool.stop()
        if self.weights is not None:
            self.weights.close()
            self.weights = None

    def _next_batch(self, version: int) -> list[RolloutMsg]:
        """``batch_rollouts`` usable rollouts (sync: fewer when a preemption threshold is met); [] if stopped."""
        t, pool = self.t, self.pool
        assert pool is not None
        need = t.batch_rollouts
        if t.sync:
            per_actor = [0 if pool.slots[k].dropped else need // t.num_actors + (k < need % t.num_actors)
                         for k in range(t.num_actors)]
            need = sum(per_actor)  # an actor no node could take (Ray backend) delivers nothing
            enough_samples = math.ceil(t.preemption.fraction_samples * need)
            enough_workers = math.ceil(t.preemption.fraction_workers * t.num_actors)
            delivered = [0] * t.num_actors
        batch: list[RolloutMsg] = []
        held: list[RolloutMsg] = []  # sync: an actor's rollouts beyond its share wait for the next batch
        t0 = time.perf_counter()
        self._window.setdefault("queue_fill", []).append(len(self.queue) / self.capacity)
        while True:
            while self.queue and len(batch) < need:
                msg = self.queue.popleft()
                lag = version - msg.version
                stale = lag > 0 if t.sync else (t.max_policy_lag is not None and lag > t.max_policy_lag)
                if stale:
                    self.stats["dropped_steps"] += msg.num_steps
                    self.stats["dropped_rollouts"] += 1
                    pool.grant(msg)
                    continue
                if t.sync and delivered[msg.actor_id] >= per_actor[msg.actor_id]:
                    held.append(msg)
                    continue
                batch.append(msg)
                pool.grant(msg)
                if t.sync:
                    delivered[msg.actor_id] += 1
            self.queue.extendleft(reversed(held))
            held.clear()
            if len(batch) >= need:
                break
            if t.sync and batch:
                done = sum(d >= p for d, p in zip(delivered, per_actor, strict=True))
                if len(batch) >= enough_samples or done >= enough_workers:
                    self.stats["preempted_batches"] += 1
                    break
            if self.stop.requested:
                return []
            msgs = pool.poll(0.2)  # credits bound what can arrive
            for m in msgs:
                self._first_seen.setdefault(m.actor_id, time.perf_counter() - m.collect_s)
            self._received_steps += sum(m.num_steps for m in msgs)
            self.queue.extend(msgs)
        self._window.setdefault("dequeue_wait_s", []).append(time.perf_counter() - t0)
        if t.sync:  # in actor order, not arrival order: a seeded sync run learns the same batches every time
            batch.sort(key=lambda m: m.actor_id)
        return batch

    # -- what the learner logs --------------------------------------------------------------------------------
    def log_row(self) -> Metrics:
        row: Metrics = {}
        w, self._window = self._window, {}
        lag = w.get("lag", [])
        now = time.perf_counter()
        actor_sps = self._received_steps / max(now - self._recv_t0, 1e-9)
        self._received_steps, self._recv_t0 = 0, now

        def mean(key: str) -> float:
            return float(np.mean(w[key])) if w.get(key) else math.nan

        row.update({
            "actors/policy_lag_min": float(min(lag)) if lag else math.nan,
            "actors/policy_lag_mean": float(np.mean(lag)) if lag else math.nan,
            "actors/policy_lag_max": float(max(lag)) if lag else math.nan,
            "actors/queue_fill": mean("queue_fill"), "actors/dequeue_wait_s": mean("dequeue_wait_s"),
            "actors/batch_rollouts": mean("batch_rollouts"), "time/actor_sps": actor_sps,
            "time/learner_sps": mean("learner_sps"), "actors/policy_version": float(self.version),
            "actors/restarts": float(self.pool.total_restarts if self.pool else 0),
            **{f"actors/{k}": v for k, v in self.stats.items()},
        })
        return row

    def progress_rows(self) -> list[str]:
        """One row per actor (throughput of what reached the learner, episodes, version of its last rollout),
        then the learner's policy version, lag, queue and drops."""
        rows = [self._actor_row(slot) for slot in self.pool.slots] if self.pool else []
        lag = self._window.get("lag", [])
        lag_txt = f"{min(lag)}/{np.mean(lag):.1f}/{max(lag)}" if lag else "-"
        rows.append(f"policy v{self.version}  lag min/mean/max {lag_txt}  queue "
                    f"{len(self.queue)}/{self.capacity}  dropped {int(self.stats['dropped_rollouts'])} rollouts")
        return rows

    def _actor_row(self, slot) -> str:
        # throughput since it began its first rollout (process start-up is not the actor's speed)
        elapsed = time.perf_counter() - self._first_seen.get(slot.actor_id, math.inf)
        sps = slot.steps / elapsed if elapsed > 0 else 0.0
        version = f"v{slot.version}" if slot.version >= 0 else "no rollout yet"
        where = f" on {slot.node}" if slot.node else ""
        return (f"actor {slot.actor_id}{where}: {sps:,.0f} sps ({slot.sps:,.0f} while collecting)  "
                f"steps {slot.steps:,}  episodes {slot.episodes}  {version}  restarts {slot.restarts}")


class SubprocessActorsTrainer(Trainer):
    """See the module docstring. Its ``trainer.*`` keys: ``SubprocessActorsSettings`` (trainers/settings.py)."""

    name = "subprocess_actors"
    settings_class = SubprocessActorsSettings
    capabilities = Capabilities(batched_rollouts=True)

    def __init__(self, *, settings: RunSettings, run_dir: Path,
                 trainer: SubprocessActorsSettings = SubprocessActorsSettings()):
        super().__init__(settings=settings, run_dir=run_dir)
        t = trainer
        self.num_actors = t.num_actors
        self.envs_per_actor = t.envs_per_actor or settings.env.num_envs
        self.rollout_len = t.rollout_len
        self.batch_rollouts = t.batch_rollouts or t.num_actors
        self.queue_out_of_sync_factor, self.start_method, self.sync = t.queue_out_of_sync_factor, t.start_method, t.sync
        self.max_policy_lag, self.compress, self.preemption = t.max_policy_lag, t.compress, t.preemption
        self.actor_device, self.learner_device = t.actor_device, t.learner_device or settings.device
        self.on_actor_failure, self.max_restarts = t.on_actor_failure, t.max_restarts
        self.actor_timeout_s = t.actor_timeout_s
        self.backend = make_backend(t.backend, ray=dataclasses.asdict(t.ray), start_method=t.start_method,
                                    num_actors=t.num_actors, env=settings.env)

    def actor_seeds(self, actor_id: int, generation: int) -> SeedTree:
        return derive(self.settings.seed, self.envs_per_actor, path=(_ACTOR_BRANCH, actor_id, generation))

    def update_size(self, rollout_len: int) -> UpdateSize:
        """The learner merges ``batch_rollouts`` actor rollouts of ``envs_per_actor`` envs per update."""
        steps, envs, batches = self.rollout_len or rollout_len, self.envs_per_actor, self.batch_rollouts
        text = f"trainer.batch_rollouts ({batches}) x envs per actor ({envs}) x rollout_len ({steps})"
        return UpdateSize(batches * envs * steps, text, self.num_actors * envs)

    def seed_trees(self) -> dict[str, SeedTree]:
        return {}  # recorded in train(): the actors' generations are known only after the resume

    def train(self, stop: StopFlag) -> dict:
        s = self.settings
        device = pick_device(self.learner_device)
        pick_device(self.actor_device)  # fail now, with the key's message, not inside an actor
        trees: dict[str, SeedTree] = {"learner": derive(s.seed, 1)}
        self.backend.connect()  # Ray: refuses (one line) before the loop writes anything into the run dir

        def record(spec: ActorSpec) -> None:
            trees[f"actor_{spec.actor_id}_gen_{spec.generation}"] = spec.seeds
            self.record_seeds(trees)

        batches = ActorBatches(self, stop)
        parts = TrainerParts(hooks=batches, source_factory=lambda algo: batches,
                             progress_factory=functools.partial(ActorsProgress, rows=batches.progress_rows),
                             num_envs=self.batch_rollouts * self.envs_per_actor)
        loop = TrainLoop(s, Placement(self.run_dir, trees["learner"], device, title="learner"), stop, parts)
        try:
            rollout_len = self.rollout_len or int(loop.algo.rollout_len)
            loop.resume()  # before the actors start: their generations (and seeds) come from the checkpoint
            for k, gen in enumerate(batches.generations):
                trees[f"actor_{k}_gen_{gen}"] = self.actor_seeds(k, gen)
            self.record_seeds(trees)
            make_spec = functools.partial(self._make_spec, rollout_len=rollout_len)
            batches.start_actors(make_spec, on_restart=record, algo=loop.algo, counters=loop.counters)
            summary = loop.run()
        finally:
            batches.shutdown()
            self.backend.close()  # Ray: disconnect; a private instance is stopped
        if batches.failure:
            summary["exit_code"] = 1
        return summary

    def _make_spec(self, weights, actor_id: int, generation: int, *, rollout_len: int) -> ActorSpec:
        return ActorSpec(actor_id=actor_id, generation=generation, seeds=self.actor_seeds(actor_id, generation),
                         algo=self.settings.algo, env=self.settings.env, num_envs=self.envs_per_actor,
                         rollout_len=rollout_len, weights=weights, device=self.actor_device, sync=self.sync,
                         share=self._share(actor_id), compress=self.compress,
                         torch_threads=self.settings.torch_threads, credits=self._credits(actor_id))

    def _credits(self, actor_id: int) -> int:
        # the queue's capacity split over the actors bounds the data in flight, hence the policy lag
        cap = self.batch_rollouts * self.queue_out_of_sync_factor
        return max(cap // self.num_actors + (actor_id < cap % self.num_actors), self._share(actor_id))

    def _share(self, actor_id: int) -> int:
        n, a = self.batch_rollouts, self.num_actors
        return n // a + (actor_id < n % a)

